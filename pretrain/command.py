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
import zlib
from dataclasses import dataclass, field

import submitit


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
    # A fixed port per job: every node derives the same one without talking to the others.
    port = 20000 + zlib.crc32(str(job.job_id).encode()) % 20000
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
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def __call__(self) -> int:
        dist = distributed_environment()
        argv = [string.Template(arg).safe_substitute(dist) for arg in self.argv]
        env = {**os.environ, **dist, **self.env}
        print(f"[rank {dist['RANK']}] $ {' '.join(argv)}", flush=True)
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
