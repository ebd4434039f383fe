"""The newest complete checkpoint of a run, as each backend marks a checkpoint complete. The chain
of jobs (tasks/attempts.py) asks it before and after every job: a job that advanced it spends
no failure budget.

Each reader takes the run's checkpoint directory and returns the step of the newest complete
checkpoint, 0 when there is none; none of them loads anything.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainer.run_layout import complete_steps

# Megatron-LM's tracker file, written by rank 0 after every rank saved (``get_checkpoint_tracker_filename``
# and ``save_checkpoint`` in megatron/training/checkpointing.py): the iteration, or "release".
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_TORCHTITAN_STEP = re.compile(r"^step-(\d+)$")
_NXDT_STEP = re.compile(r"step=(\d+)")


def native_step(checkpoints: Path) -> int:
    """The native trainer's: a ``step-N`` directory with its COMPLETE marker."""
    return max(complete_steps(checkpoints), default=0)


def torchtitan_step(checkpoints: Path) -> int:
    """torchtitan's: a ``step-N`` directory holding DCP's ``.metadata``, which DCP writes after
    every rank's files (the rule torchtitan's own ``_find_load_step`` in
    torchtitan/components/checkpointer/dcp.py applies when it resumes)."""
    steps = [int(m.group(1)) for d in (checkpoints.iterdir() if checkpoints.is_dir() else [])
             if (m := _TORCHTITAN_STEP.match(d.name)) and (d / ".metadata").is_file()]
    return max(steps, default=0)


def megatron_step(checkpoints: Path) -> int:
    """Megatron-LM's: the iteration its tracker file names (a "release" checkpoint is a start, not
    progress: 0)."""
    try:
        text = (checkpoints / MEGATRON_TRACKER).read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


def nxdt_newest(checkpoints: Path) -> Path | None:
    """NxD Training's newest complete checkpoint directory: NxD writes ``done`` into a checkpoint's
    directory only when every rank has saved (aws-neuron/neuronx-distributed
    ``src/neuronx_distributed/trainer/checkpoint.py``, ``save_checkpoint``); the highest
    ``step=N`` in its name wins, the newest on a tie."""
    complete = [d for d in checkpoints.glob("*") if (d / "done").is_file()] if checkpoints.is_dir() else []

    def order(path: Path) -> tuple[int, float]:
        step = _NXDT_STEP.search(path.name)
        return (int(step.group(1)) if step else -1, path.stat().st_mtime)

    return max(complete, key=order, default=None)


def nxdt_step(checkpoints: Path) -> int:
    newest = nxdt_newest(checkpoints)
    step = _NXDT_STEP.search(newest.name) if newest else None
    return int(step.group(1)) if step else 0
