"""train (torchtitan backend): ``python -m torchtitan.train`` under torchrun on every node, as
torchtitan's multinode_trainer.slurm launches it, with the arguments rendered from the spec
(render/torchtitan.py).

A resubmitted job resumes by itself: torchtitan's checkpointer looks in ``checkpoint.folder``
(``<run>/checkpoints``) for the highest ``step-N`` holding DCP's ``.metadata`` and loads it, model,
optimizer, dataloader and step together (``_find_load_step`` in
torchtitan/components/checkpointer/dcp.py); the HF weights of ``model.init_from`` are read only
while that folder has none. The node holding the metrics rank writes the step lines to its
``<run>/node-<rank>.log``, the metrics stream. A failed attempt's outcome names the error a rank
printed into that log during the attempt (the job's end says only that torchrun exited 1).

Nothing here has run: the task is built on torchtitan 0.3.0's parser and log lines, and tested by
rendering, parsing and its attempt loop fed public torchtitan log text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from jobs.contract import ends_cancelled, stage_request
from pretrain.checkpoints import torchtitan_step
from pretrain.spec import PretrainSpec
from render.torchtitan import loader_view, metrics_rank, node_command
from tasks.artifacts import retryable
from tasks.attempts import AppendedLog, MetricsFollower, finish_run, run_attempts
from tasks.runs import run_dir
from tasks.executor import cluster_for
from trainer.run_layout import checkpoint_dir


@task(name="train", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def train_torchtitan(spec: PretrainSpec, data_dir: str) -> dict[str, Any]:
    """Train with torchtitan on the fetched JSONL in ``data_dir`` until ``training.train_steps``."""
    settings = spec.backend.torchtitan
    run = run_dir(spec, data_dir)
    run.mkdir(parents=True, exist_ok=True)
    loader = str(loader_view(Path(data_dir), run, spec.data))
    log = run / f"node-{metrics_rank(spec) // spec.cluster.devices_per_node}.log"
    follower = MetricsFollower(spec, log, spec.training.steps, settings.hang_timeout_min * 60,
                               devices_dir=run / "devices")
    appended = AppendedLog(log)
    attempts = run_attempts(spec, cluster_for(spec), follower, settings.max_attempts_without_checkpoint,
                            appended.submitting(lambda launch: stage_request(
                                launch, f"{spec.name}-train", node_command(launch, loader, run, spec.model.init_from))),
                            run, lambda: torchtitan_step(checkpoint_dir(run)),
                            explain=appended.explain)
    return finish_run(spec, follower, attempts, attempts.finished, [],
                      status="finished", step=max(follower.stream.points, default=0), run_dir=str(run),
                      checkpoint=str(checkpoint_dir(run)))
