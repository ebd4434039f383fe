"""The train stage's artifacts as text: a loss curve (mermaid chart, PNG, table rows) and the run
summary, from the metrics stream of ``pretrain.log_parsers`` (``{"step", "loss", "val_loss", ...}``).

Pure functions: the Prefect side (``tasks/train_artifacts.py``) only publishes what these return.

A loss curve is evidence of a run's health, so reducing it must not hide what went wrong: the
downsampling keeps each step range's extremes, and a NaN or infinite loss is always either kept
as a row or counted in the text next to the chart.
"""

from __future__ import annotations

import base64
import io
import math
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypedDict

import numpy as np
import yaml
from matplotlib.figure import Figure

TABLE_COLUMNS = ("step", "loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu_pct")
# Significant digits of the points table's float columns: a loss to a thousandth in the usual 1-10
# range (as the summary line prints it), not the 17 digits of a float32 widened to a Python float.
TABLE_DIGITS = {"loss": 4, "val_loss": 4, "lr": 4, "grad_norm": 4, "tokens_per_s": 4, "mfu_pct": 3}
PACKAGES = ("torch", "transformers", "megatron-core", "prefect", "submitit")

# Mermaid places a line's values evenly along a numeric x axis, so the chart is drawn on an even
# grid of steps; 100 positions fill the UI's 700 px wide chart without turning noise into a smear.
CHART_POSITIONS = 100
# Two points (lowest and highest loss) per pixel column of the PNG keep its raster faithful.
PNG_WIDTH_PX = 640
PNG_POINTS = 2 * PNG_WIDTH_PX
# Matplotlib's default colours, so the mermaid chart and the PNG agree (mermaid's default
# palette on the UI's theme starts with a pale yellow that is hard to see).
TRAIN_COLOUR, VAL_COLOUR = "#1f77b4", "#ff7f0e"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _has(point: dict, key: str) -> bool:
    """The point reports ``key``, possibly as NaN or inf: a reported NaN is data, not a gap."""
    return isinstance(point.get(key), (int, float))


def nonfinite_steps(points: list[dict]) -> list[int]:
    """Steps whose train loss was reported as NaN or infinite."""
    return [p["step"] for p in points if _has(p, "loss") and not _finite(p["loss"])]


def _by_step(points: list[dict]) -> list[dict]:
    return sorted(points, key=lambda p: p["step"])


def _lowest_loss(group: list[dict]) -> dict | None:
    finite = [p for p in group if _finite(p.get("loss"))]
    return min(finite, key=lambda p: p["loss"]) if finite else None


def _highest_loss(group: list[dict]) -> dict | None:
    # A NaN or inf ranks above every finite loss, so a bucket that diverged keeps that point.
    reported = [p for p in group if _has(p, "loss")]
    return max(reported, key=lambda p: (not _finite(p["loss"]), p["loss"] if _finite(p["loss"]) else 0.0),
               default=None)


def _last_validation(group: list[dict]) -> dict | None:
    return next((p for p in reversed(group) if _has(p, "val_loss")), None)


def downsample(points: list[dict], max_points: int = 200) -> list[dict]:
    """At most ``max_points`` of ``points``, in step order: the first and the last point, and per
    equal step range the points with the lowest and the highest loss, plus the last validation.

    Extremes rather than a mean per range: a mean divides a one-step spike by the range's length
    (at 100k steps and 200 points, a 10x spike moves its range's mean by under 1 %), while the
    highest loss keeps it at its true height, NaN and inf ranking highest; the lowest loss keeps the
    curve's floor, so the pair draws the band the noise spans. Every kept point is a real logged
    step, so its lr, grad_norm and throughput belong to that step. Points with a validation loss
    are sparse and are all kept while they fit in a third of ``max_points``; beyond that, the last
    one per range.
    """
    if max_points < 5:
        raise ValueError(f"max_points={max_points}: need at least 5 (first, last, and one range's points)")
    ordered = _by_step(points)
    if len(ordered) <= max_points:
        return ordered
    first, last = ordered[0], ordered[-1]
    evaluations = sum(_has(p, "val_loss") for p in ordered[1:-1])
    every_evaluation = evaluations <= (max_points - 2) // 3
    ranges = (max_points - 2 - evaluations) // 2 if every_evaluation else (max_points - 2) // 3
    span = last["step"] - first["step"]
    groups: list[list[dict]] = [[] for _ in range(ranges)]
    for point in ordered[1:-1]:
        index = int((point["step"] - first["step"]) * ranges // span) if span else 0
        groups[min(index, ranges - 1)].append(point)
    kept = [first]
    for group in groups:
        evaluated = ([p for p in group if _has(p, "val_loss")] if every_evaluation
                     else [_last_validation(group)])
        chosen = {id(p): p for p in (_lowest_loss(group), _highest_loss(group), *evaluated) if p}
        kept += _by_step(list(chosen.values()))
    kept.append(last)
    return kept


def _series(points: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    finite = [p for p in points if _finite(p.get(key))]
    return (np.array([p["step"] for p in finite], dtype=float),
            np.array([p[key] for p in finite], dtype=float))


def _decimals(span: float) -> int:
    """Enough decimals to resolve about a thousandth of ``span``; mermaid reads no exponents."""
    return min(12, max(0, 3 - math.floor(math.log10(span))))


def axis_number(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def axis_range(values: np.ndarray) -> tuple[float, float, int]:
    """The data's range with a 5 % margin, never below zero for a non-negative loss."""
    low, high = float(values.min()), float(values.max())
    margin = (high - low) * 0.05 or abs(high) * 0.1 or 1.0
    decimals = _decimals(high - low + 2 * margin)
    scale = 10**decimals
    bottom = math.floor((low - margin) * scale) / scale
    if low >= 0:
        bottom = max(0.0, bottom)
    return bottom, math.ceil((high + margin) * scale) / scale, decimals


def _grid_max(steps: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The highest value among the points nearest to each grid position; positions no point is
    nearest to are joined by straight lines (mermaid has no gaps in a line)."""
    if len(grid) == 1:
        return np.array([values.max()])
    cell = np.rint((steps - grid[0]) / (grid[-1] - grid[0]) * (len(grid) - 1)).astype(int)
    highest = np.full(len(grid), -np.inf)
    np.maximum.at(highest, cell, values)
    filled = np.isfinite(highest)
    return np.interp(grid, grid[filled], highest[filled])


def mermaid_text(text: str) -> str:
    # A mermaid string ends at the next double quote and at the end of the line.
    return " ".join(text.replace('"', "'").split())


def mermaid_chart(points: list[dict], title: str) -> str:
    """A mermaid ``xychart-beta`` of train loss against step, with validation loss as a second
    line on the same axis when the stream has any; "" when there is no finite loss to draw.

    The x axis is the numeric step range, and each line holds one value per position of an even
    grid of steps over it (mermaid spaces a line's values evenly): the train line the highest
    loss nearest each position, so spikes keep their height; the validation line its
    evaluations joined by straight lines and held flat beyond the first and last. NaN and inf
    losses cannot be drawn: the title counts them.
    """
    ordered = _by_step(points)
    train_steps, train = _series(ordered, "loss")
    val_steps, val = _series(ordered, "val_loss")
    if not len(train) and not len(val):
        return ""
    steps = np.unique(np.concatenate([train_steps, val_steps]))
    grid = np.linspace(steps[0], steps[-1], min(CHART_POSITIONS, len(steps)))
    lines = []
    if len(train):
        lines.append((TRAIN_COLOUR, _grid_max(train_steps, train, grid)))
    if len(val):
        lines.append((VAL_COLOUR, np.interp(grid, val_steps, val)))
    bottom, top, decimals = axis_range(np.concatenate([values for _, values in lines]))
    skipped = len(nonfinite_steps(points))
    if skipped:
        title = f"{title} ({skipped} non-finite losses not drawn)"
    # One position cannot span a numeric range, so a single step is a one-category axis.
    x_axis = f'["{int(grid[0])}"]' if len(grid) == 1 else f"{int(grid[0])} --> {int(grid[-1])}"
    return "\n".join([
        "---",
        "config:",
        "  themeVariables:",
        "    xyChart:",
        f'      plotColorPalette: "{", ".join(colour for colour, _ in lines)}"',
        "---",
        "xychart-beta",
        f'    title "{mermaid_text(title)}"',
        f'    x-axis "step" {x_axis}',
        f'    y-axis "loss" {axis_number(bottom, decimals)} --> {axis_number(top, decimals)}',
        *(f"    line [{', '.join(axis_number(v, decimals) for v in values)}]" for _, values in lines),
    ])


def png_data_uri(points: list[dict], title: str) -> str:
    """A PNG of train and validation loss against step as a ``data:`` URI (tens of KB), drawn
    with matplotlib's Agg canvas (``Figure`` without pyplot: no display, no global state).

    NaN and inf losses are marked by red vertical lines at their steps; when a spike lies orders
    of magnitude above the rest, the loss axis is logarithmic so the curve stays readable.
    """
    figure = Figure(figsize=(PNG_WIDTH_PX / 100, 3.2), dpi=100)
    axes = figure.subplots()
    shown = downsample(points, PNG_POINTS)
    train_steps, train = _series(shown, "loss")
    val_steps, val = _series(shown, "val_loss")
    if len(train):
        axes.plot(train_steps, train, color=TRAIN_COLOUR, linewidth=1, label="train loss")
    if len(val):
        axes.plot(val_steps, val, color=VAL_COLOUR, linewidth=1.5, marker="o", markersize=3,
                  label="validation loss")
    diverged = nonfinite_steps(points)
    for i, step in enumerate(nonfinite_steps(shown)):
        axes.axvline(step, color="red", alpha=0.5, linewidth=1,
                     label=f"non-finite loss ({len(diverged)})" if i == 0 else None)
    finite = np.concatenate([train, val])
    if len(finite) and finite.min() > 0 and finite.max() / finite.min() > 100:
        axes.set_yscale("log")
    if not points:
        axes.text(0.5, 0.5, "no steps logged yet", ha="center", va="center", transform=axes.transAxes)
    elif axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper right", fontsize=8)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _summary_line(points: list[dict]) -> str:
    if not points:
        return "No training steps logged yet."
    ordered = _by_step(points)
    parts = [f"**steps** {ordered[0]['step']}–{ordered[-1]['step']} ({len(ordered)} logged)"]
    train = [p for p in ordered if _finite(p.get("loss"))]
    if train:
        lowest = min(train, key=lambda p: p["loss"])
        parts.append(f"**loss** first {_fmt(train[0]['loss'])}, last {_fmt(train[-1]['loss'])}, "
                     f"min {_fmt(lowest['loss'])} at step {lowest['step']}")
    val = [p for p in ordered if _finite(p.get("val_loss"))]
    if val:
        parts.append(f"**val loss** last {_fmt(val[-1]['val_loss'])} at step {val[-1]['step']} "
                     f"({len(val)} evaluations)")
    diverged = nonfinite_steps(ordered)
    if diverged:
        parts.append(f"**non-finite losses: {len(diverged)}**, the first at step {diverged[0]}")
    return " · ".join(parts)


def loss_curve_markdown(points: list[dict], title: str) -> str:
    """The loss-curve artifact, the picture first: the PNG, a one-line summary (steps,
    first/last/min loss, last validation loss, how many losses were NaN or infinite), then the
    mermaid chart with its caption.

    The PNG leads because every viewer shows it; the mermaid chart is a code block, which Prefect's
    UI draws inside a code block's frame and a viewer without mermaid shows as source text."""
    sections = [f"### {title}", f"![loss curve]({png_data_uri(points, title)})", _summary_line(points)]
    chart = mermaid_chart(points, title)
    if chart:
        caption = "train loss (blue): the highest per step range, so spikes keep their height"
        if any(_finite(p.get("val_loss")) for p in points):
            caption += ("; validation loss (orange): its evaluations joined by straight lines, held "
                        "flat before the first")
        sections += [f"```mermaid\n{chart}\n```", f"_{caption}_"]
    return "\n\n".join(sections)


def significant(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` significant digits (8.344268 -> 8.344 at 4)."""
    return float(f"{value:.{digits}g}")


def _cell(value: Any, digits: int | None) -> Any:
    # JSON has no NaN or inf (Prefect would store NaN as null, the same as a missing value, and
    # inf as invalid JSON), so they are kept visible as text.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, float) and digits is not None:
        return significant(value, digits)
    return value


def table_rows(points: list[dict], max_points: int = 200) -> list[dict]:
    """The downsampled points as table-artifact rows with the columns ``TABLE_COLUMNS``; a value
    the backend did not log is None, a NaN or inf loss the text "nan" / "inf".

    Floats are rounded to ``TABLE_DIGITS`` significant digits for reading (the stream's
    ``0.0024000000000000002`` is ``0.0024`` here); ``points`` and the metrics stream they come
    from keep full precision."""
    return [{column: _cell(p.get(column), TABLE_DIGITS.get(column)) for column in TABLE_COLUMNS}
            for p in downsample(points, max_points)]


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a run's numbers depend on; None where one is absent
    (megatron-core, say, on a native-backend head node)."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


class ClusterJob(TypedDict):
    stage: str
    job_id: str
    """Slurm's job id; a Kubernetes job's ``namespace/name``."""
    nodes: str
    """The nodes as the scheduler names them: Slurm's node list, compressed as Slurm writes it
    (``node-[1-4]``: its NodeNames, which the compile table's nodes also use and the host names
    may differ from; the host name under the local executor), or the Kubernetes nodes of the
    job's pods, comma-separated."""
    outcome: str
    """How the job ended: the train stage's attempt outcome where there is one, else the
    scheduler's (``completed``, ``FAILED with exit code 1:0``); "" while the job may still run."""


class RunSummary(TypedDict):
    """What the run-summary artifact reports; every key is required, None where unknown.

    - ``spec``: the resolved spec, JSON-compatible (``PretrainSpec.model_dump(mode="json")``).
    - ``outcome``: "completed", or "failed: " and the reason (the summary of a failed run shows
      how far it got: its jobs, stage durations and whatever it measured).
    - ``code_version``: ``pretrain.manifest.code_version()`` (``git:<sha>``).
    - ``packages``: ``package_versions()``.
    - ``jobs``: one ``ClusterJob`` per job of the run (Slurm's or Kubernetes'), in submission order.
    - ``stage_seconds``: wall-clock seconds per stage (``{"tokenize": 812.4, "train": ...}``).
    - ``final_step``: the last step logged.
    - ``tokens_per_s``, ``step_time_ms``, ``mfu_pct``: median over the logged steps after the
      first (see ``metrics_summary``); None where the backend does not report one (MFU from
      Megatron-LM and NxDT, step time from torchtitan and NxDT).
    - ``final_loss``, ``final_val_loss``: the last finite train and validation losses.
    - ``device_util_pct``, ``device_memory_gib``: mean device utilization over the nodes and
      samples, and the peak memory of any device (``DeviceSamples.figures``).
    - ``compile_graphs``: per stage that compiles (precompile, train) and node, the graphs it
      compiled and those its cache served (None where the compiler's cache is not counted);
      training should compile 0 after a precompile that covered it.
    """

    spec: dict[str, Any]
    outcome: str
    code_version: str
    packages: dict[str, str | None]
    jobs: list[ClusterJob]
    stage_seconds: dict[str, float]
    final_step: int | None
    tokens_per_s: float | None
    step_time_ms: float | None
    mfu_pct: float | None
    final_loss: float | None
    final_val_loss: float | None
    device_util_pct: float | None
    device_memory_gib: float | None
    compile_graphs: list[dict[str, Any]]


def _median_after_first(points: list[dict], key: str) -> float | None:
    # Step 1 includes compilation and warm-up, so it would drag the steady-state rate down.
    steady = points[1:] or points
    values = [p[key] for p in steady if _finite(p.get(key))]
    return float(np.median(values)) if values else None


def _last_finite(points: list[dict], key: str) -> float | None:
    return next((float(p[key]) for p in reversed(points) if _finite(p.get(key))), None)


def tokens_per_s(point: dict, seq_length: int | None = None, world_size: int | None = None) -> float | None:
    """A step's throughput in tokens/s over all devices, from the form its backend prints it in:

    - tokens/s itself (the native trainer);
    - tokens/s per device (torchtitan's ``tps``: the tokens of a data-parallel rank's batches
      over the interval's time and the ranks sharing them, tp x pp x cp, so the world size times
      it; ``log`` in pytorch/torchtitan torchtitan/components/metrics.py);
    - sequences/s (NxDT's ``throughput``: global batches over a window's time, ``Throughput`` in
      aws-neuron/neuronx-distributed-training src/neuronx_distributed_training/utils/utils.py;
      the NxD examples' ``seq/s``) times the sequence length;
    - the global batch it printed over the step time (Megatron-LM's iteration line, which prints
      neither rate).

    None when the step prints none of them, or without the count the form needs."""
    if _finite(rate := point.get("tokens_per_s")):
        return float(rate)
    if world_size and _finite(rate := point.get("tokens_per_s_per_device")):
        return rate * world_size
    if seq_length and _finite(rate := point.get("throughput_seq_s")):
        return rate * seq_length
    batch, step_ms = point.get("global_batch_size"), point.get("step_time_ms")
    if seq_length and _finite(batch) and _finite(step_ms) and step_ms > 0:
        return batch * seq_length / (step_ms / 1000)
    return None


def metrics_summary(points: list[dict], seq_length: int | None = None,
                    world_size: int | None = None) -> dict[str, Any]:
    """The ``RunSummary`` fields that come from the metrics stream: ``final_step``,
    ``tokens_per_s`` (each step's by :func:`tokens_per_s`, given the spec's ``seq_length`` and
    ``world_size``), ``step_time_ms``, ``mfu_pct``, ``final_loss``, ``final_val_loss``; None for
    what the stream does not report."""
    ordered = _by_step(points)
    rates = [{"step": p["step"], "tokens_per_s": tokens_per_s(p, seq_length, world_size)} for p in ordered]
    return {
        "final_step": ordered[-1]["step"] if ordered else None,
        "tokens_per_s": _median_after_first(rates, "tokens_per_s"),
        "step_time_ms": _median_after_first(ordered, "step_time_ms"),
        "mfu_pct": _median_after_first(ordered, "mfu_pct"),
        "final_loss": _last_finite(ordered, "loss"),
        "final_val_loss": _last_finite(ordered, "val_loss"),
    }


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _fmt_unit(value: float | None, unit: str, decimals: int) -> str:
    return "n/a" if value is None else f"{value:.{decimals}f} {unit}"


def _one_line(text: str) -> str:
    """``text`` as one markdown table cell: its first line, no column separators."""
    return (text.splitlines() or [""])[0].replace("|", "/")


def _count(value: int | None) -> str:
    return "not counted" if value is None else str(value)


def run_summary_markdown(summary: RunSummary) -> str:
    """The run-summary artifact: results first, then where they came from (jobs, stage times,
    code and package versions, the resolved spec as YAML)."""
    missing = sorted(RunSummary.__required_keys__ - summary.keys())
    if missing:
        raise ValueError(f"run summary lacks {', '.join(missing)}; RunSummary lists every key")
    tokens, mfu, step = summary["tokens_per_s"], summary["mfu_pct"], summary["final_step"]
    step_ms = summary["step_time_ms"]
    lines = [
        f"### Run summary: {summary['spec'].get('name', 'unnamed spec')}",
        "| result | value |",
        "|---|---|",
        f"| outcome | {_one_line(summary['outcome'])} |",
        f"| final train loss | {_fmt(summary['final_loss'])}{'' if step is None else f' (step {step})'} |",
        f"| final validation loss | {_fmt(summary['final_val_loss'])} |",
        f"| tokens/s | {'n/a' if tokens is None else f'{tokens:,.0f}'} |",
        f"| step time | {'n/a' if step_ms is None else f'{step_ms:,.1f} ms'} |",
        f"| MFU | {'n/a' if mfu is None else f'{mfu:.1f} %'} |",
        f"| mean device utilization | {_fmt_unit(summary['device_util_pct'], '%', 1)} |",
        f"| peak device memory | {_fmt_unit(summary['device_memory_gib'], 'GiB', 2)} |",
        f"| code version | `{summary['code_version']}` |",
        "",
        "#### Jobs",
        "_nodes as the scheduler names them (Slurm's NodeName, as --nodelist takes them; a Kubernetes "
        "node's name); host names may differ_",
        "",
        "| stage | job id | nodes | outcome |",
        "|---|---|---|---|",
        *(f"| {j['stage']} | {j['job_id']} | {j['nodes']} | {_one_line(j['outcome'])} |" for j in summary["jobs"]),
        "",
        "#### Compiled graphs",
        "| stage | node | compiled | from cache |",
        "|---|---|---|---|",
        *(f"| {row['stage']} | {row['node']} | {_count(row['compiled'])} | {_count(row['from cache'])} |"
          for row in summary["compile_graphs"]),
        *([] if summary["compile_graphs"] else ["| nothing compiled ahead (no torch.compile, no Neuron) | | | |"]),
        "",
        "#### Stage durations",
        "| stage | seconds | h:mm:ss |",
        "|---|---|---|",
        *(f"| {stage} | {seconds:.1f} | {_duration(seconds)} |" for stage, seconds in summary["stage_seconds"].items()),
        "",
        "#### Packages",
        "| package | version |",
        "|---|---|",
        *(f"| {name} | {v or 'not installed'} |" for name, v in summary["packages"].items()),
        "",
        "#### Resolved spec",
        "```yaml",
        yaml.safe_dump(summary["spec"], sort_keys=False).rstrip(),
        "```",
    ]
    return "\n".join(lines)
