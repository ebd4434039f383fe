"""neuron_parallel_compile results in every published form, and compile-cache states."""

from __future__ import annotations

import json

import pytest

from pretrain.neuron_compile import parse_npc_log, training_compiles

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


