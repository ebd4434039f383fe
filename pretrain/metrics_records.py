"""Reading the trainer's metrics stream (``metrics.jsonl``, trainer/train/metrics.py) while it
grows: the tests that inject faults and the chaos soak (benchmarks/chaos_soak.py) read it alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def metrics_records(path: Path) -> list[dict[str, Any]]:
    """Every whole line's record. Only the unfinished last line (no newline yet: the one the trainer
    is writing now) is left out; the trainer drops a killed writer's torn line when it resumes
    (``_keep_steps_up_to``), so an unreadable line before the last is damage, and named."""
    *whole, unfinished = path.read_text().split("\n")
    records = []
    for number, line in enumerate(whole, 1):
        try:
            records.append(json.loads(line))
        except ValueError as e:
            raise ValueError(f"{path}:{number}: not a JSON record ({e}): {line[:80]!r}") from None
    return records


def step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of training steps: not events, not evaluations."""
    return [r for r in records if "event" not in r and "loss" in r]


def logged_steps(records: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in step_records(records)]


def events(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == name]
