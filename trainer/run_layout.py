"""How a training run is laid out, over its ranks and on disk: the arithmetic of the global batch
and where a run's checkpoints and metrics go. One copy of each, asked by the pipeline spec and the launch
rendering on the control plane and by the trainer on the node. Standard library only, so the node
programs do not take in the spec's pydantic.

A ValueError names the fields as the config that asks names them (``section``, e.g. the spec's
``training.``) and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path

# The native trainer's checkpoint layout: ``<dir>/step-00000050/``, complete once its marker is
# written (trainer/train/checkpoint.py writes it last). Here, so that the control plane reads which
# checkpoints are complete without importing torch.
MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def data_parallel_size(world_size: int, tp: int, pp: int = 1, cp: int = 1, *, world: str = "") -> int:
    """dp = world / (tp x pp x cp): the ranks left to data parallelism once every model-parallel
    group is whole. ``world``: how the caller came to ``world_size``, for the message."""
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise ValueError(f"world size {world}{world_size} is not a multiple of parallel.tp x parallel.pp x parallel.cp "
                         f"= {tp} x {pp} x {cp} = {model_parallel}: change the node count or the parallel sizes")
    return world_size // model_parallel


def grad_accumulation(global_batch_size: int, micro_batch_size: int, dp: int, *, section: str = "") -> int:
    """Micro-batches each rank accumulates per optimizer step: global batch = micro batch x dp x
    gradient accumulation."""
    per_micro_step = micro_batch_size * dp
    if global_batch_size % per_micro_step:
        raise ValueError(f"{section}global_batch_size={global_batch_size} is not divisible by {section}"
                         f"micro_batch_size x dp = {micro_batch_size} x {dp}: use a multiple of {per_micro_step}")
    return global_batch_size // per_micro_step


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where the checkpoints of the run in ``run_dir`` go: the native trainer's ``checkpoint.dir``,
    Megatron-LM's ``--save``/``--load``, and under NxDT's ``explicit_log_dir``, where its
    exp_manager writes them by the same name."""
    return Path(run_dir) / "checkpoints"


def metrics_path(run_dir: str | Path) -> Path:
    """The native trainer's metrics stream of the run in ``run_dir`` (one JSON line a step): its
    ``metrics.jsonl_path``, which the train task follows and the demo names."""
    return Path(run_dir) / "metrics.jsonl"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def complete_steps(root: Path) -> list[int]:
    """Steps with a complete checkpoint of the native trainer under ``root``, oldest first."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and (entry / MARKER).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)
