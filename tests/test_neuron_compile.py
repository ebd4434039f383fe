"""neuron_parallel_compile results in every published form, and compile-cache states."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from pretrain.neuron_compile import parse_npc_log, training_compiles
from public_logs import blocks

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

NEW = """2024-11-07 09:57:13.000144:  39810  INFO ||NEURON_PARALLEL_COMPILE||: Total graphs: 36
2024-11-07 09:57:13.000144:  39810  INFO ||NEURON_PARALLEL_COMPILE||: Total successful compilations: 35
2024-11-07 09:57:13.000144:  39810  INFO ||NEURON_PARALLEL_COMPILE||: Total failed compilations: 1
"""
OLD = """2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total graphs: 22
2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total successful compilations: 22
2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total failed compilations: 0
"""


def test_summary_lines_new_and_old_forms():
    new = parse_npc_log("noise\n" + NEW)
    assert (new.total, new.succeeded, new.failed, new.source) == (36, 35, 1, "summary-lines")
    old = parse_npc_log(OLD)
    assert (old.total, old.succeeded, old.failed) == (22, 22, 0)


def test_results_json_wins_and_names_failed_graphs():
    results = {"compilation_summary": {"true": 2, "false": 1},
               "compilation_report": {"/c/MODULE_1/model.hlo.pb": {"status": True, "retry": 0, "compile_time": 3.1},
                                      "/c/MODULE_2/model.hlo.pb": {"status": False, "retry": 1, "compile_time": 9.0},
                                      "/c/MODULE_3/model.hlo.pb": {"status": True, "retry": 0}},
               "start_time": 1.0, "compilation_time": 12.0}
    logged = "INFO ||NEURON_PARALLEL_COMPILE||: " + json.dumps(results, indent=4) + "\n" + NEW
    summary = parse_npc_log(logged)
    assert (summary.total, summary.succeeded, summary.failed, summary.source) == (3, 2, 1, "results-json")
    assert summary.failed_graphs == ["/c/MODULE_2/model.hlo.pb"]


def test_nothing_to_compile_and_nothing_reported():
    cached = parse_npc_log("INFO ||NEURON_PARALLEL_COMPILE||: No todo hlos found in cache or hlo_tasklist, "
                           "parallel_compile return before spawning workers....")
    assert (cached.total, cached.source) == (0, "all-cached")
    assert parse_npc_log("the trial run crashed").source == "none"


def test_graphs_compiled_during_training():
    log = ("INFO ||NCC_WRAPPER||: Using a cached neff at /c/MODULE_1/model.neff. Exiting with a successfully "
           "compiled graph.\n" * 3 + "Compiler status PASS\n")
    assert training_compiles(log) == {"compiled": 1, "from_cache": 3}




def test_published_neuron_parallel_compile_output_of_every_form():
    """19 published logs (AWS documentation, samples, issues; 2023-2025): the results JSON with an
    outer "INFO: " on every line, with compile_time, with 2023's "SUCCESS" statuses, and empty;
    summary lines with and without the pid column, in both logger names; a run that ended before
    its summary (its cache progress, progress dots glued to the lines); the training-side lines."""
    logs = [(source, "\n".join(lines)) for source, lines in blocks("neuron-parallel-compile-public.txt")]
    assert len(logs) == 19
    summaries = [(s.total, s.succeeded, s.failed, s.source) for s in (parse_npc_log(log) for _, log in logs)]
    assert summaries[1:12] == [
        (5, 5, 0, "cache-progress"),  # the reference's progress lines alone
        (2, 2, 0, "results-json"),    # every line under an outer "INFO: "
        (36, 36, 0, "summary-lines"), (32, 32, 0, "summary-lines"),  # pid column, and without it
        (22, 22, 0, "summary-lines"), (26, 26, 0, "summary-lines"),  # ||PARALLEL_COMPILE|| (2023-2024)
        (2, 2, 0, "results-json"),    # with compile_time, start_time, compilation_time
        (55, 51, 0, "cache-progress"), (55, 51, 0, "cache-progress"),  # cut before the summary
        (4, 4, 0, "results-json"),    # "SUCCESS": 4, as 2023's tool wrote it
        (0, 0, 0, "results-json"),    # everything cached: empty JSON, Total graphs: 0
    ]
    assert summaries[0] == summaries[12] == (0, 0, 0, "none")  # graph extraction; a training-side line
    compiles = [training_compiles(log) for _, log in logs[12:]]
    assert [c["from_cache"] for c in compiles] == [1, 0, 1, 0, 0, 0, 1]
    assert [c["compiled"] for c in compiles] == [0, 1, 0, 0, 0, 2, 0]  # mpirun's [1,1]<stdout>: prefixes too


def test_published_output_keeps_logger_pid_time_progress_and_compile_times():
    logs = [parse_npc_log("\n".join(lines)) for _, lines in blocks("neuron-parallel-compile-public.txt")]
    outer = logs[2]  # "INFO: 2023-08-24 20:21:11.000895:  161136  INFO ||NEURON_PARALLEL_COMPILE||: ..."
    assert (outer.logger, outer.pid, outer.time) == (
        "NEURON_PARALLEL_COMPILE", 161136, datetime(2023, 8, 24, 20, 21, 11).timestamp() + 0.895)
    assert (outer.started, outer.compile_s, outer.graph_seconds, outer.progress) == (None, None, {}, None)
    assert (logs[4].logger, logs[4].pid) == ("NEURON_PARALLEL_COMPILE", None)  # no pid column
    assert (logs[5].logger, logs[6].logger) == ("PARALLEL_COMPILE", "PARALLEL_COMPILE")
    timed = logs[7]  # 2025: compile_time per graph, start_time, compilation_time, NEURON_CACHE progress
    assert timed.progress == {"remaining": 0, "locked": 2, "failed": 0, "done": 32, "total": 34}
    assert (timed.pid, timed.started, timed.compile_s) == (32201, 1737076372.654127, 195.32730412483215)
    assert sorted(timed.graph_seconds.values()) == [9.770226240158081, 192.86727905273438]
    assert timed.as_row("trn1-001")["compile_s"] == 195.32730412483215
    assert logs[1].progress == {"remaining": 0, "locked": 0, "failed": 0, "done": 5, "total": 5}
    assert logs[1].logger is None  # NEURON_CACHE lines only: the tool's own logger never spoke
    cut = logs[9]  # progress dots glued before the timestamps
    assert (cut.logger, cut.pid, cut.progress["remaining"], cut.progress["total"]) == ("PARALLEL_COMPILE", 715601, 4, 55)


def test_published_output_keeps_what_every_other_line_names():
    """The cache path (the tool's, the cc wrapper's, under mpirun's prefix), the work directory,
    the graphs extracted, the neffs taken from the cache, each worker's task count, each
    sub-process's exception, and each graph's retries in the results JSON."""
    logs = [parse_npc_log("\n".join(lines)) for _, lines in blocks("neuron-parallel-compile-public.txt")]
    cache = "/var/tmp/neuron-compile-cache"
    assert [s.cache_path for s in logs] == [cache, cache, *[None] * 6, cache, *[None] * 4, cache, None, None,
                                            "/tmp/tmpjacdmeb0", cache, None]
    assert logs[0].extracted_graphs == [
        f"{cache}/neuronxcc-2.0.0.22266a0+a69f71e55/MODULE_9219523464496887986+abb26765/model.hlo.pb"]
    assert [i for i, s in enumerate(logs) if s.extracted_graphs] == [0]
    assert logs[8].workdir == "/tmp/parallel_compile_workdir" and [i for i, s in enumerate(logs) if s.workdir] == [8]
    assert logs[7].worker_tasks == {6: 1} and [i for i, s in enumerate(logs) if s.worker_tasks] == [7]
    assert logs[15].subprocess_exceptions == {1: "None"}
    assert [i for i, s in enumerate(logs) if s.subprocess_exceptions] == [15]
    assert [s.cached_neffs for s in logs[12:]] == [
        [f"{cache}/neuronxcc-2.8.0.25+a3ad0f342/MODULE_15770068861141756492+abb26765/model.neff"], [],
        [f"{cache}/neuronxcc-2.8.0.25+a3ad0f342/MODULE_198775565831884870+d41d8cd9/model.neff"], [], [], [],
        ["/tmp/tmpd29vse1h/neuron-compile-cache/neuronxcc-2.7.0.40+f7c6cf2a3/MODULE_12206097846517805328+d41d8cd9/"
         "model.neff"]]
    assert not any(s.cached_neffs for s in logs[:12])
    retries = {i: s.graph_retries for i, s in enumerate(logs) if s.graph_retries}
    assert sorted(retries) == [2, 7, 10] and {len(r) for r in retries.values()} == {2, 4}
    assert all(set(r.values()) == {0} for r in retries.values())
    assert retries[7] == dict.fromkeys(logs[7].graph_seconds, 0)  # the graphs compile_time was given for


def test_published_output_keeps_every_logger_line_with_its_head():
    """Every line of the tool's, NEURON_CACHE's and the cc wrapper's loggers, in every block: its
    logger, level and message as printed, the time and pid where printed (progress dots, an outer
    INFO: or mpirun's prefix before them), mpirun's job and rank, and each progress line's counts;
    and each of the compiler's status lines with its mpirun rank."""
    stamp = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d{3}(\d{3}):(?:\s+(\d+))?\s+INFO \|\|")
    for source, lines in blocks("neuron-parallel-compile-public.txt"):
        records = parse_npc_log("\n".join(lines)).records
        logged = [line for line in lines if re.search(r"\|\|\w+\|\|: ", line)]
        assert [r["message"] for r in records] == [line.split("||: ", 1)[1] for line in logged], source
        assert [r["logger"] for r in records] == [line.split("||")[1] for line in logged], source
        assert {r["level"] for r in records} <= {"INFO"}
        statuses = parse_npc_log("\n".join(lines)).compiler_statuses
        assert [s["status"] for s in statuses] == ["PASS"] * sum("Compiler status PASS" in line for line in lines)
        for record, line in zip(records, logged):
            head = stamp.search(line)
            assert record.get("time") == (head and datetime.fromisoformat(head[1]).timestamp() + int(head[2]) / 1000)
            assert record.get("pid") == (head and head[3] and int(head[3])), line
            assert ("remaining" in record) == ("Current remaining items" in line), line
    logs = [parse_npc_log("\n".join(lines)).records for _, lines in blocks("neuron-parallel-compile-public.txt")]
    # the cache's progress, start to end, where the tool's summary counts only the last
    assert [(r["remaining"], r["done"], r["total"]) for r in logs[1] if "total" in r] == [(5, 0, 5), (0, 5, 5)]
    cache = logs[7][1]  # NEURON_CACHE's line under the compile worker's pid, before the tool's record
    assert (cache["logger"], cache["pid"], cache["time"], cache["locked"]) == (
        "NEURON_CACHE", 42821, datetime(2025, 1, 17, 1, 16, 7).timestamp() + 0.970, 2)
    assert logs[7][0]["pid"] == 42821 and logs[7][-1]["pid"] == 32201
    assert logs[10][1]["message"] == "Progress Status: No more compile jobs!"
    assert [(r["logger"], r["time"]) for r in logs[12]] == [("NCC_WRAPPER", datetime(2023, 8, 14, 8, 15, 20).timestamp()
                                                             + 0.681)]
    [ranked] = logs[17]  # "[1,1]<stdout>:2025-01-10 05:07:14.000768:  38  INFO ||NEURON_CACHE||: ..."
    assert (ranked["mpi_job"], ranked["mpi_rank"], ranked["mpi_stream"], ranked["pid"]) == (1, 1, "stdout", 38)
    assert not any("mpi_rank" in r for log in logs[:17] for r in log)
    mpirun = parse_npc_log("\n".join(blocks("neuron-parallel-compile-public.txt")[17][1])).compiler_statuses
    assert mpirun == [{"status": "PASS", "mpi_job": 1, "mpi_rank": 1, "mpi_stream": "stdout"},
                      {"status": "PASS", "mpi_job": 1, "mpi_rank": 0, "mpi_stream": "stdout"}]
