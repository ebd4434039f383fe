"""The chaos soak's arithmetic (benchmarks/chaos_soak.py): goodput, recovery times and the steps a
fault cost, from what the soak recorded. Pure functions of that record, so a test reads a real one.

The record (a JSON object):

- ``steps``: the steps each flow run trains;
- ``started``, ``ended``: the soak's wall clock (Unix seconds), from its first flow run's trigger to
  its last run's end;
- ``baseline``: the uninterrupted flow run of the same spec and seed, a run as below;
- ``runs``: the soak's flow runs in order, each ``{"flow_run", "state", "started", "ended",
  "seen", "final"}``: ``seen`` every step record of the metrics stream the soak saw while the
  run trained (a step trained twice, before a fault and after its resume, shows twice, with two
  times), ``final`` the stream as the run left it;
- ``faults``: ``{"kind", "time", "run", "detail"}`` each, ``run`` the index of the run it struck;
- and, for the reader, ``command``, ``injector_errors`` (faults that could not be struck) and
  ``load_average_at_end``.

A step record is the trainer's (trainer/train/metrics.py): ``step``, ``loss``, ``time`` (when the
step ended) and ``step_time_ms``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

Run = dict[str, Any]


def useful_seconds(run: Run) -> float:
    """The step time that went into the run's result: each step of its final stream once. A run
    that did not end Completed produced nothing."""
    if run["state"] != "Completed":
        return 0.0
    once = {r["step"]: r["step_time_ms"] for r in run["final"]}
    return sum(once.values()) / 1000


def goodput(runs: list[Run], started: float, ended: float) -> float:
    """Useful step time over the wall time."""
    return sum(useful_seconds(run) for run in runs) / (ended - started)


@dataclass(frozen=True)
class StepCounts:
    completed: int  # distinct steps in the final stream
    lost: int  # steps of 1..steps missing from the final stream of a Completed run
    recomputed: int  # steps trained again after a fault threw their first result away
    duplicated: int  # steps that the final stream holds more than once


def step_counts(run: Run, steps: int) -> StepCounts:
    final = [r["step"] for r in run["final"]]
    trained = {(r["step"], r["time"]) for r in run["seen"]}
    lost = len(set(range(1, steps + 1)) - set(final)) if run["state"] == "Completed" else 0
    return StepCounts(completed=len(set(final)), lost=lost,
                      recomputed=len(trained) - len({step for step, _ in trained}),
                      duplicated=len(final) - len(set(final)))


def _begun_after(record: dict[str, Any], moment: float) -> bool:
    # A step in flight when the fault struck may still end after it (a stopped trainer finishes its
    # step, then saves): only a step begun after the fault shows that training goes on.
    return record["time"] - record["step_time_ms"] / 1000 >= moment


def recovery_s(fault: dict[str, Any], runs: list[Run]) -> float | None:
    """From the fault to the next step begun and completed after it, in its run or a later one;
    None if no step came."""
    later = [r["time"] for run in runs[fault["run"]:] for r in run["seen"] if _begun_after(r, fault["time"])]
    return min(later) - fault["time"] if later else None


def regained_s(fault: dict[str, Any], runs: list[Run]) -> float | None:
    """From the fault until its run trains a step past the furthest it had reached when the fault
    struck (recomputed steps included); None if the run never did (it failed)."""
    seen = runs[fault["run"]]["seen"]
    reached = max((r["step"] for r in seen if r["time"] <= fault["time"]), default=0)
    past = [r["time"] for r in seen if r["step"] > reached and _begun_after(r, fault["time"])]
    return min(past) - fault["time"] if past else None


def stall_s(fault: dict[str, Any], faults: list[dict[str, Any]], runs: list[Run]) -> float | None:
    """The longest wait for a step in the struck run, from the fault until the next fault: how long
    training stood still for it. A job that Slurm ends only after a while (a node's lost slurmd)
    trains on meanwhile, so the stall comes later than the next step; None if no step came."""
    until = min((f["time"] for f in faults if f["time"] > fault["time"]), default=float("inf"))
    ends = sorted(r["time"] for r in runs[fault["run"]]["seen"] if fault["time"] < r["time"] <= until)
    if not ends:
        return None
    moments = [fault["time"], *ends]
    return max(later - earlier for earlier, later in zip(moments, moments[1:]))


def data_parallel_sizes(run: Run) -> list[int]:
    """The data-parallel sizes the run trained with, in order: its first, then each resume's that
    changed it (a run that lost a node may resume on fewer ranks). Recorded since the soak kept the
    trainer's resume events; a record without them says only the first."""
    sizes = [run.get("data_parallel", 0)]
    for resume in run.get("resumed", []):
        if resume["data_parallel"] != sizes[-1]:
            sizes.append(resume["data_parallel"])
    return sizes


# A run that resumed on fewer ranks sums the same samples' gradients in another order (each rank
# accumulates more micro-batches, the mean is over fewer ranks): its losses differ from the
# uninterrupted run's by float rounding, within what the trainer's own shrink test allows
# (tests/test_train_loop.py), never bit for bit.
RESHARDED_LOSS_TOLERANCE = 1e-5


def loss_difference(run: Run, baseline: Run) -> float | None:
    """The largest difference of a step's loss from the baseline's; None unless both streams hold
    the same steps."""
    mine = {r["step"]: r["loss"] for r in run["final"]}
    theirs = {r["step"]: r["loss"] for r in baseline["final"]}
    if set(mine) != set(theirs) or not mine:
        return None
    return max(abs(mine[step] - theirs[step]) for step in theirs)


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} (max {max(values):.1f})"


def table(record: dict[str, Any]) -> str:
    """The soak's result as Markdown tables: the totals, each fault kind, each flow run."""
    runs, baseline, steps = record["runs"], record["baseline"], record["steps"]
    soak = goodput(runs, record["started"], record["ended"])
    base = goodput([baseline], baseline["started"], baseline["ended"])
    counts = [step_counts(run, steps) for run in runs]
    completed = [run for run in runs if run["state"] == "Completed"]
    whole = [run for run in completed if len(data_parallel_sizes(run)) == 1]
    equal = [run for run in whole if loss_difference(run, baseline) == 0.0]
    resharded = [run for run in completed if len(data_parallel_sizes(run)) > 1]
    close = [run for run in resharded if (d := loss_difference(run, baseline)) is not None
             and d <= RESHARDED_LOSS_TOLERANCE]
    lines = [
        "| | soak | uninterrupted run |",
        "|---|---|---|",
        f"| wall time | {(record['ended'] - record['started']) / 60:.1f} min | "
        f"{(baseline['ended'] - baseline['started']) / 60:.1f} min |",
        f"| flow runs | {len(runs)}, {len(completed)} Completed | 1, {baseline['state']} |",
        f"| faults | {len(record['faults'])} | 0 |",
        f"| useful step time | {sum(useful_seconds(r) for r in runs) / 60:.1f} min | "
        f"{useful_seconds(baseline) / 60:.1f} min |",
        f"| **goodput** | **{soak:.0%}** ({soak / base:.2f}x the uninterrupted run's) | {base:.0%} |",
        f"| steps lost / recomputed / duplicated | {sum(c.lost for c in counts)} / "
        f"{sum(c.recomputed for c in counts)} / {sum(c.duplicated for c in counts)} | "
        f"{'{0.lost} / {0.recomputed} / {0.duplicated}'.format(step_counts(baseline, steps))} |",
        f"| Completed runs on all their ranks whose loss equals the uninterrupted run's at every step | "
        f"{len(equal)} of {len(whole)} | |",
        f"| Completed runs that resumed on fewer ranks, within {RESHARDED_LOSS_TOLERANCE:g} of its loss | "
        f"{len(close)} of {len(resharded)} | |",
        "",
        "| fault | struck | next step after (s) | longest stall after it (s) | back past the step reached (s) "
        "| runs it ended |",
        "|---|---|---|---|---|---|",
    ]
    for kind in sorted({f["kind"] for f in record["faults"]}):
        faults = [f for f in record["faults"] if f["kind"] == kind]
        recovered = [s for f in faults if (s := recovery_s(f, runs)) is not None]
        stalled = [s for f in faults if (s := stall_s(f, record["faults"], runs)) is not None]
        back = [(f, regained_s(f, runs)) for f in faults]
        regained = [s for _, s in back if s is not None]
        ended = sum(1 for f, s in back if s is None and runs[f["run"]]["state"] != "Completed")
        lines.append(f"| {kind} | {len(faults)} | {_seconds(recovered)} | {_seconds(stalled)} | {_seconds(regained)} "
                     f"| {ended} |")
    lines += ["", "| run | state | faults | data parallel | steps | recomputed | lost | duplicated "
              "| max loss difference |", "|---|---|---|---|---|---|---|---|---|"]
    for i, (run, count) in enumerate(zip(runs, counts)):
        struck = ", ".join(f["kind"] for f in record["faults"] if f["run"] == i) or "-"
        difference = loss_difference(run, baseline)
        sizes = " -> ".join(str(n) for n in data_parallel_sizes(run)) if run.get("data_parallel") else "-"
        lines.append(f"| {i + 1} | {run['state']} | {struck} | {sizes} | {count.completed} | {count.recomputed} | "
                     f"{count.lost} | {count.duplicated} | {'-' if difference is None else f'{difference:.3g}'} |")
    return "\n".join(lines)
