"""The device samples of a run (``{"kind": "device"}`` records that ``python -m trainer monitor``
writes, one file per node) as figures, a chart and a table.

Pure: ``tasks/attempts.py`` feeds the records in as the files grow, ``tasks/train_artifacts.py``
publishes the ``<spec>-devices`` artifact, the run summary takes :meth:`DeviceSamples.figures`
and the attempt loop :meth:`DeviceSamples.faulty_nodes`.

A node's utilization at a sample is the mean over its devices (GPUs, NeuronCores, or the CPU
where it has none); its memory the fullest device's, the one that runs out first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pretrain.loss_curve import CHART_POSITIONS, axis_number, axis_range, mermaid_text

# Mermaid draws a line per node without a legend, so the lines are few, named under the chart.
MAX_LINES = 8
# Matplotlib's tab10, as the loss curve's colours.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass
class NodeSeries:
    # sample time -> [utilization sum, devices with a utilization, fullest device's GiB]
    samples: dict[float, list[float]] = field(default_factory=dict)
    devices: set[str] = field(default_factory=set)
    errors: int = 0
    detail: list[str] = field(default_factory=list)


class DeviceSamples:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeSeries] = {}

    def add(self, record: dict[str, Any]) -> None:
        node = self.nodes.setdefault(record["node"], NodeSeries())
        sample = node.samples.setdefault(float(record["time"]), [0.0, 0, 0.0])
        if record.get("util_pct") is not None:
            node.devices.add(record["device"])
            sample[0] += float(record["util_pct"])
            sample[1] += 1
        if record.get("memory_gib") is not None:
            sample[2] = max(sample[2], float(record["memory_gib"]))
        if record.get("errors"):
            node.errors += int(record["errors"])
            node.detail.append(f"{record['device']}: {record.get('error_detail') or record['errors']}")

    def _series(self, node: NodeSeries) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        times = np.array(sorted(node.samples))
        rows = [node.samples[t] for t in times]
        util = np.array([u / n if n else np.nan for u, n, _ in rows])
        return times, util, np.array([m for _, _, m in rows])

    def figures(self) -> dict[str, float | None]:
        """The run summary's: mean utilization over every node and sample, and the peak memory of
        any device; None without samples."""
        utils = [u for node in self.nodes.values() for u in self._series(node)[1] if np.isfinite(u)]
        peaks = [float(self._series(node)[2].max()) for node in self.nodes.values() if node.samples]
        return {"device_util_pct": float(np.mean(utils)) if utils else None,
                "device_memory_gib": max(peaks) if peaks else None}

    def faulty_nodes(self) -> dict[str, str]:
        """Nodes whose devices reported errors (XID, uncorrected ECC, Neuron runtime or hardware
        errors), with what they reported."""
        return {name: "; ".join(dict.fromkeys(node.detail)) for name, node in sorted(self.nodes.items()) if node.errors}

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for name, node in sorted(self.nodes.items()):
            _, util, memory = self._series(node)
            finite = util[np.isfinite(util)]
            rows.append({"node": name, "devices": len(node.devices), "samples": len(node.samples),
                         "mean util %": round(float(finite.mean()), 1) if len(finite) else None,
                         "peak util %": round(float(finite.max()), 1) if len(finite) else None,
                         "mean memory GiB": round(float(memory.mean()), 2) if len(memory) else None,
                         "peak memory GiB": round(float(memory.max()), 2) if len(memory) else None,
                         "errors": node.errors, "error detail": "; ".join(dict.fromkeys(node.detail))})
        return rows

    def chart(self, title: str, which: str) -> str:
        """A mermaid ``xychart-beta`` of ``which`` ("util" or "memory") per node against minutes
        since the first sample, with the nodes drawn named below it; "" without samples. Past
        MAX_LINES nodes, those of lowest mean utilization are drawn: the stragglers."""
        drawn = sorted(self.rows(), key=lambda r: (r["mean util %"] is None, r["mean util %"] or 0))[:MAX_LINES]
        series = {}
        for row in sorted(drawn, key=lambda r: r["node"]):
            times, util, memory = self._series(self.nodes[row["node"]])
            values = util if which == "util" else memory
            keep = np.isfinite(values)
            if keep.any():
                series[row["node"]] = (times[keep], values[keep])
        if not series:
            return ""
        start = min(t[0] for t, _ in series.values())
        end = max(t[-1] for t, _ in series.values())
        positions = min(CHART_POSITIONS, max(len(t) for t, _ in series.values()))
        grid = np.linspace(start, end, positions)
        lines = [np.interp(grid, t, v) for t, v in series.values()]
        bottom, top, decimals = (0.0, 100.0, 0) if which == "util" else axis_range(np.concatenate(lines))
        minutes = (end - start) / 60
        x_axis = '["0"]' if positions == 1 else f"0 --> {max(round(minutes), 1)}"
        label = "utilization %" if which == "util" else "memory GiB (fullest device)"
        shown = f" ({len(series)} of {len(self.nodes)} nodes, lowest utilization)" if len(self.nodes) > len(series) else ""
        colours = PALETTE[:len(series)]
        chart = "\n".join([
            "```mermaid", "---", "config:", "  themeVariables:", "    xyChart:",
            f'      plotColorPalette: "{", ".join(colours)}"', "---", "xychart-beta",
            f'    title "{mermaid_text(title + shown)}"',
            f'    x-axis "minutes" {x_axis}',
            f'    y-axis "{label}" {axis_number(bottom, decimals)} --> {axis_number(top, decimals)}',
            *(f"    line [{', '.join(axis_number(v, max(decimals, 1)) for v in values)}]" for values in lines),
            "```"])
        legend = ", ".join(f"{node} ({colour})" for node, colour in zip(series, colours))
        return f"{chart}\n\n_lines: {legend}_"

    def markdown(self, title: str) -> str:
        rows = self.rows()
        if not rows:
            return f"### {title}\n\nno device samples yet"
        columns = list(rows[0])
        table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                 *("| " + " | ".join("" if r[c] is None else str(r[c]).replace("|", "/") for c in columns) + " |"
                   for r in rows)]
        return "\n\n".join([f"### {title}", self.chart(f"{title}: utilization", "util"),
                            self.chart(f"{title}: memory", "memory"), "\n".join(table)])
