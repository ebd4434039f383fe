"""The node side of a Slurm step: run one command with the distributed environment exported.

This is what the job layer pickles and submits; it runs on compute nodes, so it imports
neither Prefect nor anything of the control plane.
"""

from __future__ import annotations

import os
import signal
import string
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import submitit


LEASE = "lease"  # in the job's folder; the flow process touches it while it follows the job


class CommandFailed(RuntimeError):
    def __init__(self, argv: list[str], returncode: int):
        self.argv = argv
        self.returncode = returncode
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        super().__init__(f"command {' '.join(argv)!r} failed with {how}")


def distributed_environment() -> dict[str, str]:
    """Rank, node rank, master address and world size in the variables torchrun and
    torch.distributed read, from the Slurm (or submitit local) task environment."""
    job = submitit.JobEnvironment()
    tasks_per_node = job.num_tasks // max(job.num_nodes, 1)
    # A fixed port per job: every node derives the same one without talking to the others. Below
    # Linux's ephemeral range (ip_local_port_range, 32768-60999 by default), where outgoing
    # connections and servers bound to port 0 take theirs: one such port already held by another
    # process failed a job's torchrun with EADDRINUSE.
    port = 20000 + zlib.crc32(str(job.job_id).encode()) % 12768
    return {
        "MASTER_ADDR": job.hostnames[0],
        "MASTER_PORT": os.environ.get("MASTER_PORT", str(port)),
        "NNODES": str(job.num_nodes),
        "NODE_RANK": str(job.node),
        "RANK": str(job.global_rank),
        "LOCAL_RANK": str(job.local_rank),
        "WORLD_SIZE": str(job.num_tasks),
        "LOCAL_WORLD_SIZE": str(tasks_per_node),
    }


@dataclass(frozen=True)
class Command:
    """A program to run on each task of a job.

    ``$NODE_RANK``, ``$MASTER_ADDR`` and the other names of :func:`distributed_environment`
    are expanded in ``argv``, so a torchrun line can be written once for every node.

    ``sidecar``: the arguments of a Python program (the device sampler, ``-m trainer monitor ...``)
    started beside it on the same node by the interpreter that runs this command: the job's own,
    which has this project wherever the job runs, in a container too. It is ended with SIGTERM
    once the program has ended, whatever its outcome.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    sidecar: list[str] | None = None

    def __call__(self) -> int:
        # The local executor's cancel and an expired lease interrupt this process with SIGINT. A
        # process started in the background by a non-interactive shell (`nohup prefect worker
        # start &`) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        dist = distributed_environment()
        argv = [string.Template(arg).safe_substitute(dist) for arg in self.argv]
        env = {**os.environ, **dist, **self.env}
        print(f"[rank {dist['RANK']}] $ {' '.join(argv)}", flush=True)
        beside = subprocess.Popen([sys.executable, *(string.Template(arg).safe_substitute(dist) for arg in self.sidecar)],
                                  env=env, cwd=self.cwd, stdout=sys.stdout, stderr=sys.stderr) if self.sidecar else None
        try:
            return self._run(argv, env)
        finally:
            if beside is not None:
                beside.terminate()  # the sampler takes its last sample and exits
                try:
                    beside.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    beside.kill()

    def _run(self, argv: list[str], env: dict[str, str]) -> int:
        proc = subprocess.Popen(argv, env=env, cwd=self.cwd, stdout=sys.stdout, stderr=sys.stderr)
        # Slurm signals every process of the step ahead of a time limit or preemption (--signal).
        # The program checkpoints and exits on its own; submitit's handler here would requeue the
        # job and kill the program mid-checkpoint, so this process only waits for it.
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        try:
            returncode = proc.wait()
        except BaseException:
            # Interrupted (the local executor's cancel is a SIGINT here): never orphan the program.
            # On Slurm the program receives the job's signals itself.
            proc.terminate()
            proc.wait(timeout=30)
            raise
        if returncode != 0:
            raise CommandFailed(argv, returncode)
        return returncode


@dataclass(frozen=True)
class Leased:
    """Runs ``command`` while the flow process that submitted the job keeps renewing ``lease``
    (touching it); when the file has not changed for ``timeout_s``, the job cancels itself.

    This is what keeps a killed flow process or worker from leaving a training job running on
    the cluster with nobody to follow it. Only changes of the file's mtime count, as seen by
    this node's clock, so clock skew between the head node and the compute nodes does not matter.
    """

    command: Callable[[], Any]
    lease: str
    timeout_s: float

    def __call__(self) -> Any:
        threading.Thread(target=self._watch, name="lease-watch", daemon=True).start()
        return self.command()

    def _mtime(self) -> int | None:
        try:
            return os.stat(self.lease).st_mtime_ns
        except FileNotFoundError:
            return None

    def _watch(self) -> None:
        seen, changed = self._mtime(), time.monotonic()
        while True:
            time.sleep(max(1.0, min(10.0, self.timeout_s / 5)))
            if (mtime := self._mtime()) != seen:
                seen, changed = mtime, time.monotonic()
            elif time.monotonic() - changed > self.timeout_s:
                print(f"the flow process that submitted this job has not renewed {self.lease} for "
                      f"{self.timeout_s:.0f} s (killed, or its machine is gone): cancelling the job", flush=True)
                cancel_this_job()
                return


def renew_lease(lease: str) -> None:
    """The flow side of :class:`Leased`: touch the lease, once per poll of the job it covers."""
    try:
        os.utime(lease)
    except FileNotFoundError:
        pass  # submitted without a lease


def cancel_this_job() -> None:
    """scancel this Slurm job (every node, no requeue); outside Slurm, interrupt this process,
    which makes :class:`Command` stop its program."""
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        if os.environ.get("SLURM_ARRAY_TASK_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        subprocess.run(["scancel", job], check=False, timeout=60)
    else:
        os.kill(os.getpid(), signal.SIGINT)
