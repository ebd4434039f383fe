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

from pretrain import checkpoint_interval
from pretrain.checkpoint_room import room_line
from pretrain.hub import hub_key_inputs, resolve_commit
from pretrain.hub_refs import download_patterns, local_value, spec_references, with_local_values
from pretrain.spec import PretrainSpec
from tasks.fetch import hub_access
from flows.stages import PlanInputs, StagePlan, keyed, stages_of


def _hub_files(spec: PretrainSpec) -> tuple[list[StagePlan], PretrainSpec | None]:
    """One plan per hf:// field (the tokenizer, the checkpoint, NxDT's config.json), each keyed by
    the commit its revision points at now; and the spec naming their outputs, when all are there
    (None while one must be downloaded first)."""
    references = spec_references(spec)
    access = hub_access(spec) if references else None
    plans, values = [], {}
    for field, ref in references.items():
        patterns = download_patterns(field, ref)
        hub = keyed(spec, "hub", hub_key_inputs(ref, resolve_commit(ref, access), patterns),
                    same=("repo_type", "repo_id", "patterns"))
        plans.append(StagePlan(f"hub {field}", hub.action, f"{ref.uri}: {hub.reason}", hub.key, hub.output))
        values[field] = local_value(field, ref, hub.output)
    complete = all(p.action == "reuse" for p in plans)
    return plans, with_local_values(spec, values) if complete else None


def plan(spec: PretrainSpec) -> list[StagePlan]:
    """Every stage of the flow, in the order it runs them (its backend's list, flows/stages.py):
    each that the spec's backend has a job for to run or reuse, the others skipped with the reason."""
    hub, local = _hub_files(spec)
    inputs = PlanInputs(local or spec, hub_fields=frozenset(spec_references(spec)), hub_local=local is not None)
    for stage in stages_of(spec):
        why = stage.why_not(spec)
        inputs.earlier[stage.name] = StagePlan(stage.name, "skip", why) if why else stage.plan(inputs)
    return hub + list(inputs.earlier.values())


def checkpoint_advice(spec: PretrainSpec) -> list[str]:
    """The checkpoint interval against the one Young/Daly's formula gives for the spec's node count
    (docs/checkpoints.md), from the spec and stated assumptions (the run's chain artifact repeats it
    with what the run measures), and the room the checkpoints take."""
    return [*checkpoint_interval.advice_lines(spec, checkpoint_interval.failure_inputs(spec), measured=False),
            room_line(spec)]


def plan_table(stages: list[StagePlan]) -> str:
    lines = []
    for s in stages:
        lines.append(f"{s.stage:<11} {s.action.upper():<8} {s.key[:16] or '-':<16}  {s.output or '-'}")
        lines.append(f"{'':<11} {s.reason}")
    return "\n".join(lines)
