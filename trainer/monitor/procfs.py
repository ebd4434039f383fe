"""The CPU source: node CPU use from /proc/stat, and the resident memory and disk I/O of the
processes the sampler watches (the job's launcher and its ranks), from /proc/<pid>.

The parsers take the files' text, so they are tested on this machine's own /proc.
"""

from __future__ import annotations

import os
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_times(stat_text: str) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat's ``cpu`` line; idle and iowait are not busy."""
    fields = [int(v) for v in stat_text.split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest time is already counted in user and nice (proc(5))
    total = sum(fields[:8])
    return total - idle, total


def io_bytes(io_text: str) -> tuple[int, int]:
    """(read_bytes, write_bytes) from /proc/<pid>/io: what the process made the storage layer move."""
    values = dict(line.split(": ", 1) for line in io_text.splitlines() if ": " in line)
    return int(values.get("read_bytes", 0)), int(values.get("write_bytes", 0))


def rss_bytes(statm_text: str) -> int:
    """Resident set size from /proc/<pid>/statm (its second field, in pages)."""
    return int(statm_text.split()[1]) * PAGE


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, and so on (/proc/<pid>/task/<tid>/children)."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            found += kids
            queue += kids
    return found


class CpuSource:
    """The node's CPU and the watched processes: one ``cpu`` device per node."""

    def __init__(self, watched: int):
        self.watched = watched
        self.last_cpu = cpu_times(Path("/proc/stat").read_text())
        self.io_seen: dict[int, tuple[int, int]] = {}

    def sample(self, interval_s: float) -> list[dict]:
        busy, total = cpu_times(Path("/proc/stat").read_text())
        util = 100.0 * (busy - self.last_cpu[0]) / max(total - self.last_cpu[1], 1)
        self.last_cpu = (busy, total)
        rss, read, written = 0, 0, 0
        own = os.getpid()
        seen: dict[int, tuple[int, int]] = {}
        for pid in [self.watched, *descendants(self.watched)]:
            if pid == own:
                continue
            try:
                rss += rss_bytes(Path(f"/proc/{pid}/statm").read_text())
                seen[pid] = io_bytes(Path(f"/proc/{pid}/io").read_text())
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue  # ended meanwhile, or not ours to read
            # I/O of this interval: a process new since the last sample counts from its start
            before = self.io_seen.get(pid, (0, 0))
            read += seen[pid][0] - before[0]
            written += seen[pid][1] - before[1]
        self.io_seen = seen
        return [{"device": "cpu", "util_pct": round(util, 2), "memory_gib": rss / 2**30,
                 "read_mb_s": read / 1e6 / interval_s, "write_mb_s": written / 1e6 / interval_s, "errors": 0}]
