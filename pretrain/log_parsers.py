"""Training logs of every backend as one metrics stream: ``{"step", "loss", "lr", ...}`` dicts.

- NxDT: Lightning's TQDM progress bar, whose updates are separated by carriage returns
  (``reduced_train_loss=13.40, lr=7.5e-9, global_step=1.000, ...``), global_step counting from 0.
- NxD Llama examples: ``step 1 step_time 244.76s throughput 3.93 seq/s loss 13.41 grad norm 1.97``.
- Megatron-LM: ``training_log``'s iteration line, with or without its timestamp prefix.
- The native trainer: JSON lines with a ``step``; those with an ``event`` (checkpoint saved, step
  skipped) record occurrences, not metrics.

Lines that look like metrics but do not parse are skipped and counted, never raised: a log is
evidence, and one garbled line must not hide the rest of a loss curve (reference/nxdt.md §4).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

# One name per quantity across backends.
NXDT_KEYS = {"reduced_train_loss": "loss", "lr": "lr", "gradient_norm": "grad_norm",
             "parameter_norm": "param_norm", "consumed_samples": "consumed_samples",
             "throughput": "throughput_seq_s", "throughput_peak": "throughput_peak_seq_s", "val_loss": "val_loss"}
MEGATRON_KEYS = {"lm loss": "loss", "learning rate": "lr", "grad norm": "grad_norm", "params norm": "param_norm",
                 "consumed samples": "consumed_samples", "elapsed time per iteration (ms)": "step_time_ms",
                 "throughput per GPU (TFLOP/s/GPU)": "tflops_per_device", "global batch size": "global_batch_size",
                 "loss scale": "loss_scale", "number of skipped iterations": "skipped_iterations",
                 "number of nan iterations": "nan_iterations", "skipped samples": "skipped_samples"}

_NXDT_PAIR = re.compile(r"([A-Za-z_][\w]*)=([^,\]\s]+)")
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
_NXD_LINE = re.compile(r"\bstep (\d+) step_time ([\d.]+)s throughput ([\d.]+) seq/s loss ([\d.eE+-]+)"
                       r"(?: grad norm ([\d.eE+-]+))?")


@dataclass
class MetricsStream:
    points: dict[int, dict[str, float]] = field(default_factory=dict)
    skipped: int = 0
    events: int = 0  # the native trainer's event lines (checkpoint saved, export, ...): signs of life

    def add(self, step: int, metrics: dict[str, float]) -> None:
        # Progress bars repeat the same step between log intervals: the last report wins.
        self.points[step] = {"step": step, **self.points.get(step, {}), **metrics}

    def as_list(self) -> list[dict[str, float]]:
        return [self.points[s] for s in sorted(self.points)]


def _number(text: str) -> float:
    return float(text.rstrip("|").strip())


def _nxdt(line: str, stream: MetricsStream) -> bool:
    if "reduced_train_loss=" not in line and "global_step=" not in line:
        return False
    pairs = dict(_NXDT_PAIR.findall(line.split("[", 1)[-1] if "[" in line else line))
    try:
        # Lightning's global_step before its increment: 0 during the first step, whose
        # consumed_samples is already 1 x GBS (reference/nxdt.md §4.1). Steps count from 1, as
        # Megatron-LM's iterations and the native trainer's do.
        step = int(float(pairs["global_step"])) + 1
        metrics = {name: _number(pairs[key]) for key, name in NXDT_KEYS.items() if key in pairs}
    except (KeyError, ValueError):
        stream.skipped += 1
        return True
    stream.add(step, metrics)
    return True


def _megatron(line: str, stream: MetricsStream) -> bool:
    match = _MEGATRON_ITER.search(line)
    if not match:
        return False
    metrics: dict[str, float] = {"train_iters": int(match.group(2))}
    try:
        for part in line[match.end():].split("|"):
            key, sep, value = part.rpartition(":")
            key = key.strip()
            if sep and key in MEGATRON_KEYS:
                metrics[MEGATRON_KEYS[key]] = _number(value)
    except ValueError:
        stream.skipped += 1
        return True
    if "loss" not in metrics:
        stream.skipped += 1
        return True
    stream.add(int(match.group(1)), metrics)
    return True


def _nxd_llama(line: str, stream: MetricsStream) -> bool:
    match = _NXD_LINE.search(line)
    if not match:
        return False
    step, step_time, throughput, loss, grad = match.groups()
    metrics = {"step_time_ms": float(step_time) * 1000, "throughput_seq_s": float(throughput), "loss": float(loss)}
    if grad is not None:
        metrics["grad_norm"] = float(grad)
    stream.add(int(step), metrics)
    return True


def _native(line: str, stream: MetricsStream) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        record = json.loads(line)
        step = int(record["step"])
        metrics = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
    except (ValueError, KeyError, TypeError):
        stream.skipped += 1
        return True
    if "event" in record:
        stream.events += 1
    else:
        stream.add(step, metrics)
    return True


def parse_log(text: str, stream: MetricsStream | None = None) -> MetricsStream:
    """Every metrics line of ``text`` (any backend, mixed with other output) into ``stream``."""
    stream = stream or MetricsStream()
    for line in re.split(r"[\r\n]+", text):
        if line.strip():
            _native(line, stream) or _megatron(line, stream) or _nxdt(line, stream) or _nxd_llama(line, stream)
    return stream
