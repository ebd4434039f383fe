"""The train stage's artifacts: downsampling that keeps spikes, a mermaid chart that mermaid itself
parses and draws, a PNG that decodes, the run summary, and publishing through the Prefect API
(one live artifact per flow run, one version per run under the key)."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from PIL import Image
from prefect import flow, get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

from pretrain import loss_curve
from pretrain.log_parsers import parse_log
from pretrain.loss_curve import (
    RunSummary, downsample, loss_curve_markdown, mermaid_chart, metrics_summary, package_versions, png_data_uri,
    run_summary_markdown, table_rows,
)
from tasks.artifacts import artifact_key
from tasks.train_artifacts import publish_loss_curve, publish_progress, publish_run_summary


def native_log(steps: range, every_eval: int = 0) -> str:
    """A native-trainer metrics log: a decaying loss with deterministic noise."""
    lines = []
    for step in steps:
        record = {"step": step, "loss": 2.0 + 8.0 * math.exp(-step / 300) + 0.05 * math.sin(step * 1.7),
                  "lr": 3e-4, "grad_norm": 1.0, "tokens_per_s": 1000.0 + step % 7, "step_time_ms": 500.0 + step % 3, "mfu_pct": 40.0}
        if every_eval and step % every_eval == 0:
            record["val_loss"] = 2.2 + 8.0 * math.exp(-step / 300)
        lines.append(json.dumps(record))
    return "\n".join(lines)


def points_of(steps: range, every_eval: int = 0) -> list[dict]:
    return parse_log(native_log(steps, every_eval)).as_list()


def chart_lines(chart: str) -> dict[str, str]:
    """The xychart statements by keyword; the line statements as line0, line1, ..."""
    body = chart.split("xychart-beta\n", 1)[1].splitlines()
    statements = {}
    for number, line in enumerate(s.strip() for s in body if s.strip().startswith("line ")):
        statements[f"line{number}"] = line
    for line in body:
        keyword = line.strip().split(" ", 1)[0]
        if keyword != "line":
            statements[keyword] = line.strip()
    return statements


def line_values(statement: str) -> list[float]:
    return [float(v) for v in re.fullmatch(r"line \[(.*)\]", statement).group(1).split(", ")]


def y_range(statement: str) -> tuple[float, float]:
    low, high = re.fullmatch(r'y-axis "loss" (\S+) --> (\S+)', statement).groups()
    return float(low), float(high)


# --- downsampling ---------------------------------------------------------------------------

def test_downsample_keeps_first_and_last_bounded_and_spread_by_step():
    points = points_of(range(1, 10_001))
    kept = downsample(points, 200)
    assert 150 <= len(kept) <= 200
    assert kept[0] is points[0] and kept[-1] is points[-1]
    steps = [p["step"] for p in kept]
    assert steps == sorted(steps)
    # every tenth of the step range is represented about equally
    per_tenth = [sum(1 for s in steps if lo < s <= lo + 1000) for lo in range(0, 10_000, 1000)]
    assert min(per_tenth) >= 15 and max(per_tenth) - min(per_tenth) <= 4
    assert downsample(points[:50], 200) == points[:50]


def test_downsample_keeps_a_spike_and_a_nan_at_their_values():
    points = points_of(range(1, 20_001))
    points[7_000]["loss"] = 1e6
    points[13_000]["loss"] = float("nan")
    points[13_001]["loss"] = float("inf")
    kept = downsample(points, 100)
    assert len(kept) <= 100
    assert any(p["loss"] == 1e6 and p["step"] == 7_001 for p in kept)
    # NaN and inf fall in the same step range; the range keeps one of them, never a finite stand-in
    diverged = [p for p in kept if not math.isfinite(p["loss"])]
    assert [p["step"] for p in diverged] in ([13_001], [13_002])
    # the curve's floor survives too: the lowest loss of the run is among the kept points
    assert min(p["loss"] for p in kept) == min(p["loss"] for p in points if math.isfinite(p["loss"]))


def test_downsample_keeps_evaluations_while_they_fit_and_one_per_range_beyond():
    sparse = downsample(points_of(range(1, 10_001), every_eval=250), 200)
    assert len(sparse) <= 200
    assert [p["step"] for p in sparse if "val_loss" in p] == list(range(250, 10_001, 250))
    dense = downsample(points_of(range(1, 10_001), every_eval=1), 200)
    assert len(dense) <= 200
    assert sum("val_loss" in p for p in dense) >= 60


def test_downsample_rejects_a_budget_without_room_for_a_range():
    with pytest.raises(ValueError, match="max_points=4"):
        downsample(points_of(range(1, 100)), 4)


# --- mermaid ---------------------------------------------------------------------------------

def test_mermaid_chart_axes_come_from_the_data():
    points = points_of(range(1001, 3001), every_eval=500)
    points[1500]["loss"] = 25.0
    points[1700]["loss"] = float("nan")
    chart = mermaid_chart(points, 'run "a"')
    statements = chart_lines(chart)
    assert chart.splitlines()[0] == "---" and "xychart-beta" in chart.splitlines()
    assert statements["title"] == "title \"run 'a' (1 non-finite losses not drawn)\""
    assert statements["x-axis"] == 'x-axis "step" 1001 --> 3000'
    train, val = line_values(statements["line0"]), line_values(statements["line1"])
    assert len(train) == len(val) == loss_curve.CHART_POSITIONS
    low, high = y_range(statements["y-axis"])
    data_low, data_high = min(train + val), max(train + val)
    assert low < data_low and high > data_high
    assert (data_high - data_low) / (high - low) > 0.85
    assert max(train) == 25.0  # the spike keeps its height
    # the first position (step 1001, positions 20.2 steps apart) shows the highest of steps 1001-1011
    assert train[0] == pytest.approx(max(p["loss"] for p in points[:11]), abs=0.005)
    assert val[-1] == pytest.approx(points[-1]["val_loss"], abs=0.005)
    assert 'plotColorPalette: "#1f77b4, #ff7f0e"' in chart
    assert not re.search(r"\d[eE]", statements["line0"] + statements["y-axis"])  # mermaid reads no exponents


def test_mermaid_chart_edge_cases():
    assert mermaid_chart([], "empty") == ""
    assert mermaid_chart([{"step": 5, "loss": float("nan")}], "diverged") == ""
    single = chart_lines(mermaid_chart([{"step": 7, "loss": 3.5}], "one"))
    assert single["x-axis"] == 'x-axis "step" ["7"]' and line_values(single["line0"]) == [3.5]
    low, high = y_range(single["y-axis"])
    assert low < 3.5 < high
    few = chart_lines(mermaid_chart([{"step": s, "loss": 4.0 - s / 10} for s in (10, 20, 40)], "few"))
    assert few["x-axis"] == 'x-axis "step" 10 --> 40'
    # three positions evenly over 10..40: 10, 25 and 40; the logged step 20 is the nearest to 25
    assert line_values(few["line0"]) == pytest.approx([3.0, 2.0, 0.0], abs=1e-3)
    assert y_range(few["y-axis"])[0] == 0.0  # a non-negative loss never gets a negative axis
    only_val = chart_lines(mermaid_chart([{"step": 1, "val_loss": 3.0}, {"step": 9, "val_loss": 2.0}], "val"))
    assert "line1" not in only_val and line_values(only_val["line0"]) == [3.0, 2.0]


RENDER_JS = r"""
import { createRequire } from "module";
import { readFileSync } from "fs";
import { pathToFileURL } from "url";
const modules = process.env.MERMAID_NODE_MODULES;
const { JSDOM } = createRequire(modules + "/")("jsdom");
const dom = new JSDOM("<!doctype html><html><body></body></html>", { pretendToBeVisual: true });
for (const name of ["window", "document", "navigator", "CSSStyleSheet", "SVGElement", "Element",
                    "HTMLElement", "DOMParser", "MutationObserver"]) {
  if (!(name in globalThis)) globalThis[name] = name === "window" ? dom.window : dom.window[name];
}
// jsdom does no layout: text gets a width from its length, enough for mermaid to place axes.
dom.window.SVGElement.prototype.getBBox = function () {
  return { x: 0, y: 0, width: 7 * (this.textContent || "").length, height: 14 };
};
const { default: mermaid } = await import(pathToFileURL(modules + "/mermaid/dist/mermaid.core.mjs").href);
// The Prefect UI's settings (ui-v2 lazy-markdown bundle).
mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "base" });
const results = [];
for (const [i, text] of JSON.parse(readFileSync(0, "utf8")).entries()) {
  try {
    await mermaid.parse(text);
    results.push({ svg: (await mermaid.render("chart" + i, text)).svg });
  } catch (e) {
    results.push({ error: String(e.message || e) });
  }
}
console.log(JSON.stringify(results));
"""


# The mermaid the Prefect UI bundles (prefect 3.8.8: the `info` diagram in
# prefect/server/ui-v2/assets/vendor-mermaid-*.js reports 12.0.0); the Makefile pins the same.
MERMAID_VERSION = "12.0.0"
# Where `make node-deps` (part of `make test`) installs mermaid and jsdom.
PROJECT_NODE_MODULES = Path(__file__).resolve().parents[1] / ".cache" / "node" / "node_modules"
NPM_INSTALL = f"npm install --prefix .cache/node --save-exact mermaid@{MERMAID_VERSION} jsdom@29.1.1"


@pytest.fixture(scope="module")
def render_mermaid(tmp_path_factory):
    """mermaid's own parser and renderer under node + jsdom, from a node_modules directory holding
    the mermaid the Prefect UI bundles (12.0.0) and jsdom: the project's ``.cache/node/node_modules``
    that ``make node-deps`` (run by ``make test``) fills, or ``MERMAID_NODE_MODULES``. Missing
    modules fail the tests rather than skip them: the chart must be checked by mermaid itself."""
    modules = Path(os.environ.get("MERMAID_NODE_MODULES") or PROJECT_NODE_MODULES)
    if not shutil.which("node"):
        pytest.fail("node is not on PATH: install Node.js (>= 20.19) and run `make node-deps` "
                    "to check the loss chart with mermaid itself")
    package = modules / "mermaid" / "package.json"
    if not (modules / "mermaid" / "dist" / "mermaid.core.mjs").exists() or not (modules / "jsdom").is_dir():
        pytest.fail(f"no mermaid and jsdom in {modules}: run `make node-deps` (or `make test`), i.e. "
                    f"`{NPM_INSTALL}`, or set MERMAID_NODE_MODULES to a node_modules holding them")
    installed = json.loads(package.read_text())["version"]
    if installed != MERMAID_VERSION:
        pytest.fail(f"{modules} has mermaid {installed}, the Prefect UI bundles {MERMAID_VERSION}: "
                    f"run `{NPM_INSTALL}` or `make node-deps`")
    script = tmp_path_factory.mktemp("mermaid") / "render.mjs"
    script.write_text(RENDER_JS)

    def render(charts: list[str]) -> list[dict]:
        done = subprocess.run(["node", str(script)], input=json.dumps(charts), capture_output=True, text=True,
                              timeout=120, env={**os.environ, "MERMAID_NODE_MODULES": str(modules)})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return render


def drawn_lines(svg: str) -> list[tuple[str, list[tuple[float, float]]]]:
    """(stroke colour, vertices) of each line mermaid drew."""
    lines = re.findall(r'<g class="line-plot-\d+"><path d="([^"]+)"[^>]*stroke="([^"]+)"', svg)
    return [(colour, [tuple(map(float, v.split(","))) for v in re.findall(r"[-\d.]+,[-\d.]+", path)])
            for path, colour in lines]


def test_mermaid_parses_and_draws_the_charts(render_mermaid):
    spiky = points_of(range(1, 5001), every_eval=1000)
    spiky[2500]["loss"] = 1e30
    spiky[2600]["loss"] = float("inf")
    charts = [mermaid_chart(points_of(range(1001, 3001), every_eval=500), "with validation"),
              mermaid_chart(spiky, 'spike and inf "quoted"'),
              mermaid_chart([{"step": 7, "loss": 3.5}], "single"),
              mermaid_chart([{"step": s, "loss": 4.0 - s / 10} for s in (10, 20, 40)], "few"),
              mermaid_chart(points_of(range(1, 30)), "short")]
    results = render_mermaid(charts)
    for chart, result in zip(charts, results):
        assert "error" not in result, f"{result.get('error')}\n{chart}"
        svg = result["svg"]
        axis = re.search(r'class="axisl-line"><path d="M [\d.]+,([\d.]+) L [\d.]+,([\d.]+)"', svg)
        top, bottom = float(axis.group(1)), float(axis.group(2))
        for colour, vertices in drawn_lines(svg):
            assert colour in (loss_curve.TRAIN_COLOUR, loss_curve.VAL_COLOUR)
            assert all(top - 1 <= y <= bottom + 1 for _, y in vertices), chart
    lines = [drawn_lines(r["svg"]) for r in results]
    assert [colour for colour, _ in lines[0]] == [loss_curve.TRAIN_COLOUR, loss_curve.VAL_COLOUR]
    assert [len(v) for _, v in lines[0]] == [loss_curve.CHART_POSITIONS] * 2
    assert len(lines[2]) == 1 and len(lines[2][0][1]) == 1
    assert [len(v) for _, v in lines[4]] == [29]


def test_mermaid_rejects_what_the_chart_must_avoid(render_mermaid):
    """The renderer really checks: an exponent and an empty chart both fail, so the tests above
    passing means something."""
    good = mermaid_chart([{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}], "t")
    results = render_mermaid([good.replace("line [3.000, 2.000]", "line [3.0e0, 2.0]"),
                              good.split("    line")[0]])
    assert all("error" in r for r in results)


# --- PNG, markdown, table ------------------------------------------------------------------------

def decode_png(uri: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix)
    return Image.open(io.BytesIO(base64.b64decode(uri[len(prefix):])))


def test_png_decodes_with_a_sane_size():
    points = points_of(range(1, 20_001), every_eval=1000)
    points[9000]["loss"] = float("nan")
    uri = png_data_uri(points, "run")
    image = decode_png(uri)
    assert image.format == "PNG" and image.size == (640, 320)
    assert 5_000 < len(uri) < 100_000
    assert decode_png(png_data_uri([], "nothing yet")).size == (640, 320)
    assert decode_png(png_data_uri([{"step": 3, "loss": 1e6}, {"step": 4, "loss": 2.0}], "spike")).size == (640, 320)


def test_loss_curve_markdown_has_chart_image_and_summary():
    points = points_of(range(1, 1001), every_eval=250)
    points[600]["loss"] = float("inf")
    markdown = loss_curve_markdown(points, "demo: loss")
    assert markdown.startswith("### demo: loss")
    assert "```mermaid\n---\nconfig:" in markdown and "xychart-beta" in markdown
    assert re.search(r"!\[loss curve\]\(data:image/png;base64,[A-Za-z0-9+/=]+\)", markdown)
    # the picture first: the PNG and its summary line come before the chart's code block, which a
    # viewer without mermaid shows as source text
    assert markdown.index("![loss curve](") < markdown.index("**steps**") < markdown.index("```mermaid")
    summary = next(line for line in markdown.splitlines() if line.startswith("**steps**"))
    finite = [p for p in points if math.isfinite(p["loss"])]
    assert summary.startswith("**steps** 1–1000 (1000 logged)")
    assert f"first {finite[0]['loss']:.4g}" in summary and f"last {finite[-1]['loss']:.4g}" in summary
    assert f"min {min(p['loss'] for p in finite):.4g}" in summary
    assert f"**val loss** last {points[999]['val_loss']:.4g} at step 1000 (4 evaluations)" in summary
    assert "**non-finite losses: 1**, the first at step 601" in summary
    empty = loss_curve_markdown([], "demo: loss")
    assert "```mermaid" not in empty and "data:image/png" in empty and empty.endswith("No training steps logged yet.")


def test_table_rows_have_fixed_columns():
    points = points_of(range(1, 5001), every_eval=1000)
    points[10]["loss"] = float("nan")
    points[20]["loss"] = float("inf")
    rows = table_rows(points, 100)
    assert len(rows) <= 100
    assert all(tuple(row) == loss_curve.TABLE_COLUMNS for row in rows)
    assert rows[0] == {"step": 1, "loss": 10.02, "val_loss": None, "lr": 3e-4,  # 10.022960968958811 logged
                       "grad_norm": 1.0, "tokens_per_s": 1001.0, "mfu_pct": 40.0}
    # the NaN and the inf share a step range, which keeps one of them as its highest loss
    assert [row["loss"] for row in rows if isinstance(row["loss"], str)] in (["nan"], ["inf"])
    json.dumps(rows, allow_nan=False)


def test_table_rows_round_floats_for_reading_and_leave_the_stream_whole():
    """The points table showed the stream's floats in full (a float32 loss widened to 17 digits)."""
    logged = parse_log(json.dumps({"step": 16, "loss": 6.795858383178711, "val_loss": 6.854208946228027,
                                   "lr": 0.0024000000000000002, "grad_norm": 1.186202883720398,
                                   "tokens_per_s": 2269.5123887471327, "mfu_pct": 0.03170921234})).as_list()
    kept = json.loads(json.dumps(logged))
    [row] = table_rows(logged)
    assert row == {"step": 16, "loss": 6.796, "val_loss": 6.854, "lr": 0.0024, "grad_norm": 1.186,
                   "tokens_per_s": 2270.0, "mfu_pct": 0.0317}
    assert max(len(str(v)) for v in row.values()) <= 6
    assert logged == kept and logged[0]["loss"] == 6.795858383178711  # the stream keeps every digit
    assert metrics_summary(logged)["final_loss"] == 6.795858383178711
    assert table_rows([{"step": 1, "loss": 12.3456789}])[0]["loss"] == 12.35
    assert table_rows([{"step": 1, "loss": float("nan")}])[0]["loss"] == "nan"


# --- run summary ---------------------------------------------------------------------------------

def a_summary(points: list[dict]) -> RunSummary:
    return {
        "spec": {"name": "tiny-local", "model": {"hidden_size": 64, "layers": 2}, "train": {"steps": 5000}},
        "outcome": "completed",
        "code_version": "git:0123456789abcdef0123456789abcdef01234567",
        "packages": package_versions(),
        "jobs": [{"stage": "tokenize", "job_id": "41_0", "nodes": "node-1", "outcome": ""},
                       {"stage": "train", "job_id": "42", "nodes": "node-[1-4]",
                        "outcome": "FAILED: exit code 1:0 -- the trainer stopped on SIGUSR2 at step 120 and saved a "
                                   "checkpoint"},
                       {"stage": "train", "job_id": "43", "nodes": "node-[1-4]", "outcome": "completed"}],
        "stage_seconds": {"tokenize": 812.4, "train": 7384.0},
        "compile_graphs": [{"stage": "precompile", "node": "node-1", "compiled": 24, "from cache": 0},
                           {"stage": "train", "node": "node-1", "compiled": 0, "from cache": 24},
                           {"stage": "precompile", "node": "trn1-1", "compiled": 3, "from cache": None}],
        **metrics_summary(points),
        "device_util_pct": 87.5, "device_memory_gib": 61.25,
    }


def test_metrics_summary_takes_the_stream_apart():
    points = points_of(range(1, 5001), every_eval=1000)
    points[0]["tokens_per_s"] = 1.0  # the warm-up step must not count
    points[-1]["loss"] = float("nan")
    summary = metrics_summary(points)
    assert summary == {"final_step": 5000, "tokens_per_s": 1003.0, "step_time_ms": 501.0, "mfu_pct": 40.0,
                       "final_loss": points[-2]["loss"], "final_val_loss": points[-1]["val_loss"]}
    assert metrics_summary([]) == {"final_step": None, "tokens_per_s": None, "step_time_ms": None, "mfu_pct": None,
                                   "final_loss": None, "final_val_loss": None}


def test_run_summary_markdown_reports_every_key():
    summary = a_summary(points_of(range(1, 5001), every_eval=1000))
    assert set(summary) == RunSummary.__required_keys__
    markdown = run_summary_markdown(summary)
    assert markdown.startswith("### Run summary: tiny-local")
    assert "| outcome | completed |" in markdown
    assert "| mean device utilization | 87.5 % |" in markdown and "| peak device memory | 61.25 GiB |" in markdown
    failed = run_summary_markdown({**summary, "outcome": "failed: train: job 42 | NODE_FAIL\ntraceback ..."})
    assert "| outcome | failed: train: job 42 / NODE_FAIL |" in failed
    assert f"| final train loss | {summary['final_loss']:.4g} (step 5000) |" in markdown
    assert f"| final validation loss | {summary['final_val_loss']:.4g} |" in markdown
    assert "| tokens/s | 1,003 |" in markdown and "| MFU | 40.0 % |" in markdown
    assert "| step time | 501.0 ms |" in markdown
    assert "`git:0123456789abcdef0123456789abcdef01234567`" in markdown
    assert "| tokenize | 41_0 | node-1 |  |" in markdown and "| train | 43 | node-[1-4] | completed |" in markdown
    assert "_nodes as the scheduler names them (Slurm's NodeName" in markdown  # not necessarily the host names
    assert ("| train | 42 | node-[1-4] | FAILED: exit code 1:0 -- the trainer stopped on SIGUSR2 at step 120 and "
            "saved a checkpoint |") in markdown
    assert "| train | 7384.0 | 2:03:04 |" in markdown
    # what training still compiled after the precompile stage: 0, every graph from the cache
    assert "| train | node-1 | 0 | 24 |" in markdown and "| precompile | trn1-1 | 3 | not counted |" in markdown
    assert set(package_versions()) == set(loss_curve.PACKAGES)
    assert f"| prefect | {package_versions()['prefect']} |" in markdown
    assert "| megatron-core | " in markdown and "| submitit | " in markdown
    assert "```yaml\nname: tiny-local\nmodel:\n  hidden_size: 64\n  layers: 2\ntrain:\n  steps: 5000\n```" in markdown
    without = {k: v for k, v in summary.items() if k not in ("mfu_pct", "spec")}
    with pytest.raises(ValueError, match="lacks mfu_pct, spec"):
        run_summary_markdown(without)


# --- through the Prefect API -------------------------------------------------------------------

def read_by_key(key: str) -> list:
    with get_client(sync_client=True) as client:
        newest_first = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                             sort=ArtifactSort.CREATED_DESC)
    return newest_first[::-1]


def latest(key: str):
    with get_client(sync_client=True) as client:
        return client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_publish_updates_within_a_run_and_versions_across_runs():
    spec_name = f"test-{uuid.uuid4().hex[:8]}"
    points = points_of(range(1, 3001), every_eval=1000)

    @flow(name="train-artifacts-test")
    def training(up_to: list[int]) -> list:
        progress = publish_progress(spec_name, 0, 3000)
        for step in up_to:
            publish_loss_curve(spec_name, points[:step])
            publish_progress(spec_name, step, 3000, artifact_id=progress)
        return [progress]

    first_run = training([1000, 2000], return_state=True)
    curve_key, points_key = artifact_key(spec_name, "loss-curve"), artifact_key(spec_name, "loss-points")
    curves, tables = read_by_key(curve_key), read_by_key(points_key)
    assert len(curves) == len(tables) == 1  # the second call updated the run's artifacts in place
    assert curves[0].type == "markdown" and tables[0].type == "table"
    assert curves[0].flow_run_id == first_run.state_details.flow_run_id
    assert "2000 steps logged" in curves[0].description and "```mermaid" in curves[0].data
    rows = json.loads(tables[0].data)
    assert rows[-1]["step"] == 2000 and tuple(rows[0]) == loss_curve.TABLE_COLUMNS
    progress = read_by_key(artifact_key(spec_name, "progress"))
    assert len(progress) == 1 and progress[0].type == "progress"
    assert progress[0].data == pytest.approx(200 / 3) and progress[0].description == "step 2000 of 3000"
    assert progress[0].id == first_run.result()[0]

    second_run = training([3000], return_state=True)
    curves = read_by_key(curve_key)
    assert len(curves) == 2  # one version per flow run: the key's history
    assert [c.flow_run_id for c in curves] == [first_run.state_details.flow_run_id,
                                               second_run.state_details.flow_run_id]
    assert "2000 steps logged" in curves[0].description and "3000 steps logged" in curves[1].description
    newest = latest(curve_key)
    assert len(newest) == 1 and newest[0].latest_id == curves[1].id and newest[0].data == curves[1].data
    assert json.loads(latest(points_key)[0].data)[-1]["step"] == 3000
    assert latest(artifact_key(spec_name, "progress"))[0].data == 100.0


def test_publish_run_summary_through_the_api():
    spec_name = f"test-{uuid.uuid4().hex[:8]}"
    summary = a_summary(points_of(range(1, 101)))

    @flow(name="run-summary-test")
    def finish() -> None:
        publish_run_summary(spec_name, summary)

    finish()
    (artifact,) = read_by_key(artifact_key(spec_name, "run-summary"))
    assert artifact.type == "markdown" and artifact.data == run_summary_markdown(summary)
    with pytest.raises(ValueError, match="total_steps=0"):
        publish_progress(spec_name, 1, 0)
