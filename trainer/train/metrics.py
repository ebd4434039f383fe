"""Training metrics: one writer rank, three sinks.

- A JSON-lines stream (every step, every evaluation, and events such as checkpoints), flushed
  line by line because the control plane tails it while training runs.
- TensorBoard scalars under torchtitan-style ``group/name(unit)`` tags; the runbooks monitor
  training with TensorBoard.
- A Megatron-LM style iteration line on stdout every ``log_interval`` steps, so one log parser
  (``pretrain/log_parsers.py``) reads this trainer's console exactly like Megatron-LM's.

A resumed attempt first drops what the attempt before it logged after its last checkpoint, so the
stream holds every step once, from the run that the checkpoints actually continue.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any



@dataclass(kw_only=True)
class MetricsConfig:
    jsonl_path: str
    """The metrics stream, one JSON object per line."""
    tensorboard_dir: str | None = None
    """TensorBoard event files; None writes none."""
    log_interval: int = 1
    """Steps between console lines; the JSON-lines stream gets every step."""

    def __post_init__(self) -> None:
        if self.log_interval < 1:
            raise ValueError(f"metrics.log_interval={self.log_interval}: must be at least 1")


# The trainer's metric names as TensorBoard tags; a name not listed here is its own tag.
TENSORBOARD_TAGS = {
    "loss": "loss_metrics/loss",
    "nan_iterations": "loss_metrics/nan_iterations",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "tokens_per_s": "throughput/tokens_per_s",
    "mfu_pct": "mfu(%)",
    "step_time_ms": "time_metrics/step_time(ms)",
    "memory_gib": "memory/max_allocated(GiB)",
    "consumed_samples": "progress/consumed_samples",
    "val_loss": "validation_metrics/loss",
    "val_ppl": "validation_metrics/perplexity",
}

# Megatron-LM's training_log fields in its order, with its labels and formats (its integer ``d``
# formats as ``.0f``, which print the same); the labels are what log parsers key on. tokens/s,
# MFU and memory are this trainer's additions where Megatron-LM prints TFLOP/s.
_CONSOLE_FIELDS = (
    ("consumed_samples", "consumed samples", "{:12.0f}"),
    ("step_time_ms", "elapsed time per iteration (ms)", "{:.1f}"),
    ("tokens_per_s", "tokens per second", "{:.1f}"),
    ("mfu_pct", "MFU (%)", "{:.2f}"),
    ("memory_gib", "max memory allocated (GiB)", "{:.2f}"),
    ("lr", "learning rate", "{:.6E}"),
    ("global_batch_size", "global batch size", "{:5.0f}"),
    ("loss", "lm loss", "{:.6E}"),
    ("grad_norm", "grad norm", "{:.3f}"),
    ("skipped_iterations", "number of skipped iterations", "{:3.0f}"),
    ("nan_iterations", "number of nan iterations", "{:3.0f}"),
)
# Megatron-LM's evaluate_and_print_results labels.
_EVAL_LABELS = {"val_loss": "lm loss value", "val_ppl": "lm loss PPL"}


class MetricsWriter:
    """One writer rank (rank 0); other ranks get a writer whose methods do nothing.

    Metric values are numbers; None means unknown (MFU on a CPU) and is left out of every sink.
    """

    def __init__(self, cfg: MetricsConfig, *, rank: int, train_steps: int, resume_step: int = 0):
        self.cfg = cfg
        self.train_steps = train_steps
        self.enabled = rank == 0
        # The first line of every attempt reaches the console, so a resume shows at once.
        self._first_step = resume_step + 1
        self._jsonl = None
        self._tensorboard = None
        if not self.enabled:
            return
        path = Path(cfg.jsonl_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A fresh start (resume_step 0) after an attempt that died before its first checkpoint
        # must drop that attempt's lines too, so the purge runs whenever the file exists.
        if path.exists():
            _keep_steps_up_to(path, resume_step)
        self._jsonl = path.open("a", encoding="utf-8")
        if cfg.tensorboard_dir:
            # Imported here, by the one rank that writes: tensorboard's import costs a rank 0.9 CPU-s.
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard readers drop events at or after purge_step from earlier files.
            self._tensorboard = SummaryWriter(cfg.tensorboard_dir, purge_step=resume_step + 1)

    def log_step(self, step: int, metrics: dict[str, float | None]) -> None:
        if not self.enabled:
            return
        now = time.time()
        known = _known(metrics)
        self._write_line({"step": step, **known, "time": now})
        self._write_scalars(step, known, now)
        if step == self._first_step or step % self.cfg.log_interval == 0:
            self._print(now, self._iteration_line(step, known))

    def log_eval(self, step: int, metrics: dict[str, float | None]) -> None:
        if not self.enabled:
            return
        now = time.time()
        known = _known(metrics)
        self._write_line({"step": step, **known})
        self._write_scalars(step, known, now)
        parts = [f"{_EVAL_LABELS.get(k, k)}: {v:.6E}" for k, v in known.items()]
        self._print(now, f" validation loss at iteration {step} | " + " | ".join(parts) + " |")

    def log_event(self, step: int, event: str, **fields: Any) -> None:
        """An occurrence, not a measurement (``checkpoint_saved``, ``nan_skipped``, ``resumed``):
        log parsers recognise the ``event`` key and keep such lines out of the metrics."""
        if not self.enabled:
            return
        now = time.time()
        self._write_line({"step": step, "event": event, **fields, "time": now})
        details = "".join(f" {k}: {v} |" for k, v in fields.items())
        self._print(now, f" {event} at iteration {step} |{details}")

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tensorboard is not None:
            self._tensorboard.close()

    def _write_line(self, record: dict[str, Any]) -> None:
        # Non-finite values become null: the stream stays strict JSON for every reader, and the
        # nan_iterations counter says why a loss is missing. default=str takes paths in events.
        clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        self._jsonl.write(json.dumps(clean, allow_nan=False, default=str) + "\n")
        self._jsonl.flush()

    def _write_scalars(self, step: int, metrics: dict[str, float], walltime: float) -> None:
        if self._tensorboard is None:
            return
        for name, value in metrics.items():
            self._tensorboard.add_scalar(TENSORBOARD_TAGS.get(name, name), value, step, walltime=walltime)

    def _iteration_line(self, step: int, metrics: dict[str, float]) -> str:
        line = f" iteration {step:8d}/{self.train_steps:8d} |"
        for name, label, fmt in _CONSOLE_FIELDS:
            if name in metrics:
                line += f" {label}: {fmt.format(metrics[name])} |"
        return line

    def _print(self, now: float, text: str) -> None:
        print(f" [{datetime.fromtimestamp(now):%Y-%m-%d %H:%M:%S}]{text}", flush=True)


def _known(metrics: dict[str, Any]) -> dict[str, int | float]:
    # Counters stay integers in the stream; tensors and numpy scalars become floats.
    return {name: value if isinstance(value, int) and not isinstance(value, bool) else float(value)
            for name, value in metrics.items() if value is not None}


def _keep_steps_up_to(path: Path, last_step: int) -> None:
    """Rewrite ``path`` without records after ``last_step``, through a temporary file and a rename:
    a writer killed halfway leaves the old file whole, never a truncated one."""
    tmp = path.with_name(path.name + ".tmp")
    with path.open(encoding="utf-8") as src, tmp.open("w", encoding="utf-8") as dst:
        for line in src:
            try:
                keep = json.loads(line)["step"] <= last_step
            except (ValueError, KeyError, TypeError):
                keep = False  # the torn last line of a writer killed mid-write
            if keep:
                dst.write(line if line.endswith("\n") else line + "\n")
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)


def flops_per_token(*, num_layers: int, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                    num_kv_heads: int, vocab_size: int, seq_length: int, gated_mlp: bool) -> float:
    """Model FLOPs of one token's forward and backward pass, counting every matmul.

    Convention (Narayanan et al. 2021, arXiv:2104.04473, appendix "Floating-point operations",
    implemented by Megatron-LM's ``num_floating_point_operations``; torchtitan's
    ``get_num_flop_per_token`` and PaLM's appendix B agree): a matmul costs 2 FLOPs per
    multiply-add; backward costs twice forward (gradients of inputs and of weights), so 3x in all;
    causal attention is counted as full, not halved; activation recomputation is not counted
    (model FLOPs, not hardware FLOPs). Input embeddings are lookups, not matmuls; norms, softmax
    and biases are left out as negligible. Heads are hidden_size / num_attention_heads wide, as in
    Llama 3 and GPT-2.
    """
    head_dim = hidden_size // num_attention_heads
    q_width = num_attention_heads * head_dim
    kv_width = num_kv_heads * head_dim
    projections = hidden_size * (q_width + 2 * kv_width) + q_width * hidden_size
    mlp = (3 if gated_mlp else 2) * hidden_size * ffn_hidden_size
    weights_per_layer = projections + mlp
    # Scores (q . k) and the weighted sum of values, each seq_length x head_dim per head and token.
    attention_per_layer = 2 * seq_length * q_width
    lm_head = hidden_size * vocab_size
    forward = 2 * (num_layers * (weights_per_layer + attention_per_layer) + lm_head)
    return 3.0 * forward


def model_flops_per_token(model: Any, seq_length: int, gated_mlp: bool | None = None) -> float:
    """:func:`flops_per_token` of a model section: the trainer's ``ModelConfig`` or the spec's
    ``model``, which name their fields alike. The MLP is gated (SwiGLU's three matrices) where the
    family is Llama, unless ``gated_mlp`` says otherwise (a GPT of a Llama's widths)."""
    return flops_per_token(num_layers=model.num_layers, hidden_size=model.hidden_size,
                           ffn_hidden_size=model.ffn_hidden_size, num_attention_heads=model.num_attention_heads,
                           num_kv_heads=model.kv_heads, vocab_size=model.vocab_size, seq_length=seq_length,
                           gated_mlp=model.family == "llama" if gated_mlp is None else gated_mlp)


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak_flops_per_device: float | None) -> float | None:
    """Model FLOPs utilisation in percent; None where the device's peak is unknown (a CPU)."""
    if peak_flops_per_device is None:
        return None
    return 100.0 * tokens_per_s_per_device * flops_per_token / peak_flops_per_device
