"""precompile: one job (Slurm, or a Kubernetes PyTorchJob) over the training's node count that fills the compile cache, so
that training finds every graph there. Native backend: a short torch.compile warm-up of the
trainer itself (:func:`precompile_native`). Neuron backend: ``neuron_parallel_compile`` around
the training launch (:func:`precompile_neuron`).

Each node runs what NxDT's train.sh runs with ``COMPILE=1`` (``examples/train.sh`` and
``examples/training_orchestrator.py`` in aws-neuron/neuronx-distributed-training): the same
torchrun line and conf YAML as the train stage, capped at 10 steps, in a directory of its own
where it leaves its log and the results JSON. The task turns each node's results into a table
(node, total, succeeded, failed) and fails when a graph failed to compile; Prefect's retry then
recompiles only the failed graphs (``--retry_failed_compilation``) on the same nodes.

Work directory, on the shared filesystem (keyed by the config and the launch, so a later run of
the same spec finds the earlier attempt's outcome)::

    <paths.root>/precompile/<key>/
        conf/nxdt_config.yaml        the conf both precompile and train load
        attempt.json                 outcome of the latest attempt: nodes, failures
        attempt-<time>-<id>/precompile.sh
        attempt-<time>-<id>/node-<rank>/host, npc.log, neuron_parallel_compile_results_<t>.json
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger
from prefect.runtime import task_run

from pretrain import manifest
from jobs.node import Command
from pretrain.neuron_compile import CompileSummary, from_results, parse_npc_log
from pretrain.checkpoint_interval import planned
from pretrain.spec import PretrainSpec
from tasks.executor import cluster_for, failure_nodes, job_folder, on_nodes, run_job
from jobs.contract import JobFailed, JobRequest, ends_cancelled, stage_request
from render import native
from render.dataset_files import eod_id
from render.nxdt import config_yaml, nxdt_config, precompile_command
from render.nxdt_scripts import (CONFIG_NAME, NPC_LOG, compile_environment, node_name,
                                 precompile_script)
from tasks.artifacts import artifact_key, graph_totals, native_compile_rows, retryable

RESULTS_GLOB = "neuron_parallel_compile_results_*.json"  # NEURON_PARALLEL_COMPILE_DUMP_RESULTS, in the CWD
ATTEMPT_RECORD = "attempt.json"


class PrecompileFailed(RuntimeError):
    pass


# ---------------------------------------------------------------- the job, from the spec

def precompile_request(spec: PretrainSpec, script: Path) -> JobRequest:
    """One task per node, like ``srun ./train.sh``: each node runs its own neuron_parallel_compile."""
    return stage_request(spec, f"{spec.name}-precompile", Command(["bash", str(script)]))


def work_key(spec: PretrainSpec, config: dict) -> str:
    """Everything that decides which graphs are compiled, and where they are cached."""
    return manifest.stable_hash({"config": config, "launch": precompile_command(spec, CONFIG_NAME),
                                 "env": compile_environment(spec, retry_failed=False),
                                 "examples": spec.backend.neuron.examples_dir})[:16]


# ---------------------------------------------------------------- each node's results

def node_summary(node_dir: Path) -> CompileSummary:
    """The results JSON when the node wrote one, else its log (JSON record, summary lines, no todo)."""
    results = sorted(node_dir.glob(RESULTS_GLOB), key=lambda p: p.stat().st_mtime)
    if results:
        try:
            return from_results(json.loads(results[-1].read_text()))
        except ValueError:  # cut short by a killed node; the log holds the same record when it got that far
            pass
    log = node_dir / NPC_LOG
    return parse_npc_log(log.read_text(errors="replace")) if log.exists() else CompileSummary()


def compile_rows(attempt_dir: Path, nodes: int) -> list[dict]:
    """One row per node in rank order: node, total, succeeded, failed, and where the counts came from."""
    rows = []
    for rank in range(nodes):
        node_dir = attempt_dir / f"node-{rank}"
        rows.append(node_summary(node_dir).as_row(node_name(node_dir)))
    return rows


def graph_counts(rows: list[dict]) -> dict[str, int]:
    """The nodes' counts together: graphs, graphs compiled and graphs that failed."""
    return {k: sum(r[k] for r in rows) for k in ("total", "succeeded", "failed")}


def failure_message(rows: list[dict]) -> str | None:
    """Why the attempt must be retried, naming nodes and counts; None when every node is done."""
    problems = []
    failed = [r for r in rows if r["failed"]]
    if failed:
        problems.append("graph compilations failed on " + ", ".join(
            f"{r['node']} ({r['failed']} of {r['total']})" for r in failed)
            + "; the retry recompiles only those graphs (--retry_failed_compilation)")
    silent = [r["node"] for r in rows if r["source"] == "none"]
    if silent:
        problems.append(f"no neuron_parallel_compile results from {', '.join(silent)}: the trial run failed or "
                        f"never started there (see {NPC_LOG} in each node's directory)")
    cut = [r for r in rows if _cut_short(r)]
    if cut:
        problems.append("neuron_parallel_compile stopped before it finished on " + ", ".join(
            f"{r['node']} ({r['succeeded']} of {r['total']} graphs compiled)" for r in cut))
    return "; ".join(problems) or None


def _cut_short(row: dict) -> bool:
    """Results short of the node's graphs: a run cut off before its summary reports only its
    cache progress."""
    return row["succeeded"] + row["failed"] < row["total"]


def _unfinished(row: dict) -> bool:
    return row["source"] == "none" or _cut_short(row)


@dataclass(frozen=True)
class RetryPlan:
    retry_failed: bool
    nodelist: tuple[str, ...]


def retry_plan(run_count: int, previous: dict | None) -> RetryPlan:
    """A retry, or a new run after an attempt with failed graphs, recompiles the failed graphs
    (a cached failure is otherwise skipped and fails training instead). When graphs failed on
    nodes that all reported, the retry goes to those nodes: their caches hold the rest, and the
    nodes themselves are fine."""
    graphs_failed = bool(previous and previous["failed_nodes"])
    pin = graphs_failed and not previous["unreported_nodes"]
    return RetryPlan(run_count > 1 or graphs_failed, tuple(previous["nodes"]) if pin else ())


def attempt_record(rows: list[dict]) -> dict:
    return {"nodes": [r["node"] for r in rows], "failed_nodes": {r["node"]: r["failed"] for r in rows if r["failed"]},
            "unreported_nodes": [r["node"] for r in rows if _unfinished(r)]}


# ---------------------------------------------------------------- the task

@task(name="precompile", retries=2, retry_delay_seconds=30, retry_condition_fn=retryable)
@ends_cancelled
def precompile_neuron(spec: PretrainSpec, dataset: str, checkpoint: str | None = None) -> dict:
    """Compile every training graph into the cache on the nodes training will use.

    ``dataset`` and ``checkpoint`` are what the train stage gives the NxDT config: the HF Arrow
    directory (Llama) or Megatron prefix (GPT), and the converted weights or None. Returns the
    nodes in rank order (pin training to them), the conf directory and config name for the torchrun line,
    the ``NEURON_COMPILE_CACHE_URL`` training must export, and the graph counts.
    """
    logger = get_run_logger()
    config = nxdt_config(planned(spec), dataset, checkpoint)
    work = Path(spec.paths.root) / "precompile" / work_key(spec, config)
    conf_dir = work / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / f"{CONFIG_NAME}.yaml").write_text(config_yaml(config))

    record_path = work / ATTEMPT_RECORD
    plan = retry_plan(task_run.run_count, json.loads(record_path.read_text()) if record_path.exists() else None)
    attempt = work / f"attempt-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    attempt.mkdir()
    script = attempt / "precompile.sh"
    script.write_text(precompile_script(spec, str(conf_dir), str(attempt), plan.retry_failed))

    cluster = cluster_for(spec)
    if plan.nodelist:
        cluster = on_nodes(cluster, plan.nodelist)
    logger.info("precompile in %s%s%s", attempt, " recompiling failed graphs" if plan.retry_failed else "",
                f" on {','.join(plan.nodelist)}" if plan.nodelist else "")
    job_error = None
    try:
        run_job(precompile_request(spec, script), cluster, job_folder(spec, cluster))
    except JobFailed as exc:  # failed graphs end the job non-zero too; the node results say which
        job_error = exc

    rows = compile_rows(attempt, spec.cluster.nodes)
    record_path.write_text(json.dumps(attempt_record(rows)))
    cache_url = compile_environment(spec, retry_failed=False)["NEURON_COMPILE_CACHE_URL"]
    create_table_artifact(rows, key=artifact_key(spec.name, "precompile"),
                          description=f"neuron_parallel_compile graphs per node, attempt {task_run.run_count} "
                                      f"({attempt}); cache {cache_url}")
    if (problem := failure_message(rows)) is not None:
        raise PrecompileFailed(problem + (f"\n{job_error}" if job_error else "")) from job_error
    if job_error is not None:
        raise job_error
    return {"nodes": [r["node"] for r in rows], "config_dir": str(conf_dir), "config_name": CONFIG_NAME,
            "compile_cache_url": cache_url,
            "graphs": graph_counts(rows),
            # neuron_parallel_compile reports what it compiled, not what its cache already held
            "rows": [{"node": r["node"], "compiled": r["succeeded"], "from cache": None} for r in rows],
            "work_dir": str(work)}


# ---------------------------------------------------------------- native backend

@task(name="precompile-native", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def precompile_native(spec: PretrainSpec, dataset: str, data_dir: str) -> dict:
    """A short torch.compile warm-up on the training's node count that fills the shared compile
    cache (inductor's; Neuron's on Trainium), so training compiles nothing itself. Returns the
    nodes it ran on (pin training to them: a node-local cache is only warm there) and the counts."""
    logger = get_run_logger()
    work = Path(spec.paths.root) / "precompile" / f"native-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    config = native.train_config(planned(spec), dataset=dataset, run_dir=str(work), eod_id=eod_id(spec, data_dir),
                                 steps=spec.backend.native.precompile_steps, warmup_only=True)
    (work / "train.json").write_text(json.dumps(config, indent=2))
    record = work / "record.json"
    command = Command(native.torchrun_command(spec, str(work / "train.json"), str(record), python=sys.executable),
                      env=native.environment(spec))
    cluster = cluster_for(spec)
    logger.info("precompile: %d-step torch.compile warm-up into %s", config["steps"], native.compile_cache_dir(spec))
    try:
        run_job(stage_request(spec, f"{spec.name}-precompile", command), cluster, job_folder(spec, cluster))
    except JobFailed as failure:
        rows = [{"node": node, "graphs traced": 0, "graph breaks": 0, "compiled": 0, "from cache": 0, "failed": 1}
                for node in failure_nodes(failure, cluster)]
        create_table_artifact(rows, key=artifact_key(spec.name, "precompile"),
                              description="torch.compile warm-up failed; see the task log")
        raise
    rows = native_compile_rows(record)
    create_table_artifact(rows, key=artifact_key(spec.name, "precompile"),
                          description=f"torch.compile graphs per node in the warm-up ({config['steps']} steps); "
                                      f"cache {native.compile_cache_dir(spec)}")
    shutil.rmtree(work, ignore_errors=True)
    return {"nodes": [r["node"] for r in rows], "graphs": graph_totals(rows), "rows": rows}
