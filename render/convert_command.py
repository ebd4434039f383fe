"""Command lines rendered from the spec, so a conversion and the training configuration that
loads its output can never disagree (the runbooks' fused QKV, trn2 K/V layout and trn2
pipeline-cut mismatches, with their public sources: docs/stages.md, "convert")."""

from __future__ import annotations

import sys

from pretrain.spec import PretrainSpec


def convert_flags(spec: PretrainSpec) -> list[str]:
    """The converter flags that shape the shards, exactly as training will partition and name
    the weights."""
    if spec.backend.kind != "neuron" or spec.backend.neuron is None:
        raise ValueError(f"backend.kind={spec.backend.kind}: HF -> NxDT conversion is for backend.kind=neuron")
    p = spec.parallel
    flags = ["--tp", str(p.tp), "--pp", str(p.pp), "--kv-multiplier", str(p.kv_replicator),
             "--hw-backend", spec.backend.neuron.instance_type]
    if spec.model.fuse_qkv:
        flags.append("--fuse-qkv")
    if not spec.model.qkv_linear:
        flags.append("--no-qkv-linear")
    if p.pipeline_cuts:
        flags += ["--pipeline-cuts", *p.pipeline_cuts]
    return flags


def expected_config(spec: PretrainSpec) -> dict[str, int]:
    """The config.json values the NxDT YAML assumes: it takes the shape from the spec, the
    converter from config.json (its ``--config``: aws-neuron/neuronx-distributed
    ``src/neuronx_distributed/scripts/checkpoint_converter.py``), so the converter compares the two."""
    m = spec.model
    return {"num_hidden_layers": m.num_layers, "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden_size,
            "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.kv_heads,
            "head_dim": m.head_dim, "vocab_size": m.vocab_size}


def convert_command(spec: PretrainSpec, source: str, output: str, record: str | None = None) -> list[str]:
    """``python -m trainer convert hf-to-nxdt`` for the spec's layout and model shape, verified
    after writing."""
    argv = [sys.executable, "-m", "trainer", "convert", "hf-to-nxdt", "--input", source, "--output", output,
            *convert_flags(spec), "--verify", "--overwrite",
            "--expect", *(f"{field}={value}" for field, value in expected_config(spec).items())]
    return argv + (["--record", record] if record else [])
