"""The runbook of each backend as a list of stages, each stage a value: its name, whether it
applies to a spec and why not, the earlier outputs it reads, the task that runs it, how
`pretrain plan` keys it and the files `pretrain render` shows for it.

The flow, `pretrain plan` and `pretrain render` walk the same list, so which stages a backend runs
is decided here and nowhere else. Every backend's list names the same six stages in the same
order; a stage a backend has no job for stands in it as :func:`absent`, with what does its work
instead, which the plan shows and the flow says when the stage is asked for by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, get_args

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster
from pretrain import manifest
from pretrain.spec import PretrainSpec, TorchtitanSpec
from flows import stage_files
from tasks.convert import convert, convert_key_inputs
from tasks.fetch import fetch, fetch_key_inputs, list_sources
from tasks.image import build_image, image_key_inputs, project_files
from tasks.precompile import precompile_native, precompile_neuron
from tasks.tokenize import pretokenized, tokenize, tokenize_key_inputs
from tasks.train import train
from tasks.train_megatron import train_megatron
from tasks.train_nxdt import train_nxdt
from tasks.train_torchtitan import train_torchtitan

StageName = Literal["fetch", "tokenize", "convert", "precompile", "image", "train"]
STAGE_NAMES: tuple[str, ...] = get_args(StageName)

Outputs = dict[str, Any]


@dataclass(frozen=True)
class StagePlan:
    """One row of `pretrain plan`."""

    stage: str
    action: str  # "reuse", "run", "hand on" (a fetched dataset that is tokenized already), or "skip"
    #              (a stage the backend has no job for: the reason says what does its work instead)
    reason: str
    key: str = ""
    output: str = ""


@dataclass
class PlanInputs:
    """What a stage's plan reads: the spec (naming the Hub's files on disk once all are there) and
    the rows of the stages before it."""

    spec: PretrainSpec
    hub_fields: frozenset[str]
    """The spec's hf:// fields."""
    hub_local: bool
    """Every hf:// field's files are on disk already."""
    earlier: dict[str, StagePlan] = field(default_factory=dict)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[PretrainSpec, Outputs, bool], Any] | None
    """The task, given the outputs of the stages before it and ``reuse_only`` (hand on an existing
    output, never build: the stage was left out of the run but a stage after it reads its output).
    None for a stage the backend has no job for."""
    plan: Callable[[PlanInputs], StagePlan] | None
    render: Callable[[PretrainSpec, SlurmCluster], dict[str, str]] | None
    """Its files as its jobs run them on Slurm (flows/stage_files.py)."""
    objects: Callable[[PretrainSpec, KubernetesCluster, dict[str, str]], dict[str, str]] | None = None
    """The objects its jobs are on Kubernetes, from its Slurm files; None for a stage that runs
    in the flow's process (fetch) or on Slurm only (image)."""
    why_not: Callable[[PretrainSpec], str | None] = lambda spec: None
    """Why it does not run for a spec, or None when it does."""
    needs: tuple[str, ...] = ()
    """The earlier stages whose outputs it reads."""
    cached: bool = False
    """Its output is keyed and kept: a run that leaves it out hands on the existing one when a
    stage it runs needs it."""


def runs_if(setting: Callable[[PretrainSpec], Any], otherwise: str) -> Callable[[PretrainSpec], str | None]:
    """A stage's ``why_not`` for a stage that runs when ``setting`` of the spec is set, and
    ``otherwise`` says why it does not."""
    return lambda spec: None if setting(spec) else otherwise


def absent(name: str, why: Callable[[PretrainSpec], str]) -> Stage:
    """A stage the backend has no job for; ``why`` says what does its work instead."""
    return Stage(name, run=None, plan=None, render=None, why_not=why)


def absent_on_kind(name: str, why: str) -> Stage:
    """A stage no job of the spec's backend kind runs; ``why`` follows ``backend.kind=<kind>``."""
    return absent(name, lambda spec: f"backend.kind={spec.backend.kind} {why}")


def always_runs(name: str, why: str) -> Callable[[PlanInputs], StagePlan]:
    """The plan of a stage that is never handed on: it runs, for ``why``."""
    return lambda p: StagePlan(name, "run", why)


def keyed(spec: PretrainSpec, stage: str, key_inputs: dict, same: tuple[str, ...] = ()) -> StagePlan:
    """A cached stage's row: reuse when a complete output with this key is there, else run, naming
    which of the key's inputs changed since the newest output. ``same``: key inputs an earlier
    output must share to be compared with (a hub output is compared with the same repository's and
    files', so a moved revision shows as its commit)."""
    found = manifest.existing_output(spec.paths.root, stage, key_inputs)
    key, final = found.key, found.directory
    if found.manifest is not None:
        return StagePlan(stage, "reuse", "a complete output with this key is there (MANIFEST valid)", key, str(final))
    newest = manifest.newest_output(spec.paths.root, stage, lambda m: all(
        m.get("key_inputs", {}).get(name) == key_inputs[name] for name in same))
    if newest is None:
        reason = "no earlier output of this stage"
    elif "key_inputs" not in newest:
        reason = f"the newest output ({newest['key'][:16]}) was written before keys recorded their inputs"
    else:
        changes = manifest.changed_inputs(newest["key_inputs"], key_inputs)
        reason = ("changed since the newest output: " + "; ".join(changes) if changes
                  else "an output with this key was started but never completed")
    return StagePlan(stage, "run", reason, key, str(final))


# ------------------------------------------------------------------------------------ fetch

FETCH = Stage("fetch", run=lambda spec, outputs, reuse_only: fetch(spec, reuse_only=reuse_only),
              plan=lambda p: keyed(p.spec, "fetch", fetch_key_inputs(list_sources(p.spec))),
              render=None,  # the sources are listed by the spec itself; the Hub's files by hub_downloads
              cached=True)


# --------------------------------------------------------------------------------- tokenize

def _plan_tokenize(p: PlanInputs) -> StagePlan:
    fetched = p.earlier["fetch"]
    if not p.hub_local:  # the tokenizer its key is built from is not on disk yet
        return StagePlan("tokenize", "run", "files from the Hub are new: fetch runs first")
    if fetched.action != "reuse":
        return StagePlan("tokenize", "run", "its input is new: fetch runs first")
    if (dataset := pretokenized(Path(fetched.output))) is not None:
        return StagePlan("tokenize", "hand on", "the fetched data is tokenized already", output=dataset)
    return keyed(p.spec, "tokenize", tokenize_key_inputs(p.spec, Path(fetched.output)))


TOKENIZE = Stage("tokenize", run=lambda spec, outputs, reuse_only: tokenize(spec, outputs["fetch"],
                                                                            reuse_only=reuse_only),
                 plan=_plan_tokenize, render=stage_files.tokenize_files, objects=stage_files.tokenize_objects,
                 needs=("fetch",), cached=True)
TOKENIZED_AS_READ = absent("tokenize", lambda spec: (
    "backend.kind=torchtitan: torchtitan's loader tokenizes the fetched JSONL as it reads it (docs/render.md)"))


# ---------------------------------------------------------------------------------- convert

def _plan_convert(p: PlanInputs) -> StagePlan:
    if "model.init_from" in p.hub_fields and not p.hub_local:
        return StagePlan("convert", "run", "its checkpoint comes from the Hub: fetch runs first")
    return keyed(p.spec, "convert", convert_key_inputs(p.spec, Path(p.spec.model.init_from).expanduser()))


CONVERT = Stage("convert", run=lambda spec, outputs, reuse_only: convert(spec, reuse_only=reuse_only),
                plan=_plan_convert, render=stage_files.convert_files, objects=stage_files.convert_objects,
                cached=True,
                why_not=runs_if(lambda spec: spec.model.init_from, "model.init_from is empty: training starts from "
                                "scratch, there is no checkpoint to convert"))
CHECKPOINT_AS_IT_IS = absent_on_kind("convert", "reads model.init_from as it is; only NxDT (backend.kind=neuron) "
                                     "needs a checkpoint converted to its shards")


# ------------------------------------------------------------------------------- precompile

_plan_precompile = always_runs("precompile", "fills the compile cache; graphs it holds already are served from it, "
                               "not compiled again")


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


PRECOMPILE_NATIVE = Stage(
    "precompile", run=lambda spec, outputs, reuse_only: precompile_native(spec, outputs["tokenize"], outputs["fetch"]),
    plan=_plan_precompile, render=stage_files.precompile_native_files,
    objects=stage_files.precompile_native_objects, needs=("fetch", "tokenize"),
    why_not=runs_if(lambda spec: spec.backend.native.compile,
                    "backend.native.compile=false: nothing is compiled, so there is no cache to fill"))
PRECOMPILE_NEURON = Stage(
    "precompile", run=lambda spec, outputs, reuse_only: precompile_neuron(spec, outputs["tokenize"],
                                                                         outputs.get("convert")),
    plan=_plan_precompile, render=stage_files.precompile_neuron_files,
    objects=stage_files.precompile_neuron_objects, needs=("tokenize", "convert"))
COMPILED_IN_TRAINING = absent("precompile", lambda spec: torchtitan_compiles(spec.backend.torchtitan))
FUSED_KERNELS_AT_START = absent("precompile", lambda spec: (
    "backend.kind=megatron-lm: pretrain_gpt.py has no ahead-of-time compile; it warms its fused kernels at the "
    "job's start"))


# ------------------------------------------------------------------------------------ image

def _plan_image(p: PlanInputs) -> StagePlan:
    image = p.spec.backend.megatron_lm.image
    return keyed(p.spec, "image", image_key_inputs(image, project_files() if image.install_project else {}))


IMAGE = Stage("image", run=lambda spec, outputs, reuse_only: build_image(spec, reuse_only=reuse_only),
              plan=_plan_image, render=stage_files.image_files, cached=True,
              why_not=runs_if(lambda spec: spec.backend.megatron_lm and spec.backend.megatron_lm.image,
                              "backend.megatron_lm.image is not set: the job runs in "
                              "backend.megatron_lm.container_image, or on the nodes as they are"))
CLUSTER_ENVIRONMENT = absent_on_kind("image", "runs in the cluster's own environment; only Megatron-LM's "
                                     "backend.megatron_lm.image is built by the flow")


# ------------------------------------------------------------------------------------ train

_plan_train = always_runs("train", "never cached: continues this spec's run from its newest complete checkpoint, "
                          "if it has one (a new flow run too, unless training.continue_run is false), as a chain of "
                          "jobs of cluster.time_limit_min each")


def _train(run: Callable[[PretrainSpec, Outputs], Any], render: Callable[..., dict[str, str]],
           objects: Callable[..., dict[str, str]], needs: tuple[str, ...]) -> Stage:
    return Stage("train", run=lambda spec, outputs, reuse_only: run(spec, outputs), plan=_plan_train,
                 render=render, objects=objects, needs=needs)


TRAIN_NATIVE = _train(lambda spec, outputs: train(spec, outputs["tokenize"], outputs["fetch"],
                                                  nodelist=(outputs.get("precompile") or {}).get("nodes")),
                      stage_files.train_native_files, stage_files.train_native_objects, ("fetch", "tokenize"))
TRAIN_NXDT = _train(lambda spec, outputs: train_nxdt(spec, outputs["tokenize"], outputs.get("convert"),
                                                     outputs.get("precompile")),
                    stage_files.train_nxdt_files, stage_files.train_nxdt_objects, ("tokenize", "convert"))
TRAIN_MEGATRON = _train(lambda spec, outputs: train_megatron(spec, outputs["tokenize"], outputs.get("image")),
                        stage_files.train_megatron_files, stage_files.train_megatron_objects, ("tokenize", "image"))
TRAIN_TORCHTITAN = _train(lambda spec, outputs: train_torchtitan(spec, outputs["fetch"]),
                          stage_files.train_torchtitan_files, stage_files.train_torchtitan_objects, ("fetch",))


# ---------------------------------------------------------------------- each backend's runbook

BACKEND_STAGES: dict[str, tuple[Stage, ...]] = {
    "native": (FETCH, TOKENIZE, CHECKPOINT_AS_IT_IS, PRECOMPILE_NATIVE, CLUSTER_ENVIRONMENT, TRAIN_NATIVE),
    "neuron": (FETCH, TOKENIZE, CONVERT, PRECOMPILE_NEURON, CLUSTER_ENVIRONMENT, TRAIN_NXDT),
    "megatron-lm": (FETCH, TOKENIZE, CHECKPOINT_AS_IT_IS, FUSED_KERNELS_AT_START, IMAGE, TRAIN_MEGATRON),
    "torchtitan": (FETCH, TOKENIZED_AS_READ, CHECKPOINT_AS_IT_IS, COMPILED_IN_TRAINING, CLUSTER_ENVIRONMENT,
                   TRAIN_TORCHTITAN),
}


def stages_of(spec: PretrainSpec) -> tuple[Stage, ...]:
    return BACKEND_STAGES[spec.backend.kind]


def not_run(spec: PretrainSpec) -> dict[str, str]:
    """Each stage the flow has no job for with ``spec``, and why, in the flow's order."""
    return {stage.name: why for stage in stages_of(spec) if (why := stage.why_not(spec))}


def refuse_not_run(spec: PretrainSpec, asked: list[str]) -> None:
    """Refuse stages asked for by name that the flow would not run for ``spec``: a run of
    ``stages=[precompile]`` for a backend without a precompile job would otherwise end green
    having done nothing."""
    skipped = not_run(spec)
    if refused := [stage for stage in asked if stage in skipped]:
        runs = [stage for stage in STAGE_NAMES if stage not in skipped]
        raise ValueError("; ".join(f"stages: {stage} does not run for spec {spec.name!r}: {skipped[stage]}"
                                   for stage in refused)
                         + f". Leave {' and '.join(refused)} out (the stages that run here: {', '.join(runs)}).")


def to_run(spec: PretrainSpec, selected: set[str]) -> list[tuple[Stage, bool]]:
    """The stages a run of ``selected`` runs, in order, each with ``reuse_only``: those selected
    that apply, and the cached stages they read (directly or through another) handing on their
    existing outputs."""
    chosen: list[tuple[Stage, bool]] = []
    wanted = set(selected)
    for stage in reversed([s for s in stages_of(spec) if s.why_not(spec) is None]):
        if stage.name in selected or (stage.cached and stage.name in wanted):
            chosen.append((stage, stage.name not in selected))
            wanted |= set(stage.needs)
    return chosen[::-1]
