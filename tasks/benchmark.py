"""The nightly benchmark's record keeping: read the history, store this run's record, publish
the comparison and the trend. The numbers are judged in :mod:`pretrain.benchmark`."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from blocks.storage import StorageLocation
from pretrain.benchmark import (BenchmarkRecord, Comparison, History, baseline, compare, comparison_rows,
                                trend_chart)
from tasks.artifacts import artifact_key


def history_for(location: str | None, default_root: str) -> History:
    """The history at a StorageLocation block's URL, or ``<paths.root>/benchmarks``."""
    if location is None:
        return History(f"{default_root}/benchmarks")
    block = StorageLocation.load(location)
    return History(block.url, block.storage_options())


@task(name="judge-benchmark", retries=2, retry_delay_seconds=10)
def judge(record: BenchmarkRecord, location: str | None, default_root: str, window: int,
          thresholds: dict[str, float] | None, new_baseline: bool = False) -> list[Comparison]:
    """Compare ``record`` with the median of the last ``window`` passing runs, store it with its
    verdict, and publish this run against the baseline (table) and the trend (chart).
    ``new_baseline``: the run passes whatever it measured and later runs compare with it."""
    history = history_for(location, default_root)
    earlier = history.load(record.spec_name, record.fingerprint, other_than=record.flow_run_id)
    base, base_runs = baseline(earlier, window)
    comparisons = compare(record, base, thresholds)
    record.starts_baseline = new_baseline
    record.regressions = [] if new_baseline else [c.metric for c in comparisons if c.regressed]
    record.passed = not record.regressions
    path = history.append(record)
    verdict = ("accepted as a new baseline" if new_baseline
               else f"regressed: {', '.join(record.regressions)}" if record.regressions
               else "passed" if base_runs else "passed (first run of this configuration: it starts the baseline)")
    create_table_artifact(comparison_rows(comparisons), key=artifact_key(record.spec_name, "benchmark"),
                          description=f"this run against the median of {len(base_runs)} earlier passing run(s); "
                                      f"{verdict}; record {path}")
    runs = [*earlier, record]
    charts = [chart for metric in ("tokens_per_s", "step_time_ms", "final_loss")
              if (chart := trend_chart(runs, metric))]
    lines = [f"### {record.spec_name}: the last {min(len(runs), 30)} benchmark runs", "",
             *(f"```mermaid\n{chart}\n```\n" for chart in charts),
             "| started (UTC) | tokens/s | step ms | final loss | verdict | code |", "|---|---|---|---|---|---|"]
    for run in reversed(runs[-30:]):
        values = run.values()
        lines.append(f"| {run.started} | {_cell(values.get('tokens_per_s'), ',.0f')} | "
                     f"{_cell(values.get('step_time_ms'), '.1f')} | {_cell(values.get('final_loss'), '.4f')} | "
                     f"{_verdict(run)} | "
                     f"`{run.code_version[:16]}` |")
    create_markdown_artifact("\n".join(lines), key=artifact_key(record.spec_name, "benchmark-trend"),
                             description=f"trend of the last runs; history in {history.url}")
    return comparisons


def _verdict(run: BenchmarkRecord) -> str:
    if run.starts_baseline:
        return "new baseline"
    return "passed" if run.passed else "regressed: " + ", ".join(run.regressions)


def _cell(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)
