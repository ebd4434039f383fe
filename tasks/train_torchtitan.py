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

import os
import shutil
from pathlib import Path
from typing import Any

from prefect import task

from jobs.contract import ends_cancelled, stage_request
from pretrain import manifest
from pretrain.checkpoints import torchtitan_step
from pretrain.spec import DataSpec, PretrainSpec
from render.torchtitan import loader_dir, metrics_rank, node_command, validation_dir
from tasks.artifacts import retryable
from tasks.attempts import AppendedLog, MetricsFollower, finish_run, run_attempts
from tasks.runs import run_dir
from tasks.executor import cluster_for
from trainer.run_layout import checkpoint_dir


class SplitRefused(ValueError):
    """The fetched files cannot be split as data.split asks: a retry finds the same files."""

    retryable = False


def loader_view(data_dir: Path, run: Path, data: DataSpec) -> Path:
    """:func:`loader_dir` of ``run``: the fetched files without the fetch stage's manifest, each a link. The
    loader torchtitan's ``c4_test`` entry uses, ``load_dataset(path, split="train")``, reads every
    JSON file of a directory as data, and fails on MANIFEST.json ("An error occurred while
    generating the dataset"); it reads no single file or glob. Made again for every run, so it
    follows the fetch output the spec names now.

    With a validation weight in ``data.split``, the last files by name go to :func:`validation_dir`
    instead, that share of the files (at least one, and one left to train on): that loader splits no
    file, so whole files are the held-out set, and none of them is trained on."""
    files = sorted(path.relative_to(data_dir) for path in data_dir.rglob("*")
                   if path.is_file() and path.name != manifest.MANIFEST
                   and not any(p.startswith(".") for p in path.relative_to(data_dir).parts))
    held_out = _held_out(len(files), data_dir, data)
    for view in (loader_dir(run), validation_dir(run)):
        shutil.rmtree(view, ignore_errors=True)
    for index, relative in enumerate(files):
        link = (loader_dir(run) if index < len(files) - held_out else validation_dir(run)) / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        # relative, so the link holds wherever a node mounts the shared disk
        link.symlink_to(os.path.relpath(data_dir / relative, link.parent))
    return loader_dir(run)


def _held_out(files: int, data_dir: Path, data: DataSpec) -> int:
    """How many of the ``files`` fetched files :func:`loader_view` holds out for validation. The spec
    has refused a test weight for torchtitan already (it has no test set)."""
    _, valid, _ = data.split_weights
    if not valid:
        return 0
    if files < 2:
        raise SplitRefused(f"data.split={data.split!r} holds whole files out for torchtitan's validation, and the fetch "
                           f"output {data_dir} has {files} file(s): one to train on and one to validate on are the "
                           "least; add a data.sources entry, or set data.split='100,0,0' and training.eval_iters=0")
    return min(files - 1, max(1, round(files * valid / sum(data.split_weights))))


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
