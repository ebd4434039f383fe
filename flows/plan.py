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

from pretrain import checkpoint_interval, manifest
from pretrain.hub import hub_key_inputs, resolve_commit
from pretrain.hub_refs import download_patterns, local_value, spec_references, with_local_values
from pretrain.spec import PretrainSpec
from pretrain.stages import STAGES, not_run
from tasks.convert import convert_key_inputs
from tasks.fetch import fetch_key_inputs, hub_access, list_sources
from tasks.image import image_key_inputs, project_files
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
    """Every stage of the flow, in the order it runs them: each that the spec's backend has a job
    for to run or reuse, the others skipped with the reason."""
    hub, local = _hub_files(spec)
    skipped = not_run(spec)
    rows = {stage: StagePlan(stage, "skip", why) for stage, why in skipped.items()}
    rows["fetch"] = fetch = _keyed(spec, "fetch", fetch_key_inputs(list_sources(spec)))
    references = spec_references(spec)
    if local is not None:
        spec = local
    if "tokenize" not in skipped:
        rows["tokenize"] = _tokenize(spec, fetch, local is not None)
    if "convert" not in skipped:
        rows["convert"] = (StagePlan("convert", "run", "its checkpoint comes from the Hub: fetch runs first")
                           if "model.init_from" in references and local is None else
                           _keyed(spec, "convert", convert_key_inputs(spec, Path(spec.model.init_from).expanduser())))
    if "precompile" not in skipped:
        rows["precompile"] = StagePlan("precompile", "run", "fills the compile cache; graphs it holds already are "
                                       "served from it, not compiled again")
    if "image" not in skipped:
        image = spec.backend.megatron_lm.image
        rows["image"] = _keyed(spec, "image", image_key_inputs(image, project_files() if image.install_project else {}))
    rows["train"] = StagePlan("train", "run", "never cached: continues this spec's run from its newest complete "
                              "checkpoint, if it has one (a new flow run too, unless training.continue_run is false), "
                              "as a chain of jobs of cluster.time_limit_min each")
    return hub + [rows[stage] for stage in STAGES]


def _tokenize(spec: PretrainSpec, fetch: StagePlan, hub_files_local: bool) -> StagePlan:
    if not hub_files_local:  # the tokenizer its key is built from is not on disk yet
        return StagePlan("tokenize", "run", "files from the Hub are new: fetch runs first")
    if fetch.action != "reuse":
        return StagePlan("tokenize", "run", "its input is new: fetch runs first")
    if (dataset := pretokenized(Path(fetch.output))) is not None:
        return StagePlan("tokenize", "hand on", "the fetched data is tokenized already", output=dataset)
    return _keyed(spec, "tokenize", tokenize_key_inputs(spec, Path(fetch.output)))


def checkpoint_advice(spec: PretrainSpec) -> list[str]:
    """The checkpoint interval against the one Young/Daly's formula gives for the spec's node count
    (docs/checkpoints.md), from the spec and stated assumptions; the run's chain artifact repeats it
    with what the run measures."""
    return checkpoint_interval.advice_lines(spec, checkpoint_interval.failure_inputs(spec), measured=False)


def plan_table(stages: list[StagePlan]) -> str:
    lines = []
    for s in stages:
        lines.append(f"{s.stage:<11} {s.action.upper():<8} {s.key[:16] or '-':<16}  {s.output or '-'}")
        lines.append(f"{'':<11} {s.reason}")
    return "\n".join(lines)
