"""Faults the tests inject into the local Slurm cluster."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from deployments.stack.slurm import PREEMPT_GRES


def preempt() -> str:
    """A job in the `urgent` partition (the stack's highest priority tier) takes the node's
    preemption slot from the job holding it, in `preemptible` (requeued) or `spot` (cancelled after
    its grace time). Jobs in `debug` are never preempted, so the other tests' jobs run on."""
    out = subprocess.run(["sbatch", "--parsable", "-p", "urgent", f"--gres={PREEMPT_GRES}", "-J", "urgent-preemptor",
                          "-o", "/dev/null", "--wrap", "sleep 3"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


class CpuGroup:
    """A cgroup of the kernel's CPU controller (v1, as this machine mounts it) that a test moves a
    job's processes into: with a quota the node is slow, as a throttled instance or a noisy
    neighbour makes it; with a large share the processes get a core however busy the rest of the
    suite keeps the machine. Slurm starts a job's steps under slurmd, not under its batch script,
    so the processes are moved by pid, not by a line in the script."""

    ROOT = Path("/sys/fs/cgroup/cpu")

    def __init__(self, name: str, *, quota_pct: int | None = None, shares: int | None = None):
        self.path = self.ROOT / f"pretrain-tests-{name}"
        self.close()  # a failed run's
        self.path.mkdir()
        if quota_pct is not None:
            period = int((self.path / "cpu.cfs_period_us").read_text())
            (self.path / "cpu.cfs_quota_us").write_text(str(period * quota_pct // 100))
        if shares is not None:
            (self.path / "cpu.shares").write_text(str(shares))

    def add(self, pids: Iterable[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                (self.path / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        """Hands what still runs in the group back to the root group, and removes it."""
        if not self.path.exists():
            return
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (self.ROOT / "cgroup.procs").write_text(pid)
        self.path.rmdir()


@contextlib.contextmanager
def following(group: CpuGroup, command: str) -> Iterator[None]:
    """Moves every process whose command line contains ``command`` into ``group`` as it starts,
    until the block ends."""
    done = threading.Event()

    def follow() -> None:
        while not done.wait(0.3):
            found = subprocess.run(["pgrep", "-f", command], capture_output=True, text=True).stdout
            group.add(map(int, found.split()))

    mover = threading.Thread(target=follow, daemon=True)
    mover.start()
    try:
        yield
    finally:
        done.set()
        mover.join()
