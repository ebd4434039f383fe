"""train (megatron-lm backend): Megatron-LM's ``pretrain_gpt.py`` under torchrun on every node, as
the GPT-3 runbooks launch it (ParallelCluster, HyperPod, EKS), with the arguments rendered from
the spec (render/megatron_lm.py) and in its pyxis container: the image stage's squashfs, or the
image the spec names.

``--save`` and ``--load`` name the same directory, ``<run>/checkpoints``, so a resubmitted job
resumes from Megatron's own newest checkpoint (``latest_checkpointed_iteration.txt``). Each
node's output goes to ``<run>/node-<rank>.log``; Megatron prints its iteration lines on the last
rank, so the last node's log is the metrics stream.

Nothing here runs on this machine: the task is built on Megatron-LM's documented arguments and
log lines, and tested by rendering and parsing.
"""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.executor import cluster_for
from jobs.contract import ends_cancelled, stage_request
from pretrain.checkpoints import megatron_step
from pretrain.spec import MegatronLMSpec, PretrainSpec
from render.megatron_lm import in_container, node_command
from tasks.artifacts import retryable
from tasks.attempts import AppendedLog, MetricsFollower, finish_run, run_attempts
from tasks.runs import run_dir
from trainer.run_layout import checkpoint_dir


@task(name="train", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def train_megatron(spec: PretrainSpec, dataset: str, image: str | None = None) -> dict[str, Any]:
    """Train with Megatron-LM until ``training.train_steps`` (or ``train_samples``), in ``image``
    (the image stage's squashfs) when given."""
    settings = spec.backend.megatron_lm or MegatronLMSpec()
    run = run_dir(spec, dataset)
    run.mkdir(parents=True, exist_ok=True)
    cluster = in_container(cluster_for(spec), spec, image)
    log = run / f"node-{spec.cluster.nodes - 1}.log"
    follower = MetricsFollower(spec, log, spec.training.steps, settings.hang_timeout_min * 60, devices_dir=run / "devices")
    appended = AppendedLog(log)
    attempts = run_attempts(spec, cluster, follower, settings.max_attempts_without_checkpoint,
                            appended.submitting(lambda launch: stage_request(
                                launch, f"{spec.name}-train", node_command(launch, dataset, run))),
                            run, lambda: megatron_step(checkpoint_dir(run)), explain=appended.explain)
    return finish_run(spec, follower, attempts, attempts.finished, [],
                      status="finished", step=max(follower.stream.points, default=0), run_dir=str(run),
                      checkpoint=str(checkpoint_dir(run)))
