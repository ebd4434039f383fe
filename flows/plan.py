"""`pretrain plan`: what a run of the pretrain flow would do with the outputs already on disk,
without submitting anything. For each stage: its key and output path, whether it would run or
hand on a complete output (its MANIFEST validates), and why it would run: which of the key's
inputs changed since the newest output of that stage.

Keys are computed by the stages' own functions, from the same inputs the stages read: the
sources as their stores list them now, the fetched files, the tokenizer's content, the
checkpoint's. Where an input does not exist yet (tokenize's, before fetch has run), the stage's
key cannot be known and the plan says which stage must run first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pretrain import manifest
from pretrain.hub import hub_key_inputs, resolve_commit
from pretrain.hub_refs import download_patterns, local_value, spec_references, with_local_values
from pretrain.spec import PretrainSpec, TorchtitanSpec
from tasks.convert import convert_key_inputs
from tasks.fetch import fetch_key_inputs, hub_access, list_sources
from tasks.tokenize import pretokenized, tokenize_key_inputs


@dataclass(frozen=True)
class StagePlan:
    stage: str
    action: str  # "reuse", "run", "hand on" (a fetched dataset that is tokenized already), or "skip"
    #              (a stage the backend has no job for: the reason says what does its work instead)
    reason: str
    key: str = ""
    output: str = ""


def _keyed(spec: PretrainSpec, stage: str, key_inputs: dict, same: tuple[str, ...] = ()) -> StagePlan:
    """``same``: key inputs an earlier output must share to be compared with (a hub output is
    compared with the same repository's and files', so a moved revision shows as its commit)."""
    key = manifest.stable_hash(key_inputs)
    final = manifest.output_dir(spec.paths.root, stage, key)
    if manifest.load_valid(final, key) is not None:
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


def _hub_files(spec: PretrainSpec) -> tuple[list[StagePlan], PretrainSpec | None]:
    """One plan per hf:// field (the tokenizer, the checkpoint, NxDT's config.json), each keyed by
    the commit its revision points at now; and the spec naming their outputs, when all are there
    (None while one must be downloaded first)."""
    references = spec_references(spec)
    access = hub_access(spec) if references else None
    plans, values = [], {}
    for field, ref in references.items():
        patterns = download_patterns(field, ref)
        hub = _keyed(spec, "hub", hub_key_inputs(ref, resolve_commit(ref, access), patterns),
                     same=("repo_type", "repo_id", "patterns"))
        plans.append(StagePlan(f"hub {field}", hub.action, f"{ref.uri}: {hub.reason}", hub.key, hub.output))
        values[field] = local_value(field, ref, hub.output)
    complete = all(p.action == "reuse" for p in plans)
    return plans, with_local_values(spec, values) if complete else None


def plan(spec: PretrainSpec) -> list[StagePlan]:
    """Every stage that applies to the spec's backend, in the order the flow runs them."""
    stages, local = _hub_files(spec)
    fetch = _keyed(spec, "fetch", fetch_key_inputs(list_sources(spec)))
    stages.append(fetch)
    if spec.backend.kind == "torchtitan":
        # torchtitan's loader tokenizes the fetched JSONL as it reads it: the flow has no tokenize stage
        return stages + _unkeyed(spec)
    if local is None:
        # the tokenizer or checkpoint the later keys are built from is not on disk yet
        stages.append(StagePlan("tokenize", "run", "files from the Hub are new: fetch runs first"))
        stages += _unkeyed(spec)
        return stages
    spec = local
    if fetch.action != "reuse":
        stages.append(StagePlan("tokenize", "run", "its input is new: fetch runs first"))
    elif (dataset := pretokenized(Path(fetch.output))) is not None:
        stages.append(StagePlan("tokenize", "hand on", "the fetched data is tokenized already", output=dataset))
    else:
        stages.append(_keyed(spec, "tokenize", tokenize_key_inputs(spec, Path(fetch.output))))
    if spec.backend.kind == "neuron" and spec.model.init_from:
        stages.append(_keyed(spec, "convert", convert_key_inputs(spec, Path(spec.model.init_from).expanduser())))
    return stages + _unkeyed(spec)


def _unkeyed(spec: PretrainSpec) -> list[StagePlan]:
    """The stages that always run."""
    kind, stages = spec.backend.kind, []
    if kind == "neuron" and "model.init_from" in spec_references(spec):
        stages.append(StagePlan("convert", "run", "its checkpoint comes from the Hub: fetch runs first"))
    if kind == "neuron" or (kind == "native" and spec.backend.native.compile):
        stages.append(StagePlan("precompile", "run", "fills the compile cache; graphs it holds already are "
                                "served from it, not compiled again"))
    elif kind == "torchtitan":
        stages.append(StagePlan("precompile", "skip", _torchtitan_compiles(spec.backend.torchtitan)))
    stages.append(StagePlan("train", "run", "never cached: a new flow run trains afresh; a retry resumes "
                            "from its newest complete checkpoint"))
    return stages


def _torchtitan_compiles(titan: TorchtitanSpec) -> str:
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


def plan_table(stages: list[StagePlan]) -> str:
    lines = []
    for s in stages:
        lines.append(f"{s.stage:<11} {s.action.upper():<8} {s.key[:16] or '-':<16}  {s.output or '-'}")
        lines.append(f"{'':<11} {s.reason}")
    return "\n".join(lines)
