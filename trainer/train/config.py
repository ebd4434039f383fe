"""The trainer's configuration: one typed object per component, composed by :class:`TrainConfig`.

The control plane renders this from the pipeline spec into one JSON file; the node program
reads only that file, so a run can be repeated by hand with ``python -m trainer train --config``.
Each component validates itself and names the field to change.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainer.train.data import DataConfig
from trainer.train.metrics import MetricsConfig


@dataclass(kw_only=True)
class ModelConfig:
    family: Literal["llama", "gpt"]
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int | None = None
    """Grouped-query attention KV heads (Llama); None means one per attention head."""
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """Llama 3.1 rope scaling, as in its config.json."""
    init_from: str | None = None
    """A Hugging Face checkpoint directory (config.json + safetensors) to continue pre-training from."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"model.hidden_size={self.hidden_size} is not divisible by "
                             f"model.num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"model.num_kv_heads={self.kv_heads} must divide "
                             f"model.num_attention_heads={self.num_attention_heads}")
        if self.family == "gpt" and self.kv_heads != self.num_attention_heads:
            raise ValueError("model.num_kv_heads applies to family=llama only; GPT-2 has no grouped-query attention")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads


@dataclass(kw_only=True)
class OptimConfig:
    lr: float
    min_lr: float = 0.0
    warmup_steps: int = 0
    decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping (the norm is still reported)."""
    max_nan_steps_in_a_row: int = 10
    """A step whose loss or gradient is not finite is skipped; this many in a row aborts the run."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"optim.lr={self.lr}, optim.min_lr={self.min_lr}: need 0 <= min_lr <= lr and lr > 0")
        if self.max_nan_steps_in_a_row < 1:
            raise ValueError("optim.max_nan_steps_in_a_row must be at least 1")


@dataclass(kw_only=True)
class ParallelConfig:
    tp: int = 1
    """Tensor-parallel size (DTensor); data parallel (FSDP2) takes the remaining ranks."""
    activation_checkpointing: bool = False
    compile: bool = False
    """torch.compile each transformer block (inductor on cpu/cuda, the neuron backend on Trainium)."""

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"parallel.tp={self.tp}: must be at least 1")


@dataclass(kw_only=True)
class CheckpointConfig:
    dir: str
    interval: int = 1000
    """Steps between checkpoints (a checkpoint is also written at the end and on a stop signal)."""
    keep: int = 3
    """Complete checkpoints kept; older ones are deleted once a newer one is complete."""
    async_save: bool = True
    """Write checkpoints in the background while training continues."""

    def __post_init__(self) -> None:
        if self.interval < 1 or self.keep < 1:
            raise ValueError(f"checkpoint.interval={self.interval}, checkpoint.keep={self.keep}: both must be >= 1")


@dataclass(kw_only=True)
class TrainConfig:
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    checkpoint: CheckpointConfig
    metrics: MetricsConfig
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: str = "auto"
    """cpu, cuda, neuron, or auto (the current torch.accelerator, else cpu)."""
    steps: int
    micro_batch_size: int = 1
    global_batch_size: int
    seq_length: int
    seed: int = 1234
    precision: Literal["bf16", "fp32"] = "bf16"
    """bf16 parameters and compute with fp32 gradient reduction on accelerators; CPU always runs fp32."""
    eval_interval: int = 1000
    eval_iters: int = 10
    benchmark: bool = False
    """Fixed steps and no evaluation: the nightly benchmark mode."""
    export_hf: str | None = None
    """Write the final model as Hugging Face safetensors + config.json here."""
    eod_id: int = 0
    """End-of-document token id of the tokenizer the data was made with."""

    def __post_init__(self) -> None:
        if self.seq_length > self.model.max_position_embeddings:
            raise ValueError(f"seq_length={self.seq_length} is longer than model.max_position_embeddings="
                             f"{self.model.max_position_embeddings}: shorten the sequence or enlarge the model's positions")
        if self.steps < 1 or self.micro_batch_size < 1 or self.global_batch_size < 1:
            raise ValueError("steps, micro_batch_size and global_batch_size must be at least 1")
        if self.model.num_attention_heads % self.parallel.tp or self.model.kv_heads % self.parallel.tp:
            raise ValueError(f"parallel.tp={self.parallel.tp} must divide model.num_attention_heads="
                             f"{self.model.num_attention_heads} and the KV heads ({self.model.kv_heads})")

    @property
    def evaluates(self) -> bool:
        return not self.benchmark and self.eval_iters > 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
        return _build(cls, raw, f"{path}")


def _build(cls: type, raw: Any, where: str) -> Any:
    """Nested dataclasses from plain dicts; an unknown or missing field names its dotted path."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
    kwargs = {}
    for name, value in raw.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            value = _build(hint, value, f"{where}: {name}")
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ValueError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
