"""The neuron precompile stage: the job rendered from the spec (one neuron_parallel_compile per
node around the training's own torchrun line, capped steps, per-node or shared cache, retry of
failed graphs only), and the per-node table and failure decision built from the results in every
published form (the log lines and results JSON of
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/training/pytorch-neuron-parallel-compile.html
and of aws-neuron/neuronx-distributed-training docs/tutorials/hf_llama3_70B_pretraining.rst).
neuron_parallel_compile itself never runs here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from prefect import flow, get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from blocks.cluster import SlurmCluster
from pretrain.presets import load_spec
from jobs.slurm import slurm_parameters
from render.nxdt import torchrun_command
from render.nxdt_scripts import CONFIG_NAME, precompile_script
from render.shell import shell_line
from flows.dry_run import render_files
from tasks.precompile import (attempt_record, compile_rows, failure_message, precompile_neuron, precompile_request,
                              retry_plan)

# Summary lines as the NxDT tutorials print them: the 70B tutorial (new logger name) and the GPT
# tutorial (old one); the failed variant is the 70B form with one graph failed.
NEW_FORM = """2024-11-07 09:57:13.000144:  39810  INFO ||NEURON_PARALLEL_COMPILE||: Total graphs: 36
2024-11-07 09:57:13.000144:  39810  INFO ||NEURON_PARALLEL_COMPILE||: Total successful compilations: 36
2024-11-07 09:57:13.000144:  39810  INFO ||NEURON_PARALLEL_COMPILE||: Total failed compilations: 0
"""
NEW_FORM_ONE_FAILED = NEW_FORM.replace("compilations: 36", "compilations: 35").replace(
    "failed compilations: 0", "failed compilations: 1")
OLD_FORM = """2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total graphs: 22
2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total successful compilations: 22
2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total failed compilations: 0
"""
NO_TODO = ("2024-11-07 10:21:02.000311:  40112  INFO ||NEURON_PARALLEL_COMPILE||: No todo hlos found in cache or "
           "hlo_tasklist, parallel_compile return before spawning workers....\n")
CACHE = "/var/tmp/neuron-compile-cache/neuronxcc-2.0.0.22266a0+a69f71e55"
RESULTS = {"compilation_summary": {"true": 2, "false": 1},
           "compilation_report": {f"{CACHE}/MODULE_1+abb26765/model.hlo.pb": {"status": True, "retry": 0,
                                                                               "compile_time": 41.2},
                                  f"{CACHE}/MODULE_2+abb26765/model.hlo.pb": {"status": False, "retry": 0,
                                                                               "compile_time": 3.5},
                                  f"{CACHE}/MODULE_3+abb26765/model.hlo.pb": {"status": True, "retry": 0,
                                                                               "compile_time": 55.0}},
           "start_time": 1730973433.1, "compilation_time": 99.7}


def lines(script: str) -> list[str]:
    return script.splitlines()


def test_one_compile_per_node_around_the_training_launch():
    spec = load_spec("llama3-70b")
    script = precompile_script(spec, "/fsx/pc/conf", "/fsx/pc/attempt-1", retry_failed=False)
    request = precompile_request(spec, Path("/fsx/pc/attempt-1/precompile.sh"))
    assert (request.nodes, request.tasks_per_node) == (16, 1)
    assert request.command.argv == ["bash", "/fsx/pc/attempt-1/precompile.sh"]
    params = slurm_parameters(SlurmCluster(exclusive=True), request)
    assert (params["nodes"], params["ntasks_per_node"], params["exclusive"]) == (16, 1, True)

    launch = lines(script)[-1]
    training = shell_line(torchrun_command(spec, CONFIG_NAME))
    # The training's own line, as `pretrain render` shows it, wrapped and capped at NxDT's compile steps.
    assert training == render_files(spec)["torchrun.sh"].strip()
    assert launch == f"neuron_parallel_compile {training} trainer.max_steps=10 2>&1 | tee -a npc.log"
    assert "export COMPILE=1" in lines(script)  # NxDT's orchestrator also forces 10 steps, no checkpoints
    assert "export NEURON_PARALLEL_COMPILE_DUMP_RESULTS=1" in lines(script)
    assert 'node_dir="/fsx/pc/attempt-1/node-$NODE_RANK"' in lines(script)
    assert 'ln -sfn /fsx/pc/conf "$node_dir/conf"' in lines(script)
    assert ('ln -sfn "$HOME/neuronx-distributed-training/examples/training_orchestrator.py" '
            '"$node_dir/training_orchestrator.py"') in lines(script)
    assert not any(line.startswith("export NEURON_CC_FLAGS") for line in lines(script))
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_each_node_expands_the_launch_with_its_own_rank():
    spec = load_spec("llama3-70b-trn2")
    argv = torchrun_command(spec, CONFIG_NAME)
    env = {"PATH": "/usr/bin:/bin", "NNODES": "8", "NODE_RANK": "3", "MASTER_ADDR": "trn2-001"}
    out = subprocess.run(["bash", "-c", "printf '%s\\n' " + shell_line(argv)], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == [a.replace("$NNODES", "8").replace("$NODE_RANK", "3").replace("$MASTER_ADDR", "trn2-001")
                   for a in argv]
    assert "trainer.num_nodes=8" in out and out[out.index("--node_rank") + 1] == "3"


@pytest.mark.parametrize("overrides, cache", [
    ([], "/home/ubuntu/neuron_cache/node-$NODE_RANK"),
    (["backend.neuron.per_node_compile_cache=false"], "/home/ubuntu/neuron_cache"),
    (["backend.neuron.compiler_cache_url=s3://bucket/neuron-cache"], "s3://bucket/neuron-cache"),
    (["backend.neuron.compiler_cache_url=~/neuron_cache"], "$HOME/neuron_cache/node-$NODE_RANK"),
])
def test_per_node_cache_unless_shared(overrides, cache):
    script = precompile_script(load_spec("megatron-gpt-6.7b", overrides), "/c", "/a", retry_failed=False)
    exports = [line for line in lines(script) if line.startswith("export NEURON_COMPILE_CACHE_URL=")]
    assert [e.split("=", 1)[1].strip('"').strip("'") for e in exports] == [cache]


def test_retry_recompiles_only_the_failed_graphs_on_the_same_nodes():
    script = precompile_script(load_spec("llama3-70b"), "/c", "/a", retry_failed=True)
    assert "export NEURON_CC_FLAGS=--retry_failed_compilation" in lines(script)

    failed = {"nodes": ["trn1-001", "trn1-002"], "failed_nodes": {"trn1-002": 1}, "unreported_nodes": []}
    clean = {"nodes": ["trn1-001", "trn1-002"], "failed_nodes": {}, "unreported_nodes": []}
    crashed = {"nodes": ["trn1-001", "node-1"], "failed_nodes": {"trn1-001": 2}, "unreported_nodes": ["node-1"]}
    assert retry_plan(1, None) == retry_plan(1, clean) and not retry_plan(1, clean).retry_failed
    assert retry_plan(2, None).retry_failed and retry_plan(2, None).nodelist == ()
    # Graphs failed last time: recompile them, on the nodes whose caches hold the rest.
    assert retry_plan(1, failed).retry_failed and retry_plan(2, failed).nodelist == ("trn1-001", "trn1-002")
    # A node that never reported may be the problem: no pinning then.
    assert retry_plan(2, crashed).retry_failed and retry_plan(2, crashed).nodelist == ()


def write_node(attempt: Path, rank: int, host: str | None, log: str | None = None, results: str | None = None):
    node = attempt / f"node-{rank}"
    node.mkdir(parents=True)
    if host:
        (node / "host").write_text(host + "\n")
    if log is not None:
        (node / "npc.log").write_text(log)
    if results is not None:
        (node / "neuron_parallel_compile_results_1730973532.8.json").write_text(results)


def test_rows_from_every_published_form_and_the_failure_decision(tmp_path):
    attempt = tmp_path / "attempt"
    # The results file wins over the log; the log's record is the same JSON, logged by npc.
    write_node(attempt, 0, "trn1-001", log=NEW_FORM, results=json.dumps(RESULTS, indent=4))
    write_node(attempt, 1, "trn1-002", log=NEW_FORM)
    write_node(attempt, 2, "trn1-003", log=OLD_FORM)
    write_node(attempt, 3, "trn1-004", log=NO_TODO)
    logged = "INFO ||NEURON_PARALLEL_COMPILE||: " + json.dumps(RESULTS, indent=4) + "\n" + NEW_FORM_ONE_FAILED
    write_node(attempt, 4, "trn1-005", log=logged)
    # A results file cut short by a killed node: the log still counts.
    write_node(attempt, 5, "trn1-006", log=NEW_FORM_ONE_FAILED, results='{"compilation_summary": {"true": 3')
    write_node(attempt, 6, "trn1-007", log="INFO ||NEURON_PARALLEL_COMPILE||: There was an error in the training "
                                           "script.\n")
    write_node(attempt, 7, None)  # never started
    # killed mid-compile: only the cache's progress lines (form of the HyperPod Llama 3 70B README)
    write_node(attempt, 8, "trn1-009", log="2025-01-17 01:16:07.000970:  42821  INFO ||NEURON_CACHE||: Current "
                                           "remaining items are 3, locked are 2, failed are 0, done are 29, total is 34\n")
    rows = compile_rows(attempt, 9)
    assert [(r["node"], r["total"], r["succeeded"], r["failed"], r["source"]) for r in rows] == [
        ("trn1-001", 3, 2, 1, "results-json"), ("trn1-002", 36, 36, 0, "summary-lines"),
        ("trn1-003", 22, 22, 0, "summary-lines"), ("trn1-004", 0, 0, 0, "all-cached"),
        ("trn1-005", 3, 2, 1, "results-json"), ("trn1-006", 36, 35, 1, "summary-lines"),
        ("trn1-007", 0, 0, 0, "none"), ("node-7", 0, 0, 0, "none"), ("trn1-009", 34, 29, 0, "cache-progress")]

    message = failure_message(rows)
    assert "trn1-001 (1 of 3), trn1-005 (1 of 3), trn1-006 (1 of 36)" in message
    assert "--retry_failed_compilation" in message
    assert "no neuron_parallel_compile results from trn1-007, node-7" in message
    assert "neuron_parallel_compile stopped before it finished on trn1-009 (29 of 34 graphs compiled)" in message
    assert attempt_record(rows) == {"nodes": [r["node"] for r in rows],
                                    "failed_nodes": {"trn1-001": 1, "trn1-005": 1, "trn1-006": 1},
                                    "unreported_nodes": ["trn1-007", "node-7", "trn1-009"]}
    assert failure_message(rows[1:4]) is None
    assert retry_plan(1, attempt_record(rows[:3])).nodelist == ("trn1-001", "trn1-002", "trn1-003")


@flow
def precompile_once(spec):
    return precompile_neuron.with_options(retries=0)(spec, "/fsx/data/my-gpt2_text_document", None)


def test_job_on_slurm_reports_the_node_that_produced_no_results(local_stack, shared_dir):
    """The real job path up to neuron_parallel_compile, which does not exist here: the node's
    directory, links and host name are in place, and the task fails naming the node."""
    # The node script checks that NxDT's orchestrator is there before its launch; an empty file
    # where the examples would be lets the job go on to the launch itself, whose program is missing.
    examples = shared_dir / "neuronx-distributed-training" / "examples"
    examples.mkdir(parents=True)
    (examples / "training_orchestrator.py").touch()
    # cpus_per_task: the local stack's node, standing in for a Trainium node, has 2 CPUs, not the runbooks' 128
    spec = load_spec("megatron-gpt-6.7b", [f"paths.root={shared_dir}", "cluster.executor=slurm",
                                           "cluster.time_limit_min=5", "cluster.startup_min=1",
                                           "backend.neuron.save_before_limit_s=60", "cluster.cpus_per_task=1",
                                           f"backend.neuron.examples_dir={examples}"])
    state = precompile_once(spec, return_state=True)
    assert state.is_failed()
    node = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, check=True).stdout.strip()
    assert f"no neuron_parallel_compile results from {node}" in state.message

    (work,) = (shared_dir / "precompile").iterdir()
    (node_dir,) = work.glob("attempt-*/node-0")
    assert (node_dir / "host").read_text().strip() == node
    assert (node_dir / "conf").resolve() == work / "conf" and (work / "conf" / "nxdt_config.yaml").exists()
    assert (node_dir / "training_orchestrator.py").readlink() == examples / "training_orchestrator.py"
    assert "neuron_parallel_compile: command not found" in (node_dir / "npc.log").read_text()
    assert json.loads((work / "attempt.json").read_text())["unreported_nodes"] == [node]
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["megatron-gpt-6-7b-precompile"])), limit=1)
    (row,) = json.loads(artifact.data)
    assert (row["node"], row["total"], row["failed"], row["source"]) == (node, 0, 0, "none")
