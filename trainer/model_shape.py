"""The head counts a model's attention can be built from: one check for the pipeline spec and
the trainer's config. Standard library only, so the node program does not take in the spec's
pydantic with it."""

from __future__ import annotations


def check_attention_shape(hidden_size: int, heads: int, kv_heads: int) -> None:
    """A ValueError naming the fields as the spec and the trainer's config both name them."""
    if hidden_size % heads:
        raise ValueError(f"model.hidden_size={hidden_size} is not divisible by model.num_attention_heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"model.num_kv_heads={kv_heads} must divide model.num_attention_heads={heads}")
