"""The nightly benchmark's records: what one run measured, where the records are kept, and the
verdict against a rolling baseline of earlier passing runs.

A record is a JSON file per run under ``<history>/<spec name>/`` on the shared filesystem or in
S3 (any fsspec URL), so the history outlives the Prefect database. Runs compare only with runs
of the same benchmark configuration (the spec without its paths), and only passing runs form the
baseline, so one bad night does not become the new normal; an intended change (a slower but
better model, a new machine) is accepted by one run started with ``new_baseline``.
"""

from __future__ import annotations

import json
import math
import posixpath
import statistics
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
import numpy as np

from pretrain import manifest
from pretrain.loss_curve import axis_number, axis_range, mermaid_text
from pretrain.spec import PretrainSpec


@dataclass(frozen=True)
class Rule:
    """When a metric counts as regressed: worse than the baseline by more than ``relative``
    (a fraction of the baseline) and by more than ``absolute`` (in the metric's unit)."""

    higher_is_better: bool
    relative: float
    absolute: float = 0.0
    unit: str = ""


RULES: dict[str, Rule] = {
    "tokens_per_s": Rule(higher_is_better=True, relative=0.10, unit="tokens/s"),
    "step_time_ms": Rule(higher_is_better=False, relative=0.10, unit="ms"),
    "mfu_pct": Rule(higher_is_better=True, relative=0.05, unit="%"),
    # Mean device utilization from the device sampler: idle devices (input stalls, stragglers)
    # show here even where MFU is unknown (a CPU, a device without a peak figure).
    "device_util_pct": Rule(higher_is_better=True, relative=0.05, absolute=2.0, unit="%"),
    # Fixed seeds and data: the loss at the last step moves only when the numerics change.
    "final_loss": Rule(higher_is_better=False, relative=0.02),
    # Graphs the training run compiled although precompile ran: the cache stopped covering it.
    "graphs_compiled_in_training": Rule(higher_is_better=False, relative=0.0, absolute=0.5, unit="graphs"),
    # The same code traces the same graphs whether the cache is warm or not (so the counts of
    # graphs compiled and served from the cache are not compared): a new graph break splits a
    # graph that was whole, and a graph that fails to compile runs uncompiled or not at all.
    "graph_breaks": Rule(higher_is_better=False, relative=0.0, absolute=0.5, unit="breaks"),
    "graphs_failed_in_precompile": Rule(higher_is_better=False, relative=0.0, absolute=0.5, unit="graphs"),
}
# Stage durations: queueing and cached stages make short ones noisy, hence the absolute floor.
STAGE_RULE = Rule(higher_is_better=False, relative=0.25, absolute=20.0, unit="s")
STAGE_PREFIX = "stage_s:"


def rule_for(metric: str, thresholds: dict[str, float] | None = None) -> Rule:
    """The rule of ``metric``, with its relative threshold replaced by ``thresholds[metric]``
    (``thresholds["stage_s"]`` covers every stage)."""
    base = STAGE_RULE if metric.startswith(STAGE_PREFIX) else RULES[metric]
    key = "stage_s" if metric.startswith(STAGE_PREFIX) else metric
    if thresholds and key in thresholds:
        return Rule(base.higher_is_better, float(thresholds[key]), base.absolute, base.unit)
    return base


def check_thresholds(thresholds: dict[str, float]) -> None:
    known = {*RULES, "stage_s"}
    for name, value in thresholds.items():
        if name not in known:
            raise ValueError(f"thresholds: unknown metric {name!r}; known: {', '.join(sorted(known))}")
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"thresholds.{name}={value!r}: give a fraction of the baseline >= 0, e.g. 0.1")


def benchmark_overrides(steps: int, spec: PretrainSpec) -> list[str]:
    """Benchmark mode as spec overrides, given after the user's (``spec`` is theirs): a fixed number
    of steps (not of samples) and no evaluation, which every backend's launch renders
    (``training.eval_batches``). Megatron-LM's warm-up and decay in samples go with the samples: a
    benchmark's few steps warm up none, as its throughput is what is judged."""
    overrides = ["training.benchmark=true", f"training.train_steps={steps}", "training.train_samples=null"]
    if spec.backend.megatron_lm:
        overrides += ["backend.megatron_lm.lr_warmup_samples=null", "backend.megatron_lm.lr_decay_samples=null"]
    return overrides


def config_fingerprint(spec: dict[str, Any]) -> str:
    """What makes two benchmark runs comparable: the resolved spec except where outputs go."""
    return manifest.stable_hash({k: v for k, v in spec.items() if k not in ("paths", "description")})[:16]


@dataclass
class BenchmarkRecord:
    spec_name: str
    fingerprint: str
    flow_run_id: str
    started: str  # UTC, ISO 8601
    code_version: str
    # What this run measured: a metric it did not measure is absent (None in older records;
    # values() passes over both).
    metrics: dict[str, float | None]
    graphs: dict[str, int] = field(default_factory=dict)
    passed: bool | None = None  # None until compared
    regressions: list[str] = field(default_factory=list)
    # Accepted as the start of a new baseline (after an intended change): later runs compare
    # with it and the runs after it only.
    starts_baseline: bool = False
    # Stages that handed on an earlier run's output (fetch, tokenize): their seconds measure a
    # cache lookup, so they are not recorded, and a baseline's fresh time is not theirs to meet.
    reused_stages: list[str] = field(default_factory=list)

    def values(self) -> dict[str, float]:
        """Every finite number this run can be compared on."""
        return {k: float(v) for k, v in self.metrics.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def reused_stages(outputs: dict[str, Any], started: str, cached: Iterable[str]) -> list[str]:
    """The ``cached`` stages (content-addressed, so a complete output is handed on: ``Stage.cached``
    in flows/stages.py) of ``outputs``, a pipeline run's started at ``started``, that handed on an
    earlier run's output. A backend without one of them (torchtitan tokenizes as it reads, only
    Megatron-LM builds an image) has nothing to hand on there. The MANIFEST.json is in the fetched
    directory itself, or beside the dataset prefix (or Arrow directory), the converted checkpoint
    and the squashfs that the others return."""
    directories = {stage: Path(outputs[stage]) if stage == "fetch" else Path(outputs[stage]).parent
                   for stage in cached if outputs.get(stage)}
    return [stage for stage, directory in directories.items() if manifest.created_before(directory, started)]


def record_from_run(spec: dict[str, Any], flow_run_id: str, train: dict[str, Any], stage_seconds: dict[str, float],
                    precompile: dict[str, Any] | None, reused: list[str] = ()) -> BenchmarkRecord:
    """One benchmark run's record from what every backend's stages return: the train stage's
    metrics summary and the graphs it compiled, the precompile stage's counts where the backend has
    one. ``reused``: the stages that handed on an earlier run's output.

    A metric the run did not measure is left out, never recorded as 0: MFU that Megatron-LM and
    NxDT do not print, the step time torchtitan and NxDT do not print, the graph breaks Neuron's
    compiler does not count. Runs of one configuration share a backend, so its baseline lacks
    the metric too and nothing is judged on it."""
    summary = train["metrics"]
    metrics: dict[str, float | None] = {name: summary.get(name) for name in
                                         ("tokens_per_s", "step_time_ms", "mfu_pct", "final_loss",
                                          "device_util_pct")}
    graphs = dict(precompile["graphs"]) if precompile else {}
    if precompile is not None:
        compiled = [row["compiled"] for row in train["compiled_during_training"]]
        # None: a compiler whose cache torch does not count (Neuron's); no number to compare.
        metrics["graphs_compiled_in_training"] = None if None in compiled else sum(compiled)
        metrics["graph_breaks"] = graphs.get("graph breaks")  # torch.compile's count; Neuron's has none
        metrics["graphs_failed_in_precompile"] = graphs.get("failed")
    metrics = {name: value for name, value in metrics.items() if value is not None}
    metrics.update({f"{STAGE_PREFIX}{stage}": seconds for stage, seconds in stage_seconds.items()
                    if stage not in reused})
    return BenchmarkRecord(spec_name=spec["name"], fingerprint=config_fingerprint(spec), flow_run_id=flow_run_id,
                           started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           code_version=manifest.code_version(), metrics=metrics, graphs=graphs,
                           reused_stages=sorted(reused))


@dataclass(frozen=True)
class Comparison:
    metric: str
    value: float | None  # None: this run did not measure a metric its baseline has
    baseline: float | None
    rule: Rule

    @property
    def change(self) -> float | None:
        """Relative change against the baseline; positive is worse."""
        if self.value is None or self.baseline is None or self.baseline == 0:
            return None
        delta = (self.value - self.baseline) / abs(self.baseline)
        return -delta if self.rule.higher_is_better else delta

    @property
    def regressed(self) -> bool:
        if self.baseline is None:
            return False
        if self.value is None:
            return True  # a metric that stopped being measured hides whatever it would show
        worse_by = (self.baseline - self.value) if self.rule.higher_is_better else (self.value - self.baseline)
        return worse_by > self.rule.absolute and worse_by > self.rule.relative * abs(self.baseline)

    def describe(self) -> str:
        unit = f" {self.rule.unit}" if self.rule.unit else ""
        change = f" ({self.change:+.1%} worse)" if self.change is not None else ""
        if self.value is None:
            return f"{self.metric}: not measured by this run, against a baseline of {self.baseline:,.4g}{unit}"
        return (f"{self.metric} {self.value:,.4g}{unit} against a baseline of {self.baseline:,.4g}{unit}{change}; "
                f"threshold {self.rule.relative:.0%}")


def baseline(history: list[BenchmarkRecord], window: int) -> tuple[dict[str, float], list[BenchmarkRecord]]:
    """The median of each metric over the last ``window`` passing runs since the newest run that
    started a baseline, and those runs."""
    start = max((i for i, r in enumerate(history) if r.starts_baseline), default=0)
    runs = [r for r in history[start:] if r.passed][-window:]
    per_metric: dict[str, list[float]] = {}
    for run in runs:
        for name, value in run.values().items():
            per_metric.setdefault(name, []).append(value)
    return {name: statistics.median(values) for name, values in per_metric.items()}, runs


def compare(record: BenchmarkRecord, base: dict[str, float],
            thresholds: dict[str, float] | None = None) -> list[Comparison]:
    """Every metric of ``record`` or of ``base`` that has a rule, against ``base``; a metric of the
    baseline that this run lacks compares as missing (a stage or a counter that vanished)."""
    values = record.values()
    reused = {f"{STAGE_PREFIX}{stage}" for stage in record.reused_stages}
    return [Comparison(name, values.get(name), base.get(name), rule_for(name, thresholds))
            for name in dict.fromkeys([*values, *base])
            if (name in RULES or name.startswith(STAGE_PREFIX)) and name not in reused]


class History:
    """Benchmark records under an fsspec URL: a directory on the shared filesystem or
    ``s3://bucket/prefix`` (``storage_options`` as s3fs takes them: endpoint, keys)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.url = url

    def _dir(self, spec_name: str) -> str:
        return posixpath.join(self.root, spec_name)

    def load(self, spec_name: str, fingerprint: str, other_than: str | None = None) -> list[BenchmarkRecord]:
        """Earlier records of this configuration, oldest first; unreadable files are skipped.
        ``other_than``: leave out this flow run's own record (written by an attempt of the task
        that a retry repeats), so that a run never joins its own baseline."""
        directory = self._dir(spec_name)
        if not self.fs.exists(directory):
            return []
        records = []
        for path in sorted(self.fs.glob(posixpath.join(directory, "*.json"))):
            try:
                record = BenchmarkRecord(**json.loads(self.fs.cat_file(path)))
            except (ValueError, TypeError):
                continue  # a foreign or damaged file must not stop the nightly run
            if record.fingerprint == fingerprint and record.flow_run_id != other_than:
                records.append(record)
        return sorted(records, key=lambda r: r.started)

    def check_writable(self, spec_name: str) -> None:
        """Write and remove a probe where this spec's records go, so that a wrong bucket, missing
        credentials or a read-only directory fail the run before the pipeline, not after it."""
        directory = self._dir(spec_name)
        probe = posixpath.join(directory, f".probe-{uuid.uuid4().hex}")
        try:
            if isinstance(self.fs, LocalFileSystem):
                self.fs.makedirs(directory, exist_ok=True)
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)
        except Exception as exc:  # fsspec backends raise their own types (botocore's, OSError, ...)
            raise PermissionError(f"the benchmark history at {self.url} cannot be written ({type(exc).__name__}: "
                                  f"{exc}); fix the location, its credentials or permissions") from None

    def append(self, record: BenchmarkRecord) -> str:
        """Write the record; a reader never sees half of it (rename on a filesystem, one PUT on S3)."""
        directory = self._dir(record.spec_name)
        name = f"{record.started.replace(':', '')}-{record.flow_run_id}.json"
        path = posixpath.join(directory, name)
        data = json.dumps(asdict(record), indent=2, sort_keys=True).encode()
        if isinstance(self.fs, LocalFileSystem):
            self.fs.makedirs(directory, exist_ok=True)
            tmp = posixpath.join(directory, f".{name}.tmp")
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        else:
            self.fs.pipe_file(path, data)
        return path


def comparison_rows(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    """The table artifact: this run against the baseline, regressions first."""
    rows = []
    for c in sorted(comparisons, key=lambda c: (not c.regressed, c.metric)):
        rows.append({"metric": c.metric, "this run": None if c.value is None else round(c.value, 4),
                     "baseline": None if c.baseline is None else round(c.baseline, 4),
                     "change (worse +)": None if c.change is None else f"{c.change:+.1%}",
                     "threshold": f"{c.rule.relative:.0%}" + (f" and {c.rule.absolute:g} {c.rule.unit}".rstrip()
                                                                if c.rule.absolute else ""),
                     "verdict": "REGRESSED" if c.regressed else ("no baseline" if c.baseline is None else "ok")})
    return rows


def trend_chart(records: list[BenchmarkRecord], metric: str = "tokens_per_s", last: int = 30) -> str:
    """A mermaid line chart of ``metric`` over the last runs (failed runs included: a trend shows
    them); "" when no run has the metric."""
    runs = [(r, r.values().get(metric)) for r in records[-last:]]
    runs = [(r, v) for r, v in runs if v is not None]
    if not runs:
        return ""
    values = np.array([v for _, v in runs])
    bottom, top, decimals = axis_range(values)
    # Minutes tell nightly runs apart; runs started within one minute (by hand) get their seconds.
    minutes = [r.started[5:16] for r, _ in runs]
    labels = ", ".join(f'"{mermaid_text((r.started[5:19] if minutes.count(m) > 1 else m).replace("T", " "))}"'
                       for (r, _), m in zip(runs, minutes))
    unit = RULES[metric].unit if metric in RULES else ""
    return "\n".join([
        "xychart-beta",
        f'    title "{mermaid_text(f"{records[-1].spec_name}: {metric} over the last {len(runs)} runs")}"',
        f"    x-axis [{labels}]",
        f'    y-axis "{mermaid_text(unit or metric)}" {axis_number(bottom, decimals)} --> {axis_number(top, decimals)}',
        f"    line [{', '.join(axis_number(v, decimals) for v in values)}]",
    ])
