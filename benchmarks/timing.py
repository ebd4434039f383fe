"""Timing whole commands for the benchmarks: wall seconds and the peak RSS of exactly that child."""

from __future__ import annotations

import os
import time


def run_timed(argv: list[str]) -> tuple[float, float]:
    """Run ``argv``; return (wall seconds, peak RSS in MB). Exits on failure."""
    started = time.monotonic()
    pid = os.spawnv(os.P_NOWAIT, argv[0], argv)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv[:6])} failed")
    return time.monotonic() - started, usage.ru_maxrss / 1024
