"""Helpers every stage task shares: artifact keys that are stable per spec and stage, so the
Prefect UI keeps each one's history; the retry condition; the rows of the compile-graph tables
that precompile and train publish."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pydantic


def artifact_key(spec_name: str, stage: str) -> str:
    """Prefect allows only lowercase letters, digits and dashes in a key."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{spec_name}-{stage}".lower()).strip("-")
    return slug or stage


def retryable(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn`` of every stage task: whether another attempt can end otherwise.

    Not the error's type decides but what it says of itself, through its causes: the first
    ``retryable`` attribute found (bad input, a missing earlier output, a cluster that lacks nodes
    or a tool, a job Slurm will never start, a refused sbatch: see jobs/slurm.py) and a spec that
    fails validation. Anything else (a node that died, a dropped connection) is retried."""
    exc = state.result(raise_on_failure=False)
    while exc is not None:
        if hasattr(exc, "retryable"):
            return bool(exc.retryable)
        if isinstance(exc, pydantic.ValidationError):
            return False
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return True


def native_compile_rows(record_path: Path) -> list[dict]:
    """One row per node from the trainer's per-node compile records (``<record>.compile-<host>.json``)."""
    rows = []
    for path in sorted(record_path.parent.glob(f"{record_path.name}.compile-*.json")):
        counts = json.loads(path.read_text())
        # A failed compilation fails the run, and the job: its node is a row with failed=1 then.
        rows.append({"node": counts["node"], "graphs traced": counts["graphs"],
                     "graph breaks": counts["graph_breaks"], "compiled": counts["cache_misses"],
                     "from cache": counts["cache_hits"], "failed": 0})
    return rows


def graph_totals(rows: list[dict]) -> dict[str, int | None]:
    """Column sums over the nodes; None where a backend does not count (Neuron's cache)."""
    return {k: None if any(r[k] is None for r in rows) else sum(r[k] for r in rows)
            for k in ("graphs traced", "graph breaks", "compiled", "from cache", "failed")}
