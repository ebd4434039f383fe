"""Command lines rendered from the spec, so a conversion and the training configuration that
loads its output can never disagree (reference/nxdt.md §1.2, §1.6, §1.7: the runbooks' fused
QKV, trn2 K/V layout and trn2 pipeline-cut mismatches)."""

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
    if p.pipeline_cuts:
        flags += ["--pipeline-cuts", *p.pipeline_cuts]
    return flags


def convert_command(spec: PretrainSpec, source: str, output: str, record: str | None = None) -> list[str]:
    """``python -m trainer convert hf-to-nxdt`` for the spec's layout, verified after writing."""
    argv = [sys.executable, "-m", "trainer", "convert", "hf-to-nxdt", "--input", source, "--output", output,
            *convert_flags(spec), "--verify", "--overwrite"]
    return argv + (["--record", record] if record else [])
