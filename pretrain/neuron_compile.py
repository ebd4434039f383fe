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
(``tests/assets/logs/neuron-parallel-compile-public.txt``). Beside the counts: the logger name,
pid and time of the tool's last record, the last cache progress line's counts, and the JSON's
start, compilation and per-graph compile times and retries where it has them, and what the other
lines name: the cache path, the work directory, the graphs extracted, the neffs taken from the
cache, each worker's task count and each sub-process's exception; every logger line (the
cache's and the cc wrapper's too) with its time, pid, mpirun rank and message, and each status
line of the compiler with its mpirun rank.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import datetime

# What may come before a line: an outer logger's "INFO: ", or mpirun's "[1,1]<stdout>:" (its job and rank).
_OUTER = r"(?:INFO: |\[(\d+),(\d+)\]<(std(?:out|err))>:)"
_OUTER_PREFIX = re.compile("^" + _OUTER, re.M)
_PROGRESS = re.compile(r"Current remaining items are (\d+), locked are (\d+), failed are (\d+), done are (\d+), "
                       r"total is (\d+)")
_PROGRESS_FIELDS = ("remaining", "locked", "failed", "done", "total")
# A record of the tool's, the cache's or the cc wrapper's logger: "2025-01-17 01:16:07.000981:
# 32201  INFO ||NEURON_PARALLEL_COMPILE||: <message>", the pid column since mid-2023, the
# timestamp absent where the output was relayed. The fraction is milliseconds zero-padded to six
# digits (logging's "%(msecs)06d": every published line reads ".000" and three digits). An outer
# prefix may come first, and the worker's progress dots before the timestamp.
_RECORD = re.compile("^" + _OUTER + r"?\.*"
                     r"(?:(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{6}):\s+)?(?:(\d+)\s+)?([A-Z]+) \|\|(\w+)\|\|: (.*)$",
                     re.M)
_TOOL_LOGGERS = ("PARALLEL_COMPILE", "NEURON_PARALLEL_COMPILE")
_SUCCEEDED = (True, "true", "SUCCESS")
_TOTAL = re.compile(r"\|\|(?:NEURON_)?PARALLEL_COMPILE\|\|: Total (graphs|successful compilations|failed compilations): (\d+)")
_NO_TODO = "No todo hlos found in cache or hlo_tasklist"
# The tool's and the cc wrapper's other lines, each with what it names.
_CACHE_PATH = re.compile(r"\|\|\w+\|\|: Compile cache path: (\S+)")
_WORKDIR = re.compile(r"\|\|\w+\|\|: Removing existing workdir (\S+)")
_EXTRACTED = re.compile(r"Extracting graphs \((\S+)\) for ahead-of-time parallel compilation")
_CACHED_NEFF_AT = re.compile(r"Using a cached neff at (\S+?)\. Exiting with a successfully compiled graph")
_WORKER_DONE = re.compile(r"worker (\d+) finished with num of tasks (\d+)")
_SUBPROCESS = re.compile(r"sub-process (\d+) got exception: (.*?)\s*$", re.M)
_CACHED_NEFF = "Using a cached neff at"
_COMPILED = "Compiler status PASS"
# neuronx-cc's closing line in a compile worker's output, each with the mpirun prefix it came under.
_COMPILER_STATUS = re.compile("^" + _OUTER + r"?Compiler status (\w+)", re.M)


@dataclass
class CompileSummary:
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    source: str = "none"  # results-json, summary-lines, all-cached, cache-progress, none
    failed_graphs: list[str] = field(default_factory=list)
    logger: str | None = None
    """The tool's logger name in its last record: PARALLEL_COMPILE (2023-2024) or NEURON_PARALLEL_COMPILE."""
    pid: int | None = None
    time: float | None = None
    """Epoch seconds of the tool's last record, read in this process's zone as the node wrote it."""
    progress: dict[str, int] | None = None
    """The last cache progress line's counts: remaining, locked, failed, done, total."""
    started: float | None = None
    """The results JSON's start_time (epoch seconds), 2025 on."""
    compile_s: float | None = None
    """The results JSON's compilation_time: seconds from start to the last graph, 2025 on."""
    graph_seconds: dict[str, float] = field(default_factory=dict)
    """Each graph's compile_time from the results JSON, where it reports one."""
    graph_retries: dict[str, int] = field(default_factory=dict)
    """Each graph's retry count from the results JSON."""
    cache_path: str | None = None
    """The compile cache the tool or the cc wrapper last named ("Compile cache path: ...")."""
    workdir: str | None = None
    """The tool's work directory, which it removes and re-creates at its start."""
    extracted_graphs: list[str] = field(default_factory=list)
    """The graphs the trial run extracted for compilation ("Extracting graphs (<path>) ...")."""
    cached_neffs: list[str] = field(default_factory=list)
    """The compiled graphs (neffs) taken from the cache ("Using a cached neff at <path>")."""
    worker_tasks: dict[int, int] = field(default_factory=dict)
    """Compile workers that finished, with the number of graphs each compiled."""
    subprocess_exceptions: dict[int, str] = field(default_factory=dict)
    """What each compile sub-process raised, as printed ("None": it raised nothing)."""
    compiler_statuses: list[dict] = field(default_factory=list)
    """Each "Compiler status PASS" neuronx-cc printed: its ``status``, and mpirun's ``mpi_job``,
    ``mpi_rank`` and ``mpi_stream`` where it prefixed the line."""
    records: list[dict] = field(default_factory=list)
    """Every logger line in order (the tool's, NEURON_CACHE's, the cc wrapper's): its ``logger``,
    ``level``, ``message`` as printed, ``time`` and ``pid`` where printed, mpirun's ``mpi_job``,
    ``mpi_rank`` and ``mpi_stream`` where it prefixed the line, and a progress line's counts
    (``remaining``, ``locked``, ``failed``, ``done``, ``total``)."""

    def as_row(self, node: str) -> dict:
        return {"node": node, "total": self.total, "succeeded": self.succeeded, "failed": self.failed,
                "source": self.source, "compile_s": self.compile_s}


def from_results(results: dict) -> CompileSummary:
    report = results.get("compilation_report", {})
    failed = sorted(path for path, entry in report.items() if entry.get("status") not in _SUCCEEDED)
    summary = results.get("compilation_summary", {})  # counts by status
    ok = sum(int(n) for status, n in summary.items() if status in _SUCCEEDED)
    bad = sum(int(n) for status, n in summary.items() if status not in _SUCCEEDED)
    return CompileSummary(ok + bad, ok, bad, "results-json", failed, started=results.get("start_time"),
                          compile_s=results.get("compilation_time"),
                          graph_seconds={path: entry["compile_time"] for path, entry in report.items()
                                         if "compile_time" in entry},
                          graph_retries={path: entry["retry"] for path, entry in report.items() if "retry" in entry})


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


def _records(text: str) -> list[dict]:
    """Each logger line of ``text`` (outer prefixes not yet removed) with what its head prints."""
    records = []
    for match in _RECORD.finditer(text):
        job, rank, stream, stamp, msecs, pid, level, logger, message = match.groups()
        record: dict = {"logger": logger, "level": level, "message": message}
        if stamp:
            record["time"] = datetime.fromisoformat(stamp).timestamp() + int(msecs) / 1000
        if pid:
            record["pid"] = int(pid)
        record |= _mpirun(job, rank, stream)
        if progress := _PROGRESS.search(message):
            record |= dict(zip(_PROGRESS_FIELDS, map(int, progress.groups())))
        records.append(record)
    return records


def _mpirun(job: str | None, rank: str | None, stream: str | None) -> dict:
    """What mpirun's "[1,1]<stdout>:" before a line says, where it is there."""
    return {"mpi_job": int(job), "mpi_rank": int(rank), "mpi_stream": stream} if job else {}


def _record_head(records: list[dict]) -> dict:
    """Logger, pid and time of the tool's last record."""
    tool = [record for record in records if record["logger"] in _TOOL_LOGGERS]
    if not tool:
        return {}
    head = {"logger": tool[-1]["logger"], "pid": tool[-1].get("pid")}
    if "time" in tool[-1]:
        head["time"] = tool[-1]["time"]
    return head


def parse_npc_log(text: str) -> CompileSummary:
    """One node's neuron_parallel_compile output: its counts, the head of its tool's last
    record, its last cache progress line, and every logger line with its head."""
    records = _records(text)
    statuses = [{"status": status, **_mpirun(job, rank, stream)}
                for job, rank, stream, status in _COMPILER_STATUS.findall(text)]
    text = _OUTER_PREFIX.sub("", text)
    progress = _PROGRESS.findall(text)
    last = dict(zip(_PROGRESS_FIELDS, map(int, progress[-1]))) if progress else None
    cache_paths, workdirs = _CACHE_PATH.findall(text), _WORKDIR.findall(text)
    return replace(_counts(text, last), progress=last, records=records, compiler_statuses=statuses,
                   **_record_head(records),
                   cache_path=cache_paths[-1] if cache_paths else None, workdir=workdirs[-1] if workdirs else None,
                   extracted_graphs=_EXTRACTED.findall(text), cached_neffs=_CACHED_NEFF_AT.findall(text),
                   worker_tasks={int(w): int(n) for w, n in _WORKER_DONE.findall(text)},
                   subprocess_exceptions={int(i): e for i, e in _SUBPROCESS.findall(text)})


def _counts(text: str, progress: dict[str, int] | None) -> CompileSummary:
    """The counts from the most trusted report the log holds (module docstring)."""
    if (results := _json_record(text)) is not None:
        return from_results(results)
    totals = {kind: int(n) for kind, n in _TOTAL.findall(text)}
    if totals:
        return CompileSummary(totals.get("graphs", 0), totals.get("successful compilations", 0),
                              totals.get("failed compilations", 0), "summary-lines")
    if _NO_TODO in text:
        return CompileSummary(source="all-cached")
    if progress is not None:
        return CompileSummary(progress["total"], progress["done"], progress["failed"], "cache-progress")
    return CompileSummary()


def training_compiles(text: str) -> dict[str, int]:
    """Graphs a training run still compiled itself (0 when precompile covered everything), and
    graphs it took from the cache. "Compiler status PASS" is neuronx-cc's own closing line: the
    reference shows it in npc's worker output, and a cache miss in training runs the same
    compiler through the same cc wrapper; the wrapper's cache-hit line is counted the other way."""
    return {"compiled": text.count(_COMPILED), "from_cache": text.count(_CACHED_NEFF)}
