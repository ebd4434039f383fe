"""A training run as a chain of jobs. A run of weeks outlives every job's time limit: each job
trains from the newest checkpoint until its time limit, a preemption, a failure, or the last
step, and the next job takes over. One record per job, in ``<run>/chain.jsonl``, kept across
flow runs, so a new flow run of the same spec continues the chain and its figures.

A job that advanced the newest checkpoint spends no failure budget, whatever ended it; the
budget (``backend.<kind>.max_attempts_without_checkpoint``) counts the jobs in a row that did
not. Pure functions of the records, so a test reads a chain written by hand.

A record (a JSON object): ``flow_run``; ``job`` (the scheduler's id, None when submission
failed); ``nodes`` (comma-separated); ``node_count``; ``submitted``, ``caught_up_at``,
``ended`` (Unix seconds; ``caught_up_at``: when the run first reported a step past the highest the
chain had reached before this job, None if it never did); ``checkpoint_before``,
``checkpoint_after`` (the newest complete checkpoint's step when the job was submitted and once it
was gone); ``step`` (the highest step the run had reported when it ended); ``outcome`` (the job
layer's words, with the trainer's where it left any); ``completed`` (the run reached its last step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.records import open_appending

CHAIN_FILE = "chain.jsonl"

Record = dict[str, Any]

# Why a job ended, from its outcome, first match wins: the trainer's own words before the job
# layer's state (torchrun turns a trainer that stopped on a signal into FAILED, exit code 1).
_WHY = (("stopped on SIGUSR2", "time limit"), ("TIMEOUT", "time limit"),
        ("PREEMPTED", "preempted"), ("REQUEUE", "requeued"), ("stopped on SIGTERM", "cancelled or preempted"),
        ("CANCELLED", "cancelled"), ("NODE_FAIL", "node failure"), ("BOOT_FAIL", "node failure"),
        ("hung", "hung"), ("OUT_OF_MEMORY", "out of memory"))
# Endings that are the scheduler's or the user's doing, not a failure of the nodes or the program.
NOT_FAILURES = {"completed", "time limit", "preempted", "requeued", "cancelled", "cancelled or preempted",
                "exited before the last step"}


def why_ended(record: Record) -> str:
    if record["completed"]:
        return "completed"
    if record["outcome"] == "completed":  # ended well short of the last step: Megatron-LM's exit duration
        return "exited before the last step"
    for words, why in _WHY:
        if words in record["outcome"]:
            return why
    return "failed"


def advanced(record: Record) -> bool:
    return record["checkpoint_after"] > record["checkpoint_before"]


def attempts_without_checkpoint(records: list[Record]) -> int:
    """Jobs at the end of the chain, in a row, that ended without advancing the newest checkpoint:
    what the failure budget counts."""
    count = 0
    for record in reversed(records):
        if advanced(record) or record["completed"]:
            break
        count += 1
    return count


def read(path: Path) -> list[Record]:
    """The records of ``path``; a torn line (a flow process died writing it) is left out."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def append(path: Path, record: Record) -> None:
    with open_appending(path) as f:
        f.write(json.dumps(record) + "\n")


def lost_before(records: list[Record], i: int) -> float | None:
    """Seconds from job ``i-1``'s end until job ``i`` was past the highest step reached before it:
    queueing, start-up, the checkpoint load and the steps trained again, the time a chain loses at
    each hand-over (None for the first job, or a job that never got that far: its whole time is
    lost, counted in its own row)."""
    if i == 0 or records[i]["caught_up_at"] is None:
        return None
    return max(records[i]["caught_up_at"] - records[i - 1]["ended"], 0.0)


def goodput(records: list[Record], step_s: float | None, now: float) -> float | None:
    """The fraction of wall time since the chain's first submission that went into steps the run
    keeps: the steps up to the newest checkpoint (or the last step, once completed) since the
    chain's first job, at ``step_s`` each (the median step time). None before any step time."""
    if not records or not step_s:
        return None
    last = records[-1]
    kept = (last["step"] if last["completed"] else last["checkpoint_after"]) - records[0]["checkpoint_before"]
    elapsed = now - records[0]["submitted"]
    return min(max(kept, 0) * step_s / elapsed, 1.0) if elapsed > 0 else None


def failure_history(records: list[Record]) -> tuple[float, int]:
    """Node-hours the chain's jobs ran and the failures among them (crashes, node failures, hangs;
    not time limits, preemptions or cancels): the evidence for the cluster's failure rate."""
    node_hours = sum((r["ended"] - r["submitted"]) / 3600 * r["node_count"] for r in records)
    failures = sum(why_ended(r) not in NOT_FAILURES for r in records)
    return node_hours, failures


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def markdown(title: str, records: list[Record], budget: int, step_s: float | None, now: float,
             advice: list[str] = ()) -> str:
    """The chain artifact: a row per job (the steps it added, why it ended, the time lost before it),
    then the goodput so far, the budget left and the checkpoint advice."""
    lines = [f"# {title}", "",
             "| # | job | nodes | steps | checkpoint | ended | spent budget | lost before | ran |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(records):
        start = r["checkpoint_before"]
        spent = "no" if advanced(r) or r["completed"] else "yes"
        outcome = r["outcome"].splitlines()[0].replace("|", "/") if r["outcome"] else ""
        lines.append(f"| {i + 1} | {r['job'] or ''} | {r['nodes']} | {start} -> {r['step']} (+{max(r['step'] - start, 0)}) "
                     f"| {r['checkpoint_before']} -> {r['checkpoint_after']} | {why_ended(r)}: {outcome} | {spent} "
                     f"| {_clock(lost_before(records, i))} | {_clock(r['ended'] - r['submitted'])} |")
    share = goodput(records, step_s, now)
    lines += ["", f"- goodput so far: {'n/a' if share is None else f'{100 * share:.1f} %'} "
              f"(steps kept x median step time / wall time since the first job)",
              f"- jobs in a row without a new checkpoint: {attempts_without_checkpoint(records)} of {budget} allowed"]
    if advice:
        lines += ["", "## Checkpoint interval", "", *[f"- {line}" for line in advice]]
    return "\n".join(lines) + "\n"
