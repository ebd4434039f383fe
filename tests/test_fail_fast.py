"""Failing fast where the hardware or the cluster cannot do the job: the preflight, the local
executor's refusals, pending reasons Slurm never satisfies, and the retry condition."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prefect import flow, task
from prefect.states import Failed

from blocks.cluster import SlurmCluster
from jobs.node import Command
from jobs.nodes import gres_gpus, parse_partition
from jobs.pending import WAITING_LOG_EVERY_S, QueueWatch, never_runs, queue_reason
from jobs.contract import ClusterMismatch, JobFailed, JobRequest
from jobs.slurm import SubmissionRefused, batch_script, local_refusal, run_job, submit
from pretrain.presets import load_spec
from tests.model_that_fits import MODEL_THAT_FITS
from tasks.artifacts import retryable
from tasks.preflight import PreflightFailed, preflight, probe

SLURM = SlurmCluster(executor="slurm")
LOCAL = SlurmCluster(executor="local")


# ---------------------------------------------------------------- pure rules


@pytest.mark.pure
@pytest.mark.parametrize("reason, never", [
    ("PartitionNodeLimit", True), ("PartitionConfig", True), ("PartitionTimeLimit", True),
    ("QOSMaxNodePerJobLimit", True), ("AssocMaxCpuPerJobLimit", True), ("QOSMaxGRESPerNode", True),
    ("InvalidAccount", True),
    # only waiting: busy nodes, other jobs first, a partition down for now, aggregate limits
    ("Resources", False), ("Priority", False), ("PartitionDown", False), ("None", False),
    ("AssocGrpCpuLimit", False), ("QOSGrpNodeLimit", False), ("QOSMaxJobsPerUserLimit", False),
    ("ReqNodeNotAvail, UnavailableNodes:", False),
])
def test_pending_reasons_slurm_never_satisfies(reason, never):
    assert (never_runs(reason, all_out_of_service=lambda nodes: False) is not None) is never


@pytest.mark.pure
def test_req_node_not_avail_fails_only_when_every_named_node_is_out_of_service():
    down = {"trn1-[1-2]"}  # as the node list names them; out_of_service asks sinfo about each node
    assert "trn1-[1-2]" in never_runs("ReqNodeNotAvail, UnavailableNodes:trn1-[1-2]", all_out_of_service=down.__contains__)
    # a long backfill cycle names nodes that are fine: that is waiting
    assert never_runs("ReqNodeNotAvail, UnavailableNodes:trn1-[1-3]", all_out_of_service=down.__contains__) is None


@pytest.mark.pure
def test_partition_shape_from_sinfo():
    nodes = ("p5-1|idle|gpu:h100:8(S:0-1)|192|gpu*\np5-2|down*|gpu:h100:8(S:0-1)|192|gpu*\n"
             "p5-3|drained|gpu:4|96|gpu*\ncpu-1|idle|(null)|2|cpu\n")
    sizes = "gpu*|1-16\ncpu|1-infinite\n"
    gpu = parse_partition(None, nodes, sizes)
    assert (gpu.name, len(gpu.nodes), gpu.usable, gpu.max_nodes) == ("gpu", 3, ["p5-1"], 16)
    assert gpu.gpus == {"p5-1": 8, "p5-2": 8, "p5-3": 4}
    assert gpu.cpus == {"p5-1": 192, "p5-2": 192, "p5-3": 96}
    assert parse_partition("cpu", nodes, sizes).max_nodes is None
    assert parse_partition("trn1", nodes, sizes) is None
    assert gres_gpus("gpu:a100:4,nvme:1") == 4 and gres_gpus("(null)") == 0


@pytest.mark.pure
def test_multi_node_jobs_wait_for_all_their_nodes(tmp_path):
    def sbatch(nodes: int) -> str:
        return batch_script(SLURM, JobRequest("x", Command(["true"]), time_limit_min=5, nodes=nodes), tmp_path)

    assert "#SBATCH --wait-all-nodes=1" in sbatch(16)
    assert "--wait-all-nodes" not in sbatch(1)


@pytest.mark.pure
def test_every_trainium_preset_precompiles_and_trains_on_whole_nodes_with_the_runbooks_cpus():
    from pretrain.presets import list_presets
    from flows.dry_run import render_files

    trainium = [p for p in list_presets() if load_spec(p).backend.trainium]
    assert {"llama3-70b", "llama3-70b-trn2", "megatron-gpt-6.7b", "llama3-70b-trn2-torchneuron"} <= set(trainium)
    for preset in trainium:
        spec = load_spec(preset)
        files = render_files(spec)
        launched = [files[f] for f in ("sbatch_precompile.sh", "sbatch_train.sh") if f in files]
        assert launched, preset
        for sbatch in launched:
            assert "#SBATCH --exclusive" in sbatch and "#SBATCH --cpus-per-task=128" in sbatch, preset
            assert ("#SBATCH --wait-all-nodes=1" in sbatch) == (spec.cluster.nodes > 1), preset
        # the pipeline's own one-node jobs share nodes, with the spec's CPUs
        for side in ("sbatch_tokenize.sh", "sbatch_convert.sh"):
            if side in files:
                assert "--exclusive" not in files[side] and "--cpus-per-task" not in files[side], (preset, side)
    # a site whose nodes run other jobs beside training turns it off in its block
    shared = render_files(load_spec("llama3-70b"), SlurmCluster(executor="slurm", exclusive=False))
    assert "--exclusive" not in shared["sbatch_train.sh"] and "--cpus-per-task=128" in shared["sbatch_train.sh"]


@pytest.mark.pure
def test_a_one_node_cpu_job_shares_its_node_and_a_multi_node_one_takes_them_whole():
    """tiny-local's jobs run on the local stack's one 2-CPU node beside the suite's other jobs."""
    from flows.dry_run import render_files

    alone = render_files(load_spec("tiny-local"))
    assert "--exclusive" not in alone["sbatch_train.sh"] and "--exclusive" not in alone["sbatch_precompile.sh"]
    wide = render_files(load_spec("tiny-local", ["cluster.nodes=2"]))
    for sbatch in (wide["sbatch_train.sh"], wide["sbatch_precompile.sh"]):
        assert "#SBATCH --exclusive" in sbatch and "#SBATCH --cpus-per-task=2" in sbatch
    assert "--exclusive" not in wide["sbatch_tokenize.sh"]


@pytest.mark.pure
def test_the_preflight_checks_the_nodes_have_the_cpus_training_asks_for(monkeypatch):
    from jobs.nodes import Partition
    from tasks import preflight as checks

    def nodes_of(cpus: int) -> Partition:
        return Partition("trn1", {f"trn1-{i}": "idle" for i in range(16)}, {f"trn1-{i}": 0 for i in range(16)},
                         {f"trn1-{i}": cpus for i in range(16)}, None)

    spec = load_spec("llama3-70b")
    monkeypatch.setattr(checks, "read_partition", lambda name: nodes_of(128))
    rows = {r["check"]: r for r in checks.partition_rows(spec, SlurmCluster(partition="trn1"))}
    assert rows["partition trn1: CPUs"]["ok"]
    monkeypatch.setattr(checks, "read_partition", lambda name: nodes_of(96))
    row = {r["check"]: r for r in checks.partition_rows(spec, SlurmCluster(partition="trn1"))}["partition trn1: CPUs"]
    assert not row["ok"] and row["found"] == "0 node(s) with 128 or more CPUs"
    assert "128 CPUs per task" in row["fix"] and "cluster.cpus_per_task" in row["fix"]


@pytest.mark.pure
def test_local_executor_refuses_many_nodes_and_more_memory_than_is_free():
    assert "the local executor runs 1 node, not 16" in str(local_refusal("train", 16))
    assert "GiB free" in str(local_refusal("convert", 1, 1 << 50))
    assert local_refusal("tokenize", 1, 1 << 20) is None
    assert not ClusterMismatch.retryable


# ---------------------------------------------------------------- the local executor, before anything runs


def test_a_run_sized_for_a_cluster_is_refused_before_anything_runs(tmp_path):
    """No Slurm controller: a 2-node run fails in its first task, naming the reason; fetch never starts."""
    from flows.pretrain import pretrain

    state = pretrain("tiny-local", overrides=[f"paths.root={tmp_path}", "cluster.executor=local", "cluster.nodes=2"],
                     return_state=True)
    assert state.is_failed()
    assert "the local executor runs 1 node, not 2 (cluster.nodes=2)" in state.message
    assert not (tmp_path / "fetch").exists()


def test_a_conversion_larger_than_free_memory_is_refused_on_the_local_executor(tmp_path):
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    with open(checkpoint / "model.safetensors", "wb") as f:
        f.truncate(1 << 42)  # a 4 TiB checkpoint, sparse: its size is what the conversion would read
    spec = load_spec("megatron-gpt-6.7b", [f"paths.root={tmp_path}", "cluster.executor=local",
                                           f"model.init_from={checkpoint}"])

    @flow
    def check():
        return preflight(spec, ["convert"])

    state = check(return_state=True)
    assert state.is_failed() and "needs 4096.0 GiB of memory" in state.message
    assert "local executor" in state.message


# ---------------------------------------------------------------- the retry condition


def attempts_of(body, retries: int = 2) -> tuple[int, str]:
    """How many times a stage-like task ran ``body`` under Prefect's retries and the house's
    retry condition, and the final message."""
    runs = []

    @task(retries=retries, retry_delay_seconds=0, retry_condition_fn=retryable)
    def stage():
        runs.append(1)
        body()

    @flow
    def one_stage():
        return stage()

    state = one_stage(return_state=True)
    assert state.is_failed()
    return len(runs), state.message


def test_a_spec_the_local_executor_cannot_run_is_not_retried(tmp_path):
    started = time.monotonic()
    count, message = attempts_of(lambda: run_job(JobRequest("wide", Command(["true"]), time_limit_min=2, nodes=16),
                                                 LOCAL, tmp_path))
    assert count == 1 and "the local executor runs 1 node, not 16" in message
    assert time.monotonic() - started < 30


def test_a_command_missing_on_the_node_is_not_retried_but_a_failing_one_is(local_stack, tmp_path):
    count, message = attempts_of(lambda: run_job(JobRequest("no-tool", Command(["bash", "-c", "no-such-tool-x"]),
                                                            time_limit_min=2), SLURM, tmp_path, poll_s=0.5))
    assert count == 1 and "exit code 127" in message
    count, _ = attempts_of(lambda: run_job(JobRequest("flaky", Command(["bash", "-c", "exit 3"]), time_limit_min=2),
                                           SLURM, tmp_path, poll_s=0.5), retries=1)
    assert count == 2


# ---------------------------------------------------------------- pending for ever


@contextlib.contextmanager
def partition(name: str, *settings: str):
    subprocess.run(["scontrol", "delete", f"PartitionName={name}"], capture_output=True)  # a failed run's
    subprocess.run(["scontrol", "create", f"PartitionName={name}", "Nodes=ALL", "MaxTime=INFINITE", *settings],
                   check=True)
    try:
        yield
    finally:
        subprocess.run(["scancel", "-p", name], check=False)
        deadline = time.monotonic() + 60  # a partition is deleted once its jobs are gone
        while subprocess.run(["scontrol", "delete", f"PartitionName={name}"], capture_output=True).returncode:
            assert time.monotonic() < deadline, f"partition {name} kept its jobs"
            time.sleep(0.5)


def test_a_job_its_partition_can_never_run_fails_with_the_reason(local_stack, tmp_path):
    """The job is queued while its partition is down; then the partition loses its node, so the
    job asks for more nodes than the partition has. It fails with Slurm's reason, and is gone."""
    name = "ff-shrunk"

    def shrink(job) -> None:
        subprocess.run(["scontrol", "update", f"PartitionName={name}", "Nodes=", "State=UP"], check=True)

    with partition(name, "State=DOWN"):
        started = time.monotonic()
        with pytest.raises(JobFailed) as info:
            run_job(JobRequest("never", Command(["true"]), time_limit_min=2),
                    SlurmCluster(executor="slurm", partition=name), tmp_path, poll_s=0.5, on_submit=shrink)
        waited = time.monotonic() - started
        assert subprocess.run(["squeue", "-h", "-j", info.value.job_id], capture_output=True,
                              text=True).stdout.strip() == ""
    assert waited < 60
    assert info.value.state == "PENDING" and not info.value.retryable
    assert "PartitionConfig, which Slurm will never satisfy" in str(info.value)


def test_a_job_that_only_waits_says_why_and_for_how_long_at_each_interval(local_stack, caplog):
    """A job in a partition that is down for now waits (PartitionDown): it is never failed, and
    its reason and wait are logged once per WAITING_LOG_EVERY_S. The watch's clock is advanced
    by hand, so the test waits seconds, not the minutes between two logs."""
    name, now = "ff-waiting", [0.0]
    logger = logging.getLogger("test-queue-watch")
    with partition(name, "State=DOWN"):
        job = subprocess.run(["sbatch", "--parsable", "-p", name, "-o", "/dev/null", "--wrap", "true"],
                             capture_output=True, text=True, check=True).stdout.strip()
        deadline = time.monotonic() + 30  # until the controller's scheduling pass has given its reason
        while queue_reason(job) != "PartitionDown":
            assert time.monotonic() < deadline, f"job {job} pending with reason {queue_reason(job)!r}"
            time.sleep(0.5)
        watch = QueueWatch(job, "waiting", logger, clock=lambda: now[0])
        with caplog.at_level(logging.INFO, logger=logger.name):
            for polls in range(9):  # two and a bit intervals
                now[0] = polls * WAITING_LOG_EVERY_S / 4
                assert watch.pending() is None
    minutes = [f"{WAITING_LOG_EVERY_S * k / 60:.0f}" for k in (1, 2)]
    assert [r.getMessage() for r in caplog.records if r.name == logger.name] == [
        f"job {job} (waiting) has waited {m} min in the queue: PartitionDown" for m in minutes]


# ---------------------------------------------------------------- the preflight on the local cluster


def neuron_spec(root: Path, examples: Path, nodes: int = 1):
    # cpus_per_task: the local stack's node, standing in for a Trainium node, has 2 CPUs, not the runbooks' 128
    return load_spec("megatron-gpt-6.7b", [*MODEL_THAT_FITS, f"paths.root={root}", "cluster.executor=slurm", "cluster.time_limit_min=5", "cluster.startup_min=1",
                                           "backend.neuron.save_before_limit_s=60",
                                           f"cluster.nodes={nodes}", f"backend.neuron.examples_dir={examples}",
                                           "cluster.cpus_per_task=1"])


def neuron_stand_ins(root: Path, *on_path: str) -> tuple[Path, Path]:
    """Stand-ins for the Neuron SDK's tools under ``root``, those named in ``on_path`` linked into
    a directory for the setup lines' PATH, and an NxDT examples directory: (that directory, examples)."""
    tools, examples = root / "bin", root / "examples"
    tools.mkdir()
    examples.mkdir()
    (examples / "training_orchestrator.py").write_text("")
    for tool in ("neuron-ls", "neuron_parallel_compile"):
        (root / tool).write_text("#!/bin/sh\necho 'instance-type: trn1.32xlarge'\n")
        (root / tool).chmod(0o755)
    for tool in on_path:
        os.symlink(root / tool, tools / tool)
    return tools, examples


def test_preflight_names_the_tool_missing_on_the_node(local_stack, tmp_path):
    """A node with the Neuron driver's neuron-ls and NxDT's examples but without the compiler
    wrapper: the probe job names that one, and passes once the setup lines put it on PATH."""
    tools, examples = neuron_stand_ins(tmp_path, "neuron-ls")
    cluster = SlurmCluster(executor="slurm", setup=[f"export PATH={tools}:$PATH"])
    spec = neuron_spec(tmp_path, examples)

    @flow
    def probe_once():
        return probe(spec, cluster, tmp_path)

    rows = {row["check"]: row for row in probe_once()["rows"]}
    assert rows["neuron-ls"]["ok"] and "trn1.32xlarge" in rows["neuron-ls"]["found"]
    assert rows["NxDT examples"]["ok"]
    missing = rows["neuron_parallel_compile"]
    assert not missing["ok"] and missing["found"] == "not on PATH" and "Neuron venv" in missing["fix"]

    os.symlink(tmp_path / "neuron_parallel_compile", tools / "neuron_parallel_compile")
    assert all(row["ok"] for row in probe_once()["rows"])


def test_preflight_refuses_more_nodes_than_the_partition_has_before_queueing(local_stack, tmp_path):
    spec = neuron_spec(tmp_path, tmp_path, nodes=4)

    @flow
    def check():
        return preflight(spec, ["precompile", "train"])

    state = check(return_state=True)
    assert state.is_failed()
    assert isinstance(state.result(raise_on_failure=False), PreflightFailed)
    assert "nothing was queued" in state.message and "cluster.nodes=4: lower it" in state.message
    assert not (tmp_path / "jobs").exists()


@pytest.mark.pure
def test_the_megatron_probe_checks_the_checkout_only_where_no_image_stage_builds_it(tmp_path):
    from render.preflight_command import preflight_command
    from trainer import preflight as node_probe

    record = str(tmp_path / "probe.json")
    built = load_spec("gpt3-7.5b-gpu", [f"paths.root={tmp_path}"])
    assert built.backend.megatron_lm.image is not None  # the preset builds its image after the probe
    argv = preflight_command(built, record)
    assert "--megatron-path" not in argv
    args = node_probe.parse_args(argv[argv.index("preflight") + 1:])
    assert [c["check"] for c in node_probe.megatron_checks(args)] == ["nvidia-smi"]

    named = load_spec("gpt3-7.5b-gpu", [f"paths.root={tmp_path}", "backend.megatron_lm.image=null",
                                        "backend.megatron_lm.container_image=nvcr.io/nvidia/pytorch:24.09-py3"])
    argv = preflight_command(named, record)
    args = node_probe.parse_args(argv[argv.index("preflight") + 1:])
    assert args.megatron_path == "/workspace/Megatron-LM"
    assert [c["check"] for c in node_probe.megatron_checks(args)] == ["nvidia-smi", "Megatron-LM"]


@pytest.mark.pure
def test_the_native_probe_checks_torch_and_the_device_it_is_asked_for(tmp_path):
    """``python -m trainer preflight --backend native`` as the probe job runs it: for the CPU this
    machine has, and for CUDA hidden from it (CUDA_VISIBLE_DEVICES empty, as a job without GPUs
    sees it, so the answer is the same on a GPU machine)."""
    def probe_node(device: str) -> tuple[int, dict, dict]:
        record = tmp_path / f"{device}.json"
        env = {**os.environ, "SLURMD_NODENAME": "probe-node", "CUDA_VISIBLE_DEVICES": ""}
        out = subprocess.run([sys.executable, "-m", "trainer", "preflight", "--backend", "native", "--devices", "2",
                              "--device", device, "--record", str(record)], env=env, capture_output=True, text=True,
                             timeout=300)
        printed = json.loads(out.stdout.strip().splitlines()[-1])
        return out.returncode, printed, json.loads(record.read_text())

    code, printed, written = probe_node("cpu")
    assert code == 0 and printed == written
    assert (printed["node"], printed["backend"], printed["ok"]) == ("probe-node", "native", True)
    torch_check, device_check = printed["checks"]
    assert torch_check["check"] == "torch" and torch_check["ok"] and sys.executable in torch_check["found"]
    assert device_check == {"check": "device cpu", "ok": True, "found": "cpu: 2 device(s)", "fix": ""}

    code, printed, _ = probe_node("cuda")
    assert code == 1 and not printed["ok"]
    torch_check, device_check = printed["checks"]
    assert torch_check["ok"] and (device_check["check"], device_check["ok"]) == ("device cuda", False)
    assert "device='cuda' is not available on this node" in device_check["found"]
    assert device_check["fix"] == "set backend.native.device, or use a partition whose nodes have it"


@pytest.mark.parametrize("case, answer, final", [
    ("a partition the cluster lacks", "Invalid partition name specified", True),
    ("more nodes than the cluster has", "More processors requested than permitted", True),
    ("the controller unreachable", "Unable to contact slurm controller (connect failure)", False),
])
def test_a_refused_submission_is_retried_only_when_the_cluster_may_accept_it(case, answer, final, local_stack,
                                                                            tmp_path, monkeypatch):
    """The local cluster's sbatch refuses a request; SubmissionRefused names its words, and the
    retry condition gives up at once on a request the cluster refuses every time and retries one
    that may pass (a controller that is restarting)."""
    cluster, request = SLURM, JobRequest("refused", Command(["true"]), time_limit_min=2)
    if case == "a partition the cluster lacks":
        cluster = SlurmCluster(executor="slurm", partition="nosuch")
    elif case == "more nodes than the cluster has":
        request = replace(request, nodes=64)
    else:  # the stack's settings with the controller on a port nothing listens on
        conf = Path(local_stack["SLURM_CONF"]).read_text()
        (tmp_path / "slurm.conf").write_text(conf.replace(f"SlurmctldPort={slurm_port(conf)}", "SlurmctldPort=1"))
        monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    with pytest.raises(SubmissionRefused) as info:
        submit(request, cluster, tmp_path)
    assert str(info.value).startswith("refused: sbatch refused the job: ") and answer in str(info.value)
    assert ("the cluster refuses this request every time" in str(info.value)) is final
    assert info.value.retryable is not final
    # what Prefect hands the retry condition: the failed state of the task that raised it
    assert retryable(None, None, Failed(data=info.value)) is not final


def slurm_port(conf: str) -> str:
    (port,) = re.findall(r"^SlurmctldPort=(\d+)$", conf, re.M)
    return port


@pytest.mark.pure
def test_the_torchtitan_probe_checks_the_device_torchtitan_the_config_module_and_torchao(tmp_path):
    """The probe as a torchtitan run's preflight renders it (the 1B flavour, float8: this project's
    config module and torchao), run with CUDA hidden as a job without GPUs sees it."""
    from render.preflight_command import preflight_command

    from pretrain.spec import flavour_overrides

    spec = load_spec("llama3-8b-gpu", [*flavour_overrides("1B"), "backend.torchtitan.float8=true", f"paths.root={tmp_path}"])
    record = tmp_path / "probe.json"
    argv = preflight_command(spec, str(record))
    assert argv[argv.index("--module") + 1] == "trainer.torchtitan_configs" and "--float8" in argv
    out = subprocess.run(argv, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300)
    rows = {row["check"]: row for row in json.loads(record.read_text())["checks"]}
    assert out.returncode == 1 and not rows["device cuda"]["ok"]
    assert rows["device cuda"]["fix"] == "set backend.torchtitan.device, or use a partition whose nodes have it"
    assert "float8" not in rows  # asked of the device it would run on, which this node lacks
    assert rows["python module torchtitan"]["ok"] and rows["python module trainer.torchtitan_configs"]["ok"]
    torchao = rows["python module torchao"]
    assert torchao["ok"] == (importlib.util.find_spec("torchao") is not None)  # the float8 extra, not a test need
    assert torchao["ok"] or "torchao==0.18.0" in torchao["fix"]
    # on a device without float8 tensor cores (this CPU), float8 is refused by name
    out = subprocess.run([*argv[:argv.index("--device") + 1], "cpu", *argv[argv.index("--device") + 2:]],
                         capture_output=True, text=True, timeout=300)
    float8 = {row["check"]: row for row in json.loads(record.read_text())["checks"]}["float8"]
    assert out.returncode == 1 and (float8["ok"], float8["found"]) == (False, "device cpu")
    assert float8["fix"].startswith("set backend.torchtitan.float8=false, or use a partition whose GPUs have float8")
    neuron = load_spec("llama3-70b-trn2-torchneuron", [f"paths.root={tmp_path}"])
    argv = preflight_command(neuron, str(record))
    assert argv[argv.index("--device") + 1:argv.index("--device") + 4] == ["neuron", "--module", "torchtitan_neuron.models.llama3"]
