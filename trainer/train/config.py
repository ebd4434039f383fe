"""The trainer's configuration: one typed object per component, composed by :class:`TrainConfig`.

The control plane renders this from the pipeline spec into one JSON file; the node program
reads only that file, so a run can be repeated by hand with ``python -m trainer train --config``.
Each component validates itself and names the field to change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainer.model_shape import check_attention_shape, check_native_float8, check_native_model, check_native_tp
from trainer.train.metrics import MetricsConfig


FORMATS = ("megatron", "nxd-arrow")
SPLIT_PART = re.compile(r"\s*(\d+\.?\d*|\.\d+)\s*")


@dataclass(kw_only=True)
class DataConfig:
    paths: list[str]
    """Megatron dataset prefixes (``.../data_text_document``, without ``.bin``/``.idx``), or one
    NxD Arrow dataset directory."""
    weights: list[float] | None = None
    """Blend weights, one per path; None blends several paths equally."""
    split: str = "969,30,1"
    """Train, validation, test weights, Megatron style; the test part is held out, never read."""
    format: Literal["megatron", "nxd-arrow"] = "megatron"
    cache_dir: str | None = None
    """Where GPTDataset's index cache goes; None: Megatron's default, ``PREFIX/cache/``."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"data.format={self.format!r}: use one of {', '.join(FORMATS)}")
        if not self.paths:
            raise ValueError("data.paths is empty: give at least one dataset prefix or directory")
        self.paths = [os.fspath(p) for p in self.paths]
        if self.format == "megatron":
            for path in self.paths:
                if path.endswith((".bin", ".idx")):
                    raise ValueError(f"data.paths: {path!r} names a file; give the prefix without .bin/.idx")
        elif len(self.paths) > 1:
            raise ValueError(f"data.paths: format nxd-arrow reads one dataset directory (NxDT's train_dir), "
                             f"got {len(self.paths)}; blend Megatron-format datasets instead")
        if self.weights is not None:
            if len(self.weights) != len(self.paths):
                raise ValueError(f"data.weights has {len(self.weights)} values for {len(self.paths)} paths: "
                                 f"give one weight per path, or none for an equal blend")
            if not all(math.isfinite(w) and w > 0 for w in self.weights):
                raise ValueError(f"data.weights={self.weights}: every weight must be a positive number "
                                 f"(leave a dataset out rather than giving it weight 0)")
        split_weights(self.split)  # a bad split fails here, not at build time


def split_weights(split: str) -> tuple[float, float, float]:
    """``"969,30,1"`` as (train, valid, test) fractions; missing parts are 0, as in Megatron."""
    # plain decimals only: Megatron re-reads the string with the regex [.0-9]+
    parts = split.split(",")
    well_formed = 1 <= len(parts) <= 3 and all(SPLIT_PART.fullmatch(part) for part in parts)
    if not well_formed or float(parts[0]) <= 0:
        raise ValueError(f"data.split={split!r}: give up to three non-negative comma-separated weights "
                         f"train,valid,test with a positive train weight, e.g. '969,30,1'")
    values = [float(part) for part in parts]
    values += [0.0] * (3 - len(values))
    total = sum(values)
    return values[0] / total, values[1] / total, values[2] / total


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
        check_attention_shape(self.hidden_size, self.num_attention_heads, self.kv_heads)
        check_native_model(self.family, self.num_attention_heads, self.kv_heads)

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
    float8: bool = False
    """The blocks' linear layers compute in float8 (torchao, dynamic tensorwise scales); needs a
    GPU with float8 tensor cores (compute capability 8.9: L40S, H100 and later)."""

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
    final: bool = True
    """Write one at the end. The precompile warm-up does not: nothing resumes from it, and a
    large model's checkpoint takes minutes to write."""

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
        m = self.model
        check_native_tp(m.family, m.num_attention_heads, m.kv_heads, self.parallel.tp)
        check_native_float8(self.parallel.float8, m.family, self.precision, self.parallel.tp)

    @property
    def evaluates(self) -> bool:
        return not self.benchmark and self.eval_iters > 0

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
        return _build(cls, raw, str(path))


def _build(cls: type, raw: Any, file: str, path: str = "") -> Any:
    """Nested dataclasses from plain dicts, checked against their type hints: an unknown or missing
    field, a value outside its ``Literal`` or of the wrong type names the file and the dotted path."""
    where = f"{file}: {path}" if path else file
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
    missing = [name for name, f in fields.items() if name not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    kwargs = {name: _value(hints[name], value, file, f"{path}.{name}" if path else name)
              for name, value in raw.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:  # each component's own checks name their dotted fields already
        raise ValueError(f"{file}: {exc}") from None


def _value(hint: Any, value: Any, file: str, path: str) -> Any:
    """``value`` as the type ``hint`` declares (an int for a float field becomes a float, a list for
    a tuple a tuple), or a ValueError naming the field, the value and what it must be."""
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _build(hint, value, file, path)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return _value(option, value, file, path)
            except ValueError as exc:
                if not str(exc).startswith(f"{file}: {path}="):
                    raise  # not the value itself but an item or field inside it: that error names it
    elif origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
    elif origin is list and isinstance(value, list):
        return [_value(args[0], v, file, f"{path}[{i}]") for i, v in enumerate(value)]
    elif origin is tuple and isinstance(value, (list, tuple)):
        items = args[:1] * len(value) if args[1:] == (...,) else args
        if len(value) == len(items):
            return tuple(_value(a, v, file, f"{path}[{i}]") for i, (a, v) in enumerate(zip(items, value)))
    elif origin is dict and isinstance(value, dict):
        return {_value(args[0], k, file, path): _value(args[1], v, file, f"{path}.{k}") for k, v in value.items()}
    elif hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif hint is int and isinstance(value, bool):
        pass  # JSON's true is no integer, though Python's bool is an int
    elif hint is Any or isinstance(hint, type) and isinstance(value, hint):
        return value
    raise ValueError(f"{file}: {path}={json.dumps(value, default=repr)}: expected {_describe(hint)}")


def _describe(hint: Any) -> str:
    """A type hint in the words of the JSON config: ``list[float] | None`` is "[number, ...] or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return f"one of {', '.join(json.dumps(a) for a in args)}"
    if origin is list or origin is tuple and args[1:] == (...,):
        return f"[{_describe(args[0])}, ...]"
    if origin is tuple:
        return f"[{', '.join(map(_describe, args))}]"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "mapping"
    return {type(None): "null", bool: "true or false", int: "integer", float: "number", str: "string"}.get(
        hint, getattr(hint, "__name__", str(hint)))
