"""Deployments end to end on the real local stack: the stack's Prefect server, a process worker
started here, the Slurm cluster and the S3 server. Runs are triggered the way users trigger them,
with `prefect deployment run`, and judged by what the server records: states, messages, artifacts,
schedules, and what is left in `squeue`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from blocks.cluster import SlurmCluster
from deployments import stack
from deployments.demo import save_credentials_block, seed_corpus
from deployments.stack.processes import alive
from pretrain.corpus import corpus_texts
from pretrain.presets import list_presets, load_spec
from pretrain.toy_tokenizers import llama3_style
from run_summary import section_rows
from slurm_faults import CpuGroup, following
from ui_screenshot import screenshot, xychart

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))
POOL = "pretrain"  # the work pool deployments/prefect.yaml names
# Where the UI screenshots are kept for a person to look at (out/ is ignored by git).
SCREENSHOTS = REPO / "out" / "test-screenshots"
SECRET = "s3-secret-never-logged-5f0c1e"


@pytest.fixture(scope="module")
def server(local_stack, prefect_harness, tmp_path_factory):
    """The stack's Prefect server, made this process's API for the module (blocks, clients): set
    after the session's harness has set its own, whichever module ran first."""
    from prefect.settings import temporary_settings

    stack.up(components=("prefect",))
    api = {k: stack.environment()[k] for k in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")}
    env = {**os.environ, **api, "PREFECT_HOME": str(tmp_path_factory.mktemp("cli-home")),
           "SLURM_CONF": local_stack["SLURM_CONF"]}
    with temporary_settings(updates=stack.api_settings()):
        yield {"url": api["PREFECT_API_URL"], "auth": api["PREFECT_API_AUTH_STRING"], "env": env}


def prefect_cli(server, *args: str, timeout: float = 120) -> str:
    done = subprocess.run([PREFECT, *args], cwd=REPO, env=server["env"], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def deployed(server):
    """What the README tells a head node to run: the work pool, the block types, the deployments."""
    prefect_cli(server, "work-pool", "create", POOL, "--type", "process", "--overwrite")
    prefect_cli(server, "block", "register", "-m", "blocks")
    prefect_cli(server, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
    return server


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The worker's PRETRAIN_ROOT: every run of the module shares fetch, tokenize and compile cache."""
    return tmp_path_factory.mktemp("root")


def start_worker(env: dict, log: Path, queue: str) -> subprocess.Popen:
    """``prefect worker start --pool pretrain`` for one of its work queues, in its own session so
    that it and the flow-run processes it starts are stopped together."""
    env = {**env, "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "2"}
    with open(log, "w") as out:
        return subprocess.Popen([PREFECT, "worker", "start", "--pool", POOL, "--work-queue", queue], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_worker(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        # prefect 3.8's worker forwards SIGTERM to itself as SIGINT and then goes on polling:
        # a short grace, not its 30 s, before the kill
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker(deployed, root, tmp_path_factory):
    """The module's worker. It serves the pool's default queue, the one every deployment in
    prefect.yaml uses (a head node's worker serves the whole pool), so that a test can start a
    worker of its own for a queue of its own."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    proc = start_worker({**deployed["env"], "PRETRAIN_ROOT": str(root)}, log, "default")
    yield {"log": log, "pid": proc.pid, **deployed}
    stop_worker(proc)


@pytest.fixture(scope="module")
def tiny_local(worker, local_stack, tmp_path_factory) -> list[str]:
    """The demo's corpus and credentials on the stack, and overrides for a short tiny-local run."""
    seed_corpus(local_stack["PRETRAIN_S3_ENDPOINT"])
    # The S3 server takes any key; this one is distinctive, so a test can look for it where it must not be.
    save_credentials_block(local_stack["PRETRAIN_S3_ENDPOINT"], secret=SECRET)
    tokenizer = llama3_style(tmp_path_factory.mktemp("tokenizer"), corpus_texts())
    # Eager, on one rank: the compile warm-up, a training that compiles nothing and two data
    # parallel ranks are the demo's test (test_pretrain_flow); these runs show what the worker,
    # the server and the UI do with a run.
    return [f"tokenizer.path={tokenizer}", "training.train_steps=8", "training.checkpoint_interval=4",
            "training.eval_interval=4", "training.eval_iters=2", "backend.native.compile=false",
            "cluster.devices_per_node=1", "cluster.cpus_per_task=1"]  # one rank, one thread


def run_deployment(worker, name: str, parameters: dict | None = None, *, param: dict[str, str] | None = None) -> str:
    """``prefect deployment run NAME --params JSON`` or, as the README writes it, ``--param
    KEY=VALUE ...``; the flow run's id."""
    args = ["deployment", "run", name] + (["--params", json.dumps(parameters)] if parameters else [])
    args += [arg for key, value in (param or {}).items() for arg in ("--param", f"{key}={value}")]
    out = prefect_cli(worker, *args)
    return re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)


def flow_run(run_id: str):
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def wait_for(run_id: str, worker, states: set[str] | None = None, timeout: float = 600):
    """The flow run once its state is one of ``states`` (default: any final state)."""
    deadline = time.monotonic() + timeout
    while True:
        run = flow_run(run_id)
        if (run.state.name in states) if states else run.state.is_final():
            return run
        if time.monotonic() > deadline:
            pytest.fail(f"flow run {run_id} still {run.state.name} after {timeout:.0f} s; its last logs:\n"
                        + last_logs(run_id))
        time.sleep(1)


def artifacts_of(run_id: str) -> dict:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    return {a.key: a for a in found if a.key}


def logs_of(run_id: str) -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs: list = []
    with get_client(sync_client=True) as client:
        while page := client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])),
                                       limit=200, offset=len(logs)):
            logs.extend(page)
    return logs


def last_logs(run_id: str) -> str:
    """The end of a flow run's logs on the server, for a failure message."""
    return "\n".join(log.message for log in logs_of(run_id)[-30:])[-4000:]


def squeue(name: str) -> list[tuple[str, str]]:
    """(job id, state) of this user's jobs called ``name``."""
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i %T"], capture_output=True, text=True, timeout=60)
    return [tuple(line.split()) for line in out.stdout.splitlines()]


def running_job(name: str, older: set[str], timeout: float = 300) -> str:
    """The id of a running job called ``name`` that is not one of the ``older`` ones (so that a
    job another test left behind is never taken for this test's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [job for job, state in squeue(name) if state == "RUNNING" and job not in older]
        if running:
            return running[0]
        time.sleep(0.5)
    pytest.fail(f"no {name} job started in {timeout:.0f} s")


def delete_block(slug: str, name: str) -> None:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.delete_block_document(client.read_block_document_by_name(name, slug).id)
        except ObjectNotFound:
            pass


# ------------------------------------------------------------------------------ registration


def declared() -> list[dict]:
    """Every deployment the two prefect files declare, as `prefect deploy` reads them."""
    return [d for name in ("prefect.yaml", "prefect-kubernetes.yaml")
            for d in yaml.safe_load((REPO / "deployments" / name).read_text())["deployments"]]


@pytest.mark.pure
def test_every_pretrain_deployment_trains_from_scratch_but_the_continual_one():
    pretrain = {d["name"]: d["parameters"] for d in declared() if d["entrypoint"] == "flows.pretrain:pretrain"}
    assert set(pretrain) == set(list_presets()) | {"llama3-70b-continual"}
    continual = pretrain.pop("llama3-70b-continual")
    assert continual == {"preset": "llama3-70b", "cluster_block": "trn1-cluster",
                         "init_from": "hf://meta-llama/Meta-Llama-3-70B"}
    assert not [name for name, parameters in pretrain.items() if "init_from" in parameters]
    assert not [name for name in pretrain if load_spec(name).model.init_from]


@pytest.mark.pure
def test_every_runbook_preset_has_a_paused_nightly_benchmark_that_loads():
    nightly = {d["name"]: d for d in declared() if d["entrypoint"] == "flows.nightly_benchmark:nightly_benchmark"}
    assert set(nightly) == set(list_presets())
    for name, deployment in nightly.items():
        [schedule] = deployment["schedules"]
        # only tiny-local's data is on this machine; the others wait for a cluster and its blocks
        assert schedule.get("active", True) is (name == "tiny-local"), name
        assert schedule["parameters"] == deployment["parameters"] and deployment["parameters"]["preset"] == name
        assert deployment["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}
        spec = load_spec(name, deployment["parameters"].get("overrides", []))
        if name != "tiny-local":
            # the description names what to set before resuming it: the cluster block it names, the history
            description = deployment["description"]
            assert "schedule is paused" in description and "history" in description, name
            assert spec.cluster.block and spec.cluster.block in description, name


def test_deploy_registers_a_deployment_per_preset_with_a_form_and_the_nightly_schedule(deployed):
    from prefect import get_client

    # Presets whose cluster is a KubernetesCluster block deploy from their own file, to a
    # Kubernetes work pool (the flow runs as a Job there); every other one to the process pool.
    on_kubernetes = {d["parameters"]["preset"] for d in
                     yaml.safe_load((REPO / "deployments" / "prefect-kubernetes.yaml").read_text())["deployments"]}
    assert on_kubernetes == {p for p in list_presets()
                             if (load_spec(p).cluster.block or "").startswith("kubernetes-cluster/")}
    with get_client(sync_client=True) as client:
        for preset in sorted(set(list_presets()) - on_kubernetes):
            deployment = client.read_deployment_by_name(f"pretrain/{preset}")
            assert deployment.work_pool_name == POOL and deployment.parameters["preset"] == preset
        form = deployment.parameter_openapi_schema["properties"]
        assert {"preset", "overrides", "stages", "cluster_block", "init_from", "dry_run"} <= set(form)
        assert form["stages"]["anyOf"][0]["items"]["enum"] == ["fetch", "tokenize", "convert", "precompile", "image",
                                                                    "train"]
        assert form["dry_run"]["type"] == "boolean" and "rendered" in form["dry_run"]["description"]

        nightly = client.read_deployment_by_name("nightly-benchmark/tiny-local")
        [schedule] = nightly.schedules
        assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == ("0 2 * * *", "Europe/Berlin", True)
        assert schedule.parameters["preset"] == "tiny-local" and schedule.parameters["steps"] > 0
        assert nightly.global_concurrency_limit.limit == 1
        assert nightly.concurrency_options.collision_strategy.value == "CANCEL_NEW"
        # the project's block types are in the UI's catalog
        assert client.read_block_type_by_slug("slurm-cluster").name == "Slurm Cluster"
        assert client.read_block_type_by_slug("pretrain-storage-location")
    # deployments name blocks; no credential is written into the file
    text = (REPO / "deployments" / "prefect.yaml").read_text().lower()
    assert not any(word in text for word in ("secret_access_key", "password", "hf_", "token:"))


# ------------------------------------------------------------------------------ dry run


def test_llama3_70b_dry_run_publishes_every_rendered_file(worker):
    delete_block("slurm-cluster", "trn1-cluster")
    # Before the site has saved its cluster block, a dry run still previews everything.
    run = wait_for(run_deployment(worker, "pretrain/llama3-70b-continual", param={"dry_run": "true"}), worker,
                   timeout=180)
    assert run.state.is_completed(), run.state.message
    artifacts = artifacts_of(run.id)
    config = artifacts["llama3-70b-render-nxdt-config"].data
    assert "tensor_model_parallel_size: 32" in config and "pipeline_model_parallel_size: 8" in config
    # the runbook's continual pre-training (the llama3-70b preset): convert the HF weights, start from them
    assert "resume_from_checkpoint: <convert-output>/" in config and "weight_init_only: true" in config
    convert = artifacts["llama3-70b-render-convert"].data
    assert ("hf-to-nxdt --input '<hub-output:model.init_from>' --output '<convert-output>' --tp 32 --pp 8 "
            "--kv-multiplier 4 --hw-backend trn1 --fuse-qkv --verify") in convert
    # the weights, tokenizer and config.json come from the Hub, keyed by commit at run time
    downloads = artifacts["llama3-70b-render-hub-downloads"].data
    assert "model.init_from: model meta-llama/Meta-Llama-3-70B @ main" in downloads
    assert "Secret block 'huggingface-token'" in downloads
    assert "model_config: <hub-output:backend.neuron.hf_config>/config.json" in config
    assert "#SBATCH --nodes=16" in artifacts["llama3-70b-render-sbatch-train"].data
    assert "no such block yet" in artifacts["llama3-70b-render-sbatch-train"].description
    assert {"llama3-70b-render-precompile", "llama3-70b-render-torchrun", "llama3-70b-render-train-env",
            "llama3-70b-render-sbatch-tokenize", "llama3-70b-render-sbatch-convert",
            "llama3-70b-render-sbatch-precompile"} <= set(artifacts)
    assert not squeue("llama3-70b-train")  # nothing was submitted

    # With the site's block saved, the sbatch script carries its settings.
    SlurmCluster(partition="trn1", exclusive=True, setup=["source /fsx/aws_neuron_venv/bin/activate"]) \
        .save("trn1-cluster", overwrite=True)
    try:
        run = wait_for(run_deployment(worker, "pretrain/llama3-70b", param={"dry_run": "true"}), worker, timeout=180)
        sbatch = artifacts_of(run.id)["llama3-70b-render-sbatch-train"].data
        assert "#SBATCH --partition=trn1" in sbatch and "#SBATCH --exclusive" in sbatch
        assert "source /fsx/aws_neuron_venv/bin/activate" in sbatch
    finally:
        delete_block("slurm-cluster", "trn1-cluster")


# ------------------------------------------------------------------------------ a real run


def test_tiny_local_run_publishes_every_artifact_and_the_ui_draws_the_loss_curve(worker, tiny_local, root):
    run = wait_for(run_deployment(worker, "pretrain/tiny-local", {"overrides": tiny_local}), worker)
    assert run.state.is_completed(), run.state.message
    artifacts = artifacts_of(run.id)
    for stage in ("fetch", "tokenize", "dataset", "loss-curve", "loss-points", "progress", "run-summary", "devices"):
        assert f"tiny-local-{stage}" in artifacts, f"no {stage} artifact; the run has {sorted(artifacts)}"
    points = [p for p in json.loads(artifacts["tiny-local-loss-points"].data) if p["loss"] is not None]
    assert [p["step"] for p in points] == list(range(1, 9))
    summary = artifacts["tiny-local-run-summary"].data
    assert "final train loss" in summary
    # The device sampler ran beside the ranks (the CPU source here): its chart, its node's row
    # without errors, and the mean utilization in the run summary.
    devices = artifacts["tiny-local-devices"].data
    assert devices.count("xychart-beta") == 2 and re.search(r"\n\| [\w.-]+ \| 1 \| \d+ \| [\d.]+ \|.* \| 0 \|  \|", devices)
    assert re.search(r"\| mean device utilization \| [\d.]+ % \|", summary), summary
    # Every stage's Slurm jobs, each completed, in the order they ran (the module's runs share
    # their root: the nightly benchmark's may have tokenized the corpus already).
    jobs = section_rows(summary, "Jobs")
    tokenized = "nothing submitted" not in artifacts["tiny-local-tokenize"].description
    assert [stage for stage, *_ in jobs] == ["tokenize-0-of-1", "tokenize-merge"] * tokenized + ["train"], summary
    assert all(outcome == "completed" for *_, outcome in jobs), summary
    # The credentials block's secret reached S3 and nowhere else: not the run's logs, artifacts,
    # job scripts and logs, nor the worker's log.
    assert not [a.key for a in artifacts.values() if SECRET in f"{a.data} {a.description}"]
    assert not [log.message for log in logs_of(run.id) if SECRET in log.message]
    # (the pickles too: the jobs' commands and results, and any environment captured with them)
    job_files = [p for p in (root / "jobs").rglob("*") if p.is_file()]
    assert any(p.suffix == ".pkl" for p in job_files)
    assert not [p for p in job_files if SECRET.encode() in p.read_bytes()]
    assert SECRET not in worker["log"].read_text()

    # The artifact's page in the UI, as a browser draws it once logged in: the mermaid chart and the PNG.
    curve = artifacts["tiny-local-loss-curve"]
    png = SCREENSHOTS / "tiny-local-loss-curve.png"
    page = f"{worker['url'].removesuffix('/api')}/v2/artifacts/artifact/{curve.id}"
    # Without the credential the UI shows its login and draws nothing.
    login = screenshot(page, SCREENSHOTS / "tiny-local-login.png", wait_for="type=\"password\"", timeout_s=120)
    assert xychart(login) is None
    # (3 min: the suite's other workers may keep the server and the cores busy)
    dom = screenshot(page, png, timeout_s=180, auth=worker["auth"])
    chart = xychart(dom)
    assert chart is not None and "tiny-local" in chart.title
    assert chart.x_title == "step" and chart.y_title == "loss"
    assert chart.lines and len(chart.lines[0].points) > 1
    # the training loss falls over the run, and the drawn line falls with it (svg y grows downwards)
    first, last = chart.lines[0].points[0], chart.lines[0].points[-1]
    assert points[-1]["loss"] < points[0]["loss"] and last[1] > first[1]
    assert 'src="data:image/png;base64,' in dom
    # the picture first: the PNG comes before any code block (the UI draws the mermaid chart inside a <pre>)
    assert dom.index('src="data:image/png;base64,') < dom.index("<pre")
    assert png.stat().st_size > 10_000


# ------------------------------------------------------------------------------ nightly benchmark


# Four flow runs; the last one's trainer runs at 40 % of a core.
@pytest.mark.timeout(1200)
def test_nightly_benchmark_passes_against_its_baseline_and_fails_naming_a_slowdown(worker, tiny_local, root):
    """A slowed-down node (its trainer held to 40 % of a core, as a throttled instance or a noisy
    neighbour holds it) fails the gate on throughput; an unchanged one passes. The block keeps its
    name, so the benchmark's configuration, and hence its baseline, stays the same.

    The suite runs other tests beside this one on two cores: the unchanged runs' trainers get a
    large CPU share, so that what the others compute does not move their throughput."""
    SlurmCluster().save("bench-node", overwrite=True)
    # Eager mode (tiny_local): the gate compares throughput, and a CPU compile costs minutes on a
    # slowed node (the graph counts' verdicts are test_benchmark's).
    parameters = {"steps": 8, "overrides": [*tiny_local, "cluster.block=bench-node"],
                  "thresholds": {"tokens_per_s": 0.35, "step_time_ms": 0.35, "stage_s": 5.0,
                                 # not judged here: the CPU sampler reads the whole node's utilization, which
                                 # the suite's other tests share
                                 "device_util_pct": 1.0}}
    trainers = f"trainer train --config {root}/"
    steady, slowed = CpuGroup("bench-steady", shares=8192), CpuGroup("bench-slowed", quota_pct=40)
    try:
        with following(steady, trainers):
            # The deployment's concurrency limit: a run that finds another one going is cancelled, not
            # queued. Both are started at once: a started run that waited for the first to be Running
            # was once picked up only after the first had finished, and rightly ran.
            started = [run_deployment(worker, "nightly-benchmark/tiny-local", parameters) for _ in range(2)]
            ended = {run_id: wait_for(run_id, worker) for run_id in started}
            assert sorted(run.state.name for run in ended.values()) == ["Cancelled", "Completed"], \
                {run_id: (run.state.name, run.state.message) for run_id, run in ended.items()}
            first = next(run_id for run_id, run in ended.items() if run.state.is_completed())

            second = wait_for(run_deployment(worker, "nightly-benchmark/tiny-local", parameters), worker)
        assert second.state.is_completed(), second.state.message
        table = {row["metric"]: row for row in json.loads(artifacts_of(second.id)["tiny-local-benchmark"].data)}
        assert table["tokens_per_s"]["verdict"] == "ok" and table["tokens_per_s"]["baseline"] is not None

        with following(slowed, trainers):
            slow = wait_for(run_deployment(worker, "nightly-benchmark/tiny-local", parameters), worker)
    finally:
        steady.close()
        slowed.close()
        delete_block("slurm-cluster", "bench-node")
    assert slow.state.is_failed()
    assert "regressed" in slow.state.message and "tokens_per_s" in slow.state.message, slow.state.message
    artifacts = artifacts_of(slow.id)
    verdicts = {row["metric"]: row["verdict"] for row in json.loads(artifacts["tiny-local-benchmark"].data)}
    assert verdicts["tokens_per_s"] == "REGRESSED" and verdicts["final_loss"] == "ok"
    trend = artifacts["tiny-local-benchmark-trend"].data
    assert "xychart-beta" in trend and trend.count("| passed |") == 2 and "| regressed: " in trend

    # The records outlive Prefect's database: one JSON file per run beside the outputs.
    records = [json.loads(p.read_text()) for p in sorted((root / "benchmarks" / "tiny-local").glob("*.json"))]
    assert [r["flow_run_id"] for r in records] == [first, str(second.id), str(slow.id)]
    assert [r["passed"] for r in records] == [True, True, False]
    assert "tokens_per_s" in records[-1]["regressions"]


# ------------------------------------------------------------------------------ cancel and crash


def endless(tiny_local: list[str], name: str, *extra: str) -> list[str]:
    """Overrides for a tiny-local run that trains until it is stopped, under a name of its own:
    its train job, ``{name}-train``, is never taken for another test's (make test runs a second
    module beside this one)."""
    return [*tiny_local, f"name={name}", "training.train_steps=100000", *extra]


def gone_within(job: str, job_name: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while job in dict(squeue(job_name)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return job not in dict(squeue(job_name))


def test_cancelling_a_running_flow_cancels_its_slurm_job(worker, tiny_local, clean_queue):
    clean_queue.append(job_name := f"{(name := 'cancel-via-worker')}-train")
    older = set(dict(squeue(job_name)))
    run_id = run_deployment(worker, "pretrain/tiny-local", {"overrides": endless(tiny_local, name)})
    job = running_job(job_name, older)
    prefect_cli(worker, "flow-run", "cancel", run_id)
    assert gone_within(job, job_name, 30), ("the Slurm job outlived its cancelled flow run by 30 s; its last logs:\n"
                                            + last_logs(run_id))
    assert wait_for(run_id, worker, timeout=120).state.name == "Cancelled"


def test_cancelling_a_flow_run_started_without_a_worker_cancels_its_slurm_job(worker, tiny_local, root, tmp_path,
                                                                            clean_queue):
    """`pretrain run` from a terminal has no worker to signal it: the flow process itself sees
    the cancel on the server and cancels its job."""
    # the stack's server keeps the flow runs of earlier sessions: the name finds this one
    clean_queue.append(job_name := f"{(name := f'cancel-without-worker-{uuid.uuid4().hex[:8]}')}-train")
    older = set(dict(squeue(job_name)))
    marker = f"name={name}"
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("pretrain")), "run", "tiny-local",
                                 *[a for o in endless(tiny_local, name) for a in ("--set", o)]],
                                cwd=REPO, env={**worker["env"], "PRETRAIN_ROOT": str(root)}, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        job = running_job(job_name, older)
        (run_id,) = [str(r.id) for r in running_flow_runs() if marker in r.parameters.get("overrides", [])]
        prefect_cli(worker, "flow-run", "cancel", run_id)
        assert gone_within(job, job_name, 30), "the Slurm job outlived its cancelled flow run by 30 s:\n" + log.read_text()[-4000:]
        assert proc.wait(timeout=60) == 130
        assert "cancelled Slurm job(s) " + job in log.read_text()
        assert flow_run(run_id).state.name == "Cancelled"
        # The train task says so too: Cancelled in the UI, not Failed with a traceback.
        assert task_states(run_id).get("train") == "Cancelled", task_states(run_id)
    finally:
        proc.kill()


def task_states(run_id: str, settle_s: float = 15) -> dict[str, str]:
    """Each task's last state name in a flow run, by task name (task states arrive as events)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + settle_s
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        states = {r.name.rsplit("-", 1)[0]: r.state.name for r in runs if r.state is not None}
        if all(s not in ("Running", "Pending") for s in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(1)


def running_flow_runs() -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))


def test_a_slurm_side_failure_is_the_flow_runs_state_message(worker, tiny_local, clean_queue):
    clean_queue.append(job_name := f"{(name := 'slurm-side-failure')}-train")
    older = set(dict(squeue(job_name)))
    run_id = run_deployment(worker, "pretrain/tiny-local",
                            {"overrides": endless(tiny_local, name, "backend.native.max_attempts_without_checkpoint=0")})
    job = running_job(job_name, older)
    subprocess.run(["scancel", job], check=True, timeout=60)
    run = wait_for(run_id, worker, timeout=180)
    assert run.state.is_failed()
    assert "CANCELLED" in run.state.message and job in run.state.message, run.state.message


def test_a_killed_flow_process_leaves_no_slurm_job(worker, tiny_local, clean_queue):
    """SIGKILL runs no cleanup: the job cancels itself once its lease is no longer renewed."""
    SlurmCluster(lease_timeout_s=10).save("short-lease", overwrite=True)
    clean_queue.append(job_name := f"{(name := 'killed-flow')}-train")
    older = set(dict(squeue(job_name)))
    try:
        run_id = run_deployment(worker, "pretrain/tiny-local",
                                {"overrides": endless(tiny_local, name, "cluster.block=short-lease")})
        job = running_job(job_name, older)
        os.kill(flow_run_process(run_id, worker["pid"]), signal.SIGKILL)
        assert gone_within(job, job_name, 60)
        assert wait_for(run_id, worker, timeout=120).state.name == "Crashed"
    finally:
        delete_block("slurm-cluster", "short-lease")


def test_a_killed_worker_leaves_the_flow_run_in_charge_of_its_slurm_job(worker, tiny_local, root, tmp_path,
                                                                         clean_queue):
    """A worker that dies (the OOM killer, say) takes nothing with it: the flow-run process it
    started goes on renewing its job's lease, and a cancel from the API still ends the job."""
    from prefect import get_client
    from prefect.exceptions import ObjectAlreadyExists

    SlurmCluster(lease_timeout_s=10).save("short-lease", overwrite=True)
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):  # the stack outlives a run
        client.create_work_queue("worker-crash", work_pool_name=POOL)
    crashing = start_worker({**worker["env"], "PRETRAIN_ROOT": str(root)}, tmp_path / "worker.log", "worker-crash")
    clean_queue.append(job_name := f"{(name := 'killed-worker')}-train")
    older = set(dict(squeue(job_name)))
    try:
        with get_client(sync_client=True) as client:
            run_id = str(client.create_flow_run_from_deployment(
                client.read_deployment_by_name("pretrain/tiny-local").id, work_queue_name="worker-crash",
                parameters={"preset": "tiny-local",
                            "overrides": endless(tiny_local, name, "cluster.block=short-lease")}).id)
        job = running_job(job_name, older)
        flow_process = flow_run_process(run_id, crashing.pid)
        os.kill(crashing.pid, signal.SIGKILL)
        crashing.wait(timeout=30)
        killed_at = datetime.now(timezone.utc)
        time.sleep(20)  # twice the lease: a job whose lease lapsed would be cancelling itself by now
        assert dict(squeue(job_name)).get(job) == "RUNNING", last_logs(run_id)
        assert alive(flow_process) and flow_run(run_id).state.name == "Running"
        # The flow process went on logging (the training job's lines) after its worker was gone.
        assert any(log.timestamp > killed_at for log in logs_of(run_id)), last_logs(run_id)
        prefect_cli(worker, "flow-run", "cancel", run_id)
        assert gone_within(job, job_name, 30), "the Slurm job outlived its cancelled flow run by 30 s"
        assert wait_for(run_id, worker, timeout=120).state.name == "Cancelled"
    finally:
        with contextlib.suppress(ProcessLookupError):  # the flow-run process, if the test failed before its end
            os.killpg(crashing.pid, signal.SIGKILL)
        delete_block("slurm-cluster", "short-lease")


def flow_run_process(run_id: str, worker_pid: int) -> int:
    """The pid of the process the worker started for ``run_id``: its child with the run's id in
    its environment (the Slurm job's processes inherit that environment too, but not the parent)."""
    marker = f"PREFECT__FLOW_RUN_ID={run_id}".encode()
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0")
                    and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == worker_pid):
                return int(proc.name)
        except OSError:
            continue
    pytest.fail(f"no child of the worker has {marker.decode()}")


# ------------------------------------------------------------------------- the demo's inputs


def test_demo_inputs_only_prepares_tiny_local_for_the_stacks_server(server, tmp_path):
    """`pretrain demo --inputs-only` sets up what `prefect deployment run pretrain/tiny-local`
    reads here: the corpus on the local S3 server, its credentials block on the server the CLI
    talks to, and the tokenizer; it runs nothing."""
    import boto3
    from prefect_aws import AwsCredentials

    from deployments.demo import BUCKET, CREDENTIALS_BLOCK

    delete_block("aws-credentials", CREDENTIALS_BLOCK)
    env = {**server["env"], "HOME": str(tmp_path), "PRETRAIN_STACK_DIR": str(stack.stack_dir())}
    out = subprocess.run([str(Path(sys.executable).with_name("pretrain")), "demo", "--inputs-only"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    block = AwsCredentials.load(CREDENTIALS_BLOCK)
    endpoint = block.aws_client_parameters.endpoint_url
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="demo",
                      aws_secret_access_key="demo")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="corpus/")["Contents"]]
    assert keys == ["corpus/part-00000.jsonl", "corpus/part-00001.jsonl.zst"]
    assert (tmp_path / ".pretrain" / "tokenizers" / "tiny-local" / "tokenizer.json").is_file()
    assert not list((tmp_path / ".pretrain").glob("data/*"))  # nothing ran
