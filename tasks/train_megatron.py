"""train (megatron-lm backend): Megatron-LM's ``pretrain_gpt.py`` under torchrun on every node, as
the GPT-3 runbooks launch it (ParallelCluster, HyperPod, EKS), with the arguments rendered from
the spec (trainer/launch/megatron_lm.py) and, when the spec names one, in its pyxis container.

``--save`` and ``--load`` name the same directory, ``<run>/checkpoints``, so a resubmitted job
resumes from Megatron's own newest checkpoint (``latest_checkpointed_iteration.txt``). Each
node's output goes to ``<run>/node-<rank>.log``; Megatron prints its iteration lines on the last
rank, so the last node's log is the metrics stream.

Nothing here runs on this machine: the task is built on Megatron-LM's documented arguments and
log lines, and tested by rendering and parsing.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from prefect import task

from blocks.cluster import SlurmCluster
from pretrain.command import Command
from pretrain.spec import MegatronLMSpec, PretrainSpec
from tasks.artifacts import retryable
from tasks.precompile import shell_line
from tasks.slurm import cluster_for, ends_cancelled, stage_request
from tasks.train import MetricsFollower, finish_run, job_completed, run_attempts, run_dir
from trainer.launch import megatron_lm


def node_command(spec: PretrainSpec, dataset: str, run: Path) -> Command:
    """Each node's torchrun line, its output kept in the run directory (pipefail: the line's
    exit status is torchrun's, not tee's)."""
    line = shell_line(megatron_lm.torchrun_command(spec, dataset, str(run / "checkpoints")))
    return Command(["bash", "-c", f"set -o pipefail; {line} 2>&1 | tee -a {shlex.quote(str(run))}/node-$NODE_RANK.log"],
                   env=megatron_lm.environment())


def in_container(cluster: SlurmCluster, spec: PretrainSpec) -> SlurmCluster:
    """``cluster`` running its srun steps in the spec's pyxis image, when the spec names one."""
    settings = spec.backend.megatron_lm
    if settings is None or not settings.container_image:
        return cluster
    return cluster.model_copy(update={"container_image": settings.container_image,
                                      "container_mounts": settings.container_mounts})


@task(name="train", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def train_megatron(spec: PretrainSpec, dataset: str) -> dict[str, Any]:
    """Train with Megatron-LM until ``training.train_steps`` (or ``train_samples``)."""
    settings = spec.backend.megatron_lm or MegatronLMSpec()
    run = run_dir(spec, dataset)
    run.mkdir(parents=True, exist_ok=True)
    cluster = in_container(cluster_for(spec), spec)
    command = node_command(spec, dataset, run)
    follower = MetricsFollower(spec, run / f"node-{spec.cluster.nodes - 1}.log", spec.training.train_steps or 0,
                               settings.hang_timeout_min * 60)
    request = stage_request(spec, f"{spec.name}-train", command)
    attempts = run_attempts(spec, cluster, follower, settings.max_restarts, prepare=lambda attempt: request)
    return finish_run(spec, follower, attempts, job_completed(attempts.history[-1]["outcome"]), [],
                      status="finished", step=max(follower.stream.points, default=0), run_dir=str(run),
                      checkpoint=str(run / "checkpoints"))
