"""The model's shape and how it is split over the ranks: the model and parallel sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pretrain.hub_refs import checked
from pretrain.spec.strict import Strict
from trainer.model_shape import check_attention_shape


class RopeScaling(Strict):
    """Llama 3.1's frequency-dependent RoPE scaling."""

    rope_type: Literal["llama3"] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


# Megatron-LM paper (arXiv 2104.04473, Table 1): GPT-3 style sizes (layers, hidden, heads).
GPT_SIZES: dict[str, tuple[int, int, int]] = {
    "1.7B": (24, 2304, 24), "3.6B": (30, 3072, 32), "7.5B": (36, 4096, 32),
    "18.4B": (40, 6144, 48), "39.1B": (48, 8192, 64), "76.1B": (60, 10240, 80),
    "145.6B": (80, 12288, 96), "310.1B": (96, 16384, 128),
}


class ModelSpec(Strict):
    family: Literal["llama", "gpt"]
    size: str | None = Field(None, description=f"A GPT size from the Megatron-LM table "
                             f"({', '.join(GPT_SIZES)}); fills layers, hidden and heads.")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(None, gt=0, description="Grouped-query attention KV heads; default: heads.")
    ffn_hidden_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    rope_theta: float | None = Field(None, description="RoPE base (Llama).")
    rope_scaling: RopeScaling | None = Field(None, description="Llama 3.1 rope scaling.")
    init_from: str | None = Field(None, description="A Hugging Face checkpoint (directory with config.json "
                                  "+ safetensors, or hf://ORG/NAME[@REVISION]) to continue pre-training from; "
                                  "converted for the backend. For backend.kind=megatron-lm, a Megatron-LM "
                                  "checkpoint directory, loaded with --pretrained-checkpoint.")
    fuse_qkv: bool = Field(True, description="NxD: one fused qkv_proj.weight_qkv per rank (the 70B YAMLs' "
                           "default); false keeps weight_q/k/v. Needs qkv_linear.")
    qkv_linear: bool = Field(True, description="NxD (Llama): attention through GQAQKVColumnParallelLinear, "
                             "weights qkv_proj.weight_q/k/v (the 70B YAMLs' value); false builds plain "
                             "self_attn.q_proj/k_proj/v_proj ColumnParallelLinear layers, without KV replication "
                             "(LlamaAttention in aws-neuron/neuronx-distributed-training src/"
                             "neuronx_distributed_training/models/hf_models/modeling_llama.py). The NxDT YAML and "
                             "the converter's key layout both follow it.")

    @field_validator("init_from")
    @classmethod
    def _hub_checkpoint(cls, value: str | None) -> str | None:
        return checked(value, "model.init_from")

    @model_validator(mode="before")
    @classmethod
    def _expand_size(cls, data: dict) -> dict:
        size = data.get("size") if isinstance(data, dict) else None
        if size is None:
            return data
        if size not in GPT_SIZES:
            raise ValueError(f"model.size={size!r}: choose one of {', '.join(GPT_SIZES)}")
        layers, hidden, heads = GPT_SIZES[size]
        # The size fills the shape; a field given explicitly next to it wins, so presets can
        # still say exactly what the runbook says.
        return {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
                "ffn_hidden_size": 4 * hidden, **data}

    @model_validator(mode="after")
    def _shape(self) -> ModelSpec:
        check_attention_shape(self.hidden_size, self.num_attention_heads, self.kv_heads)
        if self.seq_length > self.max_position_embeddings:
            raise ValueError(f"model.seq_length={self.seq_length} exceeds "
                             f"model.max_position_embeddings={self.max_position_embeddings}")
        if self.family == "gpt" and (self.rope_scaling or self.rope_theta):
            raise ValueError("model.rope_theta/rope_scaling apply to family=llama only "
                             "(GPT uses learned absolute positions)")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class ParallelSpec(Strict):
    tp: int = Field(1, gt=0, description="Tensor parallel size.")
    pp: int = Field(1, gt=0, description="Pipeline parallel size.")
    cp: int = Field(1, gt=0, description="Context parallel size (ring attention).")
    zero1: bool = Field(True, description="Shard optimizer state over data parallel ranks.")
    sequence_parallel: bool = Field(False, description="Megatron/NxD sequence parallelism.")
    kv_replicator: int = Field(1, gt=0, description="KV-head replication factor (NxD kv_size_multiplier).")
    pipeline_cuts: list[str] = Field(default_factory=list, description="Explicit pipeline cut "
                                     "points, e.g. model.layers.18; empty = even split.")
