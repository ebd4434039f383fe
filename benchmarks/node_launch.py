"""A training launch run on this machine as one node of a one-node Slurm step runs it, with the
device sampler beside it, for the GPU benchmarks (``torchtitan_gpu.py``, ``megatron_lm_gpu.py``,
``side_by_side_gpu.py``): what the train task would read of it, its log's step lines and its
devices' samples, comes back parsed by the same code.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pretrain.device_samples import DeviceSamples  # noqa: E402
from pretrain.log_parsers import parse_log  # noqa: E402
from pretrain.metrics_records import metrics_records, step_records  # noqa: E402

# What a Slurm step's environment gives a rendered node line ($NNODES, $NODE_RANK, $MASTER_ADDR).
ONE_NODE = {"NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


@dataclass
class NodeRun:
    returncode: int
    points: dict[int, dict[str, float]]
    """The node log's figures by step, as ``pretrain.log_parsers`` reads them."""
    devices: dict[str, float | None]
    """The sampler's mean utilization and peak device memory (``DeviceSamples.figures``)."""

    @property
    def steps_with_loss(self) -> list[int]:
        return sorted(step for step, point in self.points.items() if "loss" in point)

    def median(self, key: str, after: int) -> float | None:
        """The median of ``key`` over the steps after ``after`` (compile and the allocator's first
        steps left out); None where no such step has it."""
        values = [p[key] for step, p in self.points.items() if step > after and key in p]
        return statistics.median(values) if values else None

    def loss_line(self) -> str:
        steps = self.steps_with_loss
        if not steps:
            return "no step with a loss"
        first, last = steps[0], steps[-1]
        return f"loss {self.points[first]['loss']:.3f} (step {first}) -> {self.points[last]['loss']:.3f} (step {last})"


def device_figures(directory: Path) -> dict[str, float | None]:
    samples = DeviceSamples()
    for file in sorted(directory.glob("*.jsonl")):
        for record in metrics_records(file):
            if record.get("kind") == "device":
                samples.add(record)
    return samples.figures()


def run_node(argv: list[str], run: Path, *, env: dict[str, str] | None = None, cwd: Path = ROOT,
             sampler: list[str] | None = None, metrics: Path | None = None, keep_log: Path | None = None) -> NodeRun:
    """``argv`` as rank 0 of a one-node job, the sampler's arguments (``Command.sidecar``) run by
    this Python beside it until it ends. Its figures come from its log, ``run/node-0.log`` (the
    rendered lines' ``tee``), or from the native trainer's ``metrics`` stream."""
    run.mkdir(parents=True, exist_ok=True)
    beside = subprocess.Popen([sys.executable, *sampler], cwd=ROOT) if sampler else None
    try:
        returncode = subprocess.run(argv, env={**os.environ, **(env or {}), **ONE_NODE}, cwd=cwd).returncode
    finally:
        if beside is not None:
            beside.terminate()  # it takes its last sample and exits
            beside.wait(timeout=30)
    log = run / "node-0.log"
    if keep_log and log.exists():
        shutil.copy(log, keep_log)
    if metrics is not None:
        points = {r["step"]: r for r in step_records(metrics_records(metrics))} if metrics.exists() else {}
    else:
        points = parse_log(log.read_text(errors="replace")).points if log.exists() else {}
    return NodeRun(returncode, points, device_figures(run / "devices"))
