"""What ``neuron_parallel_compile`` reports, and what a Neuron compile cache holds
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/training/pytorch-neuron-parallel-compile.html,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/neuron-caching.html;
the tool's source is ``torch_neuronx/parallel_compile/neuron_parallel_compile.py`` in the
torch-neuronx wheel; cache entry states as huggingface/optimum-neuron
``optimum/neuron/cache/cleanup.py`` classifies them).

Per node, in order of trust: the results JSON (``NEURON_PARALLEL_COMPILE_DUMP_RESULTS``, also
logged as one multi-line record), else the ``Total ...`` summary lines in their old
``||PARALLEL_COMPILE||`` and new ``||NEURON_PARALLEL_COMPILE||`` forms, else the "No todo hlos"
line that means everything was already in the cache, else the last cache progress line
("Current remaining items are 0, locked are 2, failed are 0, done are 32, total is 34") of a
run that ended before its summary. Lines may carry an outer ``INFO: `` (the tool's output
relayed by a logger) or mpirun's ``[1,0]<stdout>:``; the JSON's statuses are ``true``/``false``
(2024 on) or ``"SUCCESS"``/``"FAILED"`` (2023). Checked on published output
(``tests/assets/logs/neuron-parallel-compile-public.txt``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_OUTER_PREFIX = re.compile(r"^(?:INFO: |\[\d+,\d+\]<std(?:out|err)>:)", re.M)
_PROGRESS = re.compile(r"Current remaining items are (\d+), locked are (\d+), failed are (\d+), done are (\d+), "
                       r"total is (\d+)")
_SUCCEEDED = (True, "true", "SUCCESS")
_TOTAL = re.compile(r"\|\|(?:NEURON_)?PARALLEL_COMPILE\|\|: Total (graphs|successful compilations|failed compilations): (\d+)")
_NO_TODO = "No todo hlos found in cache or hlo_tasklist"
_CACHED_NEFF = "Using a cached neff at"
_COMPILED = "Compiler status PASS"


@dataclass
class CompileSummary:
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    source: str = "none"  # results-json, summary-lines, all-cached, cache-progress, none
    failed_graphs: list[str] = field(default_factory=list)

    def as_row(self, node: str) -> dict:
        return {"node": node, "total": self.total, "succeeded": self.succeeded, "failed": self.failed,
                "source": self.source}


def from_results(results: dict) -> CompileSummary:
    report = results.get("compilation_report", {})
    failed = sorted(path for path, entry in report.items() if entry.get("status") not in _SUCCEEDED)
    summary = results.get("compilation_summary", {})  # counts by status
    ok = sum(int(n) for status, n in summary.items() if status in _SUCCEEDED)
    bad = sum(int(n) for status, n in summary.items() if status not in _SUCCEEDED)
    return CompileSummary(ok + bad, ok, bad, "results-json", failed)


def _json_record(text: str) -> dict | None:
    """The results JSON logged as a multi-line record: from its first brace, balanced."""
    key = text.find('"compilation_summary"')
    start = text.rfind("{", 0, key) if key >= 0 else -1
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            try:
                return json.loads(text[start:i + 1])
            except ValueError:
                return None
    return None


def parse_npc_log(text: str) -> CompileSummary:
    """One node's neuron_parallel_compile output."""
    text = _OUTER_PREFIX.sub("", text)
    if (results := _json_record(text)) is not None:
        return from_results(results)
    totals = {kind: int(n) for kind, n in _TOTAL.findall(text)}
    if totals:
        return CompileSummary(totals.get("graphs", 0), totals.get("successful compilations", 0),
                              totals.get("failed compilations", 0), "summary-lines")
    if _NO_TODO in text:
        return CompileSummary(source="all-cached")
    if progress := _PROGRESS.findall(text):
        _, _, bad, done, total = map(int, progress[-1])
        return CompileSummary(total, done, bad, "cache-progress")
    return CompileSummary()


def training_compiles(text: str) -> dict[str, int]:
    """Graphs a training run still compiled itself (0 when precompile covered everything), and
    graphs it took from the cache. "Compiler status PASS" is neuronx-cc's own closing line: the
    reference shows it in npc's worker output, and a cache miss in training runs the same
    compiler through the same cc wrapper; the wrapper's cache-hit line is counted the other way."""
    return {"compiled": text.count(_COMPILED), "from_cache": text.count(_CACHED_NEFF)}
