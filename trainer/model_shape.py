"""The rules a model's attention heads must meet, to be built and to be spread over
tensor-parallel ranks: each exists here once, and every place that needs it asks it. The
pipeline spec (pretrain/spec/) asks before anything is queued; the trainer's config
(trainer/train/config.py) at start-up; the converter's layout (trainer/nxdt_layout.py) before it
reads a tensor. Standard library only, so the node programs do not take in the spec's pydantic.

Each raises a ValueError that names the fields as the spec names them (the trainer's config and
the converter's flags come from those fields) and the fix.
"""

from __future__ import annotations


def with_defaults(config: dict) -> dict:
    """A Llama config.json with Hugging Face's defaults for the fields it may leave out."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return {"num_key_value_heads": heads, **config, "head_dim": head_dim}


def config_mismatches(config: dict, expected: list[tuple[str, int]]) -> list[str]:
    """Each field of a Llama config.json that differs from ``expected``, said as "FIELD is X, the
    spec says Y"."""
    config = with_defaults(config)
    return [f"{field} is {config.get(field, 'absent')}, the spec says {value}"
            for field, value in expected if config.get(field) != value]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_attention_shape(hidden_size: int, heads: int, kv_heads: int) -> None:
    """Heads of equal width, and whole groups of query heads per KV head."""
    if hidden_size % heads:
        raise ValueError(f"model.hidden_size={hidden_size} is not divisible by model.num_attention_heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"model.num_kv_heads={kv_heads} must divide model.num_attention_heads={heads}")


def check_heads_over_tp(heads: int, tp: int) -> None:
    """Each tensor-parallel rank holds whole attention heads (every backend)."""
    if heads % tp:
        raise ValueError(f"parallel.tp={tp} does not divide model.num_attention_heads={heads}: "
                         f"choose tp in {divisors(heads)}")


def check_kv_heads_over_tp(kv_heads: int, tp: int, kv_replicator: int | None = None) -> None:
    """Each tensor-parallel rank holds whole KV heads. ``kv_replicator``: NxD's KV replication
    (kv_size_multiplier), which multiplies the KV heads before they are split; None for a backend
    without it (the native trainer, Megatron-LM), where only tp can change."""
    if kv_replicator is None:
        if kv_heads % tp:
            raise ValueError(f"model.num_kv_heads={kv_heads} is not divisible by parallel.tp={tp}: each "
                             f"tensor-parallel rank needs whole KV heads; choose tp in {divisors(kv_heads)}")
        return
    # NxD's GQAQKVColumnParallelLinear refuses the first itself (aws-neuron/neuronx-distributed
    # src/neuronx_distributed/modules/qkv_linear.py); it asks only that the KV rows split evenly,
    # which whole KV heads per rank imply.
    if tp % kv_replicator:
        raise ValueError(f"parallel.kv_replicator={kv_replicator} must divide parallel.tp={tp} (NxD's "
                         f"GQAQKVColumnParallelLinear: tp % kv_size_multiplier == 0): choose one of {divisors(tp)}")
    if (kv_heads * kv_replicator) % tp:
        need = [r for r in divisors(tp) if (kv_heads * r) % tp == 0]
        raise ValueError(
            f"model.num_kv_heads={kv_heads} x parallel.kv_replicator={kv_replicator} is not divisible by "
            f"parallel.tp={tp}: set parallel.kv_replicator to one of {need}"
            if need else f"model.num_kv_heads={kv_heads} cannot be spread over parallel.tp={tp}")


def check_converted_kv_heads(kv_heads: int, tp: int, kv_replicator: int) -> None:
    """The converter's own limit (trainer/nxdt_layout.py), stricter than NxD: it moves whole KV
    heads, and with replication gives each rank exactly one. NxD would run two replicated KV
    heads a rank; converted weights would not fit them."""
    if kv_replicator > 1 and kv_heads * kv_replicator != tp:
        fix = f"set parallel.kv_replicator={tp // kv_heads}" if tp % kv_heads == 0 else "set parallel.kv_replicator=1"
        raise ValueError(f"with parallel.kv_replicator={kv_replicator} the converter (model.init_from) gives each rank "
                         f"one replicated KV head, so model.num_kv_heads={kv_heads} x kv_replicator must equal "
                         f"parallel.tp={tp}; {fix}")


def check_qkv_layout(qkv_linear: bool, fuse_qkv: bool, kv_replicator: int) -> None:
    """The attention layouts NxDT's Llama builds and the converter writes. NxDT builds
    GQAQKVColumnParallelLinear (``qkv_proj.weight_q/k/v``, fused ``weight_qkv``; the one layer
    that replicates KV heads) only when ``qkv_linear`` is true; otherwise plain
    ``q_proj``/``k_proj``/``v_proj`` ColumnParallelLinear layers, which hold each KV head once,
    unless fuse_qkv is set with as many KV heads as heads: then one strided ``qkv_proj.weight``
    (``LlamaAttention.__init__`` in aws-neuron/neuronx-distributed-training
    src/neuronx_distributed_training/models/hf_models/modeling_llama.py, commit 9169aa0)."""
    if qkv_linear:
        return
    if fuse_qkv:
        raise ValueError("model.fuse_qkv=true needs model.qkv_linear=true: without it NxDT's Llama ignores "
                         "fuse_qkv under grouped-query attention and, with as many KV heads as heads, builds a "
                         "strided qkv_proj.weight that the converter does not write; set model.fuse_qkv=false or "
                         "model.qkv_linear=true")
    if kv_replicator > 1:
        raise ValueError(f"parallel.kv_replicator={kv_replicator} needs model.qkv_linear=true: with qkv_linear "
                         "false NxDT's k_proj/v_proj hold each KV head once and replicate none; set "
                         "parallel.kv_replicator=1 or model.qkv_linear=true")


def check_native_model(family: str, heads: int, kv_heads: int) -> None:
    """What the native trainer (trainer/train/model.py) builds: GPT is Hugging Face's GPT-2."""
    if family == "gpt" and kv_heads != heads:
        raise ValueError(f"model.num_kv_heads applies to family=llama only; GPT-2 has no grouped-query attention: "
                         f"remove model.num_kv_heads or set it to model.num_attention_heads={heads}")


def check_native_float8(float8: bool, family: str, precision: str, tp: int) -> None:
    """What the native trainer's float8 (torchao's Float8Linear, trainer/train/parallelize.py) runs with."""
    if not float8:
        return
    if precision != "bf16":
        raise ValueError(f"float8 with precision={precision!r}: float8 matmuls run inside bf16 training; "
                         "set the precision to bf16")
    if tp > 1:
        # under tensor parallelism torchao needs its own float8 sharding styles, not wired here
        raise ValueError(f"float8 with parallel.tp={tp}: float8 runs with tp=1 only; set parallel.tp=1 or turn float8 off")
    if family != "llama":
        raise ValueError("float8 needs family=llama: GPT-2's blocks are Conv1D modules, which float8 does not convert")


def check_native_tp(family: str, heads: int, kv_heads: int, tp: int) -> None:
    """What the native trainer's tensor parallelism (trainer/train/parallelize.py) can split."""
    if family == "gpt" and tp > 1:
        raise ValueError(f"parallel.tp={tp} needs family=llama: GPT-2's fused Conv1D c_attn cannot be split by "
                         "heads without reordering it; use parallel.tp=1 (FSDP) for GPT models")
    check_heads_over_tp(heads, tp)
    check_kv_heads_over_tp(kv_heads, tp)
