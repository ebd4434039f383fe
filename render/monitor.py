"""The device sampler's command line, beside the training launch on every node, for every backend
(``Command.sidecar``, jobs/node.py)."""

from __future__ import annotations

from pathlib import Path

from pretrain.spec import PretrainSpec


def monitor_command(spec: PretrainSpec, run_dir: str) -> list[str]:
    """The sampler's arguments to the job's Python (``Command.sidecar``): ``<run>/devices/<node>.jsonl``,
    and TensorBoard."""
    run = Path(run_dir)
    return ["-m", "trainer", "monitor", "--dir", str(run / "devices"), "--tensorboard", str(run / "tensorboard"),
            "--interval", str(spec.training.monitor_interval_s)]
