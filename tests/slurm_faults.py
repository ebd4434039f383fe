"""Faults the tests inject into the local Slurm cluster, timed by what they read of a training run:
its metrics stream (pretrain/metrics_records.py), its job in the queue (jobs/slurm.py)."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from deployments.stack.slurm import PREEMPT_GRES
from jobs.slurm import queued
from pretrain.metrics_records import logged_steps, metrics_records
from trainer.train.checkpoint import complete_steps


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

    def set_quota(self, quota_pct: float) -> None:
        period = int((self.path / "cpu.cfs_period_us").read_text())
        (self.path / "cpu.cfs_quota_us").write_text(str(int(period * quota_pct / 100)))

    def add(self, pids: Iterable[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                (self.path / "cgroup.procs").write_text(str(pid))

    def release(self) -> None:
        """Hands what runs in the group back to the root group."""
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (self.ROOT / "cgroup.procs").write_text(pid)

    def close(self) -> None:
        """Releases what still runs in the group, and removes it."""
        if not self.path.exists():
            return
        self.release()
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


class Fault(threading.Thread):
    """Waits, while a flow trains in ``root``, until the run's job ``job_name`` runs, has logged
    ``after_step`` and its checkpoint of step ``checkpoint`` is complete; then calls
    ``inject(job_id, run_dir)`` once. The wait ends as soon as the run gets there; its bound is
    generous because a job may first wait in a partition that is down, then start its trainer
    on two cores that the rest of the suite keeps busy."""

    def __init__(self, job_name: str, root: Path, inject: Callable[[str, Path], Any], *, after_step: int,
                 checkpoint: int, timeout_s: float = 480):
        super().__init__(daemon=True)
        self.job_name, self.root, self.inject, self.timeout_s = job_name, root, inject, timeout_s
        self.after_step, self.checkpoint = after_step, checkpoint
        self.job_id: str | None = None
        self.at_step: int | None = None
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                for metrics in (self.root / "train").glob("*/metrics.jsonl"):
                    steps = logged_steps(metrics_records(metrics))
                    running = [line.split()[0] for line in queued(self.job_name) if line.endswith("RUNNING")]
                    if (steps and max(steps) >= self.after_step and len(running) == 1
                            and self.checkpoint in complete_steps(metrics.parent / "checkpoints")):
                        self.job_id, self.at_step = running[0], max(steps)
                        self.result = self.inject(self.job_id, metrics.parent)
                        return
                time.sleep(0.3)
            raise AssertionError(f"{self.job_name}: the run never got past step {self.after_step}")
        except BaseException as exc:  # raised in the test by check()
            self.error = exc

    def check(self) -> None:
        self.join(timeout=10)
        if self.error is not None:
            raise self.error
        assert self.job_id is not None, "the fault was never injected"


def trainer_processes(config: Path) -> dict[str, int]:
    """The processes of ``trainer train --config <config>``: torchrun as "launcher", each rank as
    "rank<RANK>" (torchrun sets RANK for its workers)."""
    out = subprocess.run(["pgrep", "-f", f"trainer train --config {config}"], capture_output=True, text=True)
    found = {}
    for pid in map(int, out.stdout.split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        if b"torch.distributed.run" in argv:
            found["launcher"] = pid
            continue
        env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        found[f"rank{env[b'RANK'].decode()}"] = pid
    return found
