"""The Trainium source: ``neuron-monitor``'s JSON stream (aws-neuron-tools), one report per line.

Format: the Neuron Monitor User Guide (aws-neuron/aws-neuron-sdk,
tools/neuron-sys-tools/neuron-monitor-user-guide.rst). Each Neuron application (runtime) reports
every NeuronCore of the node, its own share of each core's utilization and memory, so a core's
figures are the sums over the runtimes. Of the runtime's error counts only ``runtime`` and
``hardware`` (uncorrectable ECC) mark a node as faulty, with the uncorrected ECC events of
``neuron_hw_counters``: ``generic`` errors are counted by working runs too (23,654 in one second
of a trn1 run that completed 260 executions, tests/assets/neuron_monitor/), and ``numerical``
ones are the model's NaNs, which the trainer counts itself.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from typing import Any

FAULTS = ("runtime", "hardware")
ECC_FAULTS = ("mem_ecc_uncorrected", "sram_ecc_uncorrected")


def error_counts(report: dict[str, Any]) -> dict[str, int]:
    """Every error count of one report, by kind, summed over the runtimes and devices."""
    counts: dict[str, int] = {}
    for runtime in report.get("neuron_runtime_data") or []:
        summary = ((runtime.get("report") or {}).get("execution_stats") or {}).get("error_summary") or {}
        for kind, n in summary.items():
            counts[kind] = counts.get(kind, 0) + int(n)
    hw = ((report.get("system_data") or {}).get("neuron_hw_counters") or {}).get("neuron_devices") or []
    for device in hw:
        for kind in ECC_FAULTS:
            counts[kind] = counts.get(kind, 0) + int(device.get(kind, 0))
    return counts


def faults(counts: dict[str, int]) -> int:
    return sum(counts.get(kind, 0) for kind in (*FAULTS, *ECC_FAULTS))


def parse_report(report: dict[str, Any], counts: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """One record per NeuronCore (utilization, device memory) and one for the host (its memory,
    and the errors ``counts``, by default those of this report)."""
    util: dict[str, float] = {}
    memory: dict[str, int] = {}
    for runtime in report.get("neuron_runtime_data") or []:
        body = runtime.get("report") or {}
        cores = (body.get("neuroncore_counters") or {}).get("neuroncores_in_use") or {}
        for core, values in cores.items():
            util[core] = util.get(core, 0.0) + float((values or {}).get("neuroncore_utilization") or 0)
        used = (body.get("memory_used") or {}).get("neuron_runtime_used_bytes") or {}
        for core, parts in ((used.get("usage_breakdown") or {}).get("neuroncore_memory_usage") or {}).items():
            memory[core] = memory.get(core, 0) + sum(int(v) for v in parts.values())
    records = [{"device": f"nc{core}", "util_pct": util.get(core, 0.0), "memory_gib": memory.get(core, 0) / 2**30}
               for core in sorted({*util, *memory}, key=int)]
    counts = error_counts(report) if counts is None else counts
    host = {"device": "host", "errors": faults(counts)}
    info = (report.get("system_data") or {}).get("memory_info") or {}
    if "memory_used_bytes" in info:
        host["host_memory_gib"] = info["memory_used_bytes"] / 2**30
    if host["errors"]:
        host["error_detail"] = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()) if n)
    return records + [host]


class NeuronSource:
    """Runs ``neuron-monitor`` at the sampler's period and keeps its latest report; error counts
    are per report period, so they are added up over every report between two samples."""

    def __init__(self, interval_s: float):
        config = {"period": f"{max(1, round(interval_s))}s",
                  "neuron_runtimes": [{"tag_filter": ".*", "metrics": [
                      {"type": "neuroncore_counters"}, {"type": "memory_used"}, {"type": "execution_stats"}]}],
                  "system_metrics": [{"type": "memory_info"}, {"type": "neuron_hw_counters"}]}
        self.config = tempfile.NamedTemporaryFile("w", suffix=".json", prefix="neuron-monitor-")
        json.dump(config, self.config)
        self.config.flush()
        self.proc = subprocess.Popen(["neuron-monitor", "-c", self.config.name], stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()
        self.latest: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        threading.Thread(target=self._read, name="neuron-monitor", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.latest = report
                for kind, n in error_counts(report).items():
                    self.counts[kind] = self.counts.get(kind, 0) + n

    def sample(self, interval_s: float) -> list[dict]:
        with self.lock:
            report, counts, self.counts = self.latest, self.counts, {}
        return parse_report(report, counts) if report else []

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.config.close()
