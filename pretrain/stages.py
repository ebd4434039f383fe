"""The pretrain flow's stages, and which of them a spec's backend has a job for.

One rule for `pretrain plan`, which shows the others as skipped with the reason, and for the flow,
which refuses a stage asked for by name that it would not run: a run of ``stages=[precompile]``
for a backend without a precompile job would otherwise end green having done nothing.
"""

from __future__ import annotations

from typing import Literal, get_args

from pretrain.spec import PretrainSpec, TorchtitanSpec

Stage = Literal["fetch", "tokenize", "convert", "precompile", "image", "train"]
STAGES: tuple[str, ...] = get_args(Stage)


def not_run(spec: PretrainSpec) -> dict[str, str]:
    """Each stage the flow has no job for with ``spec``, and why, in the flow's order."""
    backend = spec.backend
    kind = backend.kind
    why: dict[str, str] = {}
    if kind == "torchtitan":
        why["tokenize"] = ("backend.kind=torchtitan: torchtitan's loader tokenizes the fetched JSONL as it reads "
                           "it (docs/render.md)")
    if kind != "neuron":
        why["convert"] = (f"backend.kind={kind} reads model.init_from as it is; only NxDT (backend.kind=neuron) "
                          "needs a checkpoint converted to its shards")
    elif not spec.model.init_from:
        why["convert"] = "model.init_from is empty: training starts from scratch, there is no checkpoint to convert"
    if kind == "native" and not backend.native.compile:
        why["precompile"] = "backend.native.compile=false: nothing is compiled, so there is no cache to fill"
    elif kind == "torchtitan":
        why["precompile"] = torchtitan_compiles(backend.torchtitan)
    elif kind == "megatron-lm":
        why["precompile"] = ("backend.kind=megatron-lm: pretrain_gpt.py has no ahead-of-time compile; it warms its "
                             "fused kernels at the job's start")
    if kind != "megatron-lm":
        why["image"] = (f"backend.kind={kind} runs in the cluster's own environment; only Megatron-LM's "
                        "backend.megatron_lm.image is built by the flow")
    elif not (backend.megatron_lm and backend.megatron_lm.image):
        why["image"] = ("backend.megatron_lm.image is not set: the job runs in backend.megatron_lm.container_image, "
                        "or on the nodes as they are")
    return {stage: why[stage] for stage in STAGES if stage in why}


def refuse_not_run(spec: PretrainSpec, asked: list[str]) -> None:
    """Refuse stages asked for by name that the flow would not run for ``spec``."""
    skipped = not_run(spec)
    if refused := [stage for stage in asked if stage in skipped]:
        runs = [stage for stage in STAGES if stage not in skipped]
        raise ValueError("; ".join(f"stages: {stage} does not run for spec {spec.name!r}: {skipped[stage]}"
                                   for stage in refused)
                         + f". Leave {' and '.join(refused)} out (the stages that run here: {', '.join(runs)}).")


def torchtitan_compiles(titan: TorchtitanSpec) -> str:
    """Where a torchtitan run's graphs are compiled, since no precompile job does it: what AWS
    documents for TorchNeuron has no ahead-of-time compile to run (docs/render.md)."""
    if not titan.compile:
        return "backend.torchtitan.compile=false: torch.compile is off, nothing to compile ahead"
    if titan.device == "cuda":
        return ("device=cuda: nothing to compile ahead; torch.compile (inductor) compiles each graph in the "
                "training job, at its first steps")
    return ("device=neuron: AWS documents no ahead-of-time compile for TorchNeuron (docs/render.md); "
            "torch.compile(backend=neuron) compiles each graph at its first call, so the first training run "
            "fills the NEFF cache")
