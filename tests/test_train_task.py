"""The train task on the real local Slurm cluster, through every way a training job dies in
production: cancelled, requeued, out of time, a crashed rank, a hung run (and a job waiting in
the queue, which is not hung). Each run must end finished, resumed from a checkpoint, with every
step in metrics.jsonl exactly once and no job or trainer process left behind.

Faults are injected from a thread while the flow runs, once the run is past its first complete
checkpoint. The dataset (fetch + tokenize of the demo corpus) is built once for the module.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from prefect import flow

from blocks.cluster import SlurmCluster
from deployments.demo import save_credentials_block, seed_corpus
from jobs.slurm import queued
from pretrain.corpus import corpus_texts
from pretrain.metrics_records import events, logged_steps, metrics_records
from pretrain.presets import load_spec
from pretrain.toy_tokenizers import llama3_style
from slurm_faults import PREEMPT_GRES, CpuGroup, Fault, preempt, trainer_processes
from tasks.fetch import fetch
from tasks.tokenize import tokenize
from tasks.train import train

STEPS = 25
INTERVAL = 10
FAULT_AFTER_STEP = 15  # past the first checkpoint (step 10), before the second
# A resubmitted job here waits up to KillWait (5 s) for the cancelled one to complete, then the
# trainer takes 20-40 s to start on 2 cores busy with other tests: the hang timeout must outlast both.
HANG_TIMEOUT_MIN = 1.0


@dataclass(frozen=True)
class Corpus:
    tokenizer: Path
    data_dir: str
    dataset: str


@flow
def prepare(overrides: list[str]) -> tuple[str, str]:
    spec = load_spec("tiny-local", overrides)
    data_dir = fetch(spec)
    return data_dir, tokenize(spec, data_dir)


@flow
def train_only(overrides: list[str], dataset: str, data_dir: str) -> dict:
    return train(load_spec("tiny-local", overrides), dataset, data_dir)


@pytest.fixture(scope="module")
def corpus(local_stack, prefect_harness, tmp_path_factory) -> Corpus:  # its flow needs the API
    root = tmp_path_factory.mktemp("train-task-data")
    tokenizer = llama3_style(root / "tokenizer", corpus_texts())
    seed_corpus(local_stack["PRETRAIN_S3_ENDPOINT"])
    save_credentials_block(local_stack["PRETRAIN_S3_ENDPOINT"])
    data_dir, dataset = prepare([f"paths.root={root}", f"tokenizer.path={tokenizer}", "cluster.executor=slurm"])
    return Corpus(tokenizer, data_dir, dataset)


def overrides_for(name: str, root: Path, corpus: Corpus, *extra: str, steps: int = STEPS) -> list[str]:
    """A 2-layer tiny-local run of ``steps`` steps, checkpointed every INTERVAL, in its own root, on
    one rank: what the job layer does with a fault does not depend on the rank count, and a
    second rank costs every job start about 10 CPU-seconds here (the tests that need two say so).
    ``extra`` overrides come last and win."""
    return [f"name={name}", f"paths.root={root}", f"tokenizer.path={corpus.tokenizer}", "cluster.executor=slurm",
            "cluster.devices_per_node=1", "cluster.cpus_per_task=1", "model.num_layers=2",
            "training.global_batch_size=8",
            f"training.train_steps={steps}",
            f"training.checkpoint_interval={INTERVAL}", "training.eval_iters=0", "cluster.time_limit_min=10",
            "backend.native.compile=false", "backend.native.export_hf=false", *extra]


# ---------------------------------------------------------------- reading the run


def assert_nothing_left(job_name: str, config: Path) -> None:
    """No job of the run in squeue (one still COMPLETING gets KillWait to go), no trainer process."""
    deadline = time.monotonic() + 30
    while (left := queued(job_name)) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == [], f"jobs left behind: {left}"
    assert trainer_processes(config) == {}
    sampler = subprocess.run(["pgrep", "-f", f"trainer monitor --dir {config.parent / 'devices'}"],
                             capture_output=True, text=True).stdout
    assert sampler == "", f"device sampler left behind: {sampler}"


def run_with_fault(name: str, root: Path, corpus: Corpus, inject: Callable[[str, Path], Any],
                   *extra: str, steps: int = STEPS) -> tuple[dict, Fault, list[dict[str, Any]]]:
    """The train task in a flow, with ``inject`` fired mid-run; returns the task's result, the
    fault and the final metrics records, after checking what every fault must end with."""
    fault = Fault(f"{name}-train", root, inject, after_step=FAULT_AFTER_STEP, checkpoint=INTERVAL)
    fault.start()
    state = train_only(overrides_for(name, root, corpus, *extra, steps=steps), corpus.dataset, corpus.data_dir,
                       return_state=True)
    fault.check()
    assert state.is_completed(), state.message
    result = state.result()
    run_dir = Path(result["run_dir"])
    records = metrics_records(run_dir / "metrics.jsonl")
    resumed = events(records, "resumed")
    print(f"\n{name}: fault at step {fault.at_step} of job {fault.job_id}; resumed {resumed}; "
          f"stopped {events(records, 'stopped')}; attempts {json.dumps(result['attempts'], indent=1)}")

    assert result["status"] == "finished" and result["step"] == steps
    assert logged_steps(records) == list(range(1, steps + 1)), "every step exactly once, in order"
    assert resumed, "the trainer resumed from a checkpoint"
    assert all(INTERVAL <= e["from_step"] < steps for e in resumed)
    assert result["resumed_from"] == resumed[-1]["from_step"]
    assert result["attempts"][-1]["outcome"] == "completed"
    # The device sampler ran beside every attempt on the node, and is gone with it.
    (devices,) = (run_dir / "devices").glob("*.jsonl")
    samples = [json.loads(line) for line in devices.read_text().splitlines()]
    assert samples and {s["kind"] for s in samples} == {"device"} and {s["device"] for s in samples} == {"cpu"}
    assert result["metrics"]["device_util_pct"] is not None
    assert_nothing_left(f"{name}-train", run_dir / "train.json")
    return result, fault, records


# ---------------------------------------------------------------- faults


def test_scancel_mid_run_resubmits_and_resumes(corpus, tmp_path, clean_queue):
    clean_queue.append(f"{(name := 'fault-scancel')}-train")
    result, fault, records = run_with_fault(
        name, tmp_path, corpus, lambda job_id, _: subprocess.run(["scancel", job_id], check=True))
    first, last = result["attempts"]
    assert first["job"] == fault.job_id and first["outcome"].startswith("CANCELLED: ")
    assert last["job"] != fault.job_id
    # scancel sends SIGTERM first: the trainer saved where it was and exited; the next job went on
    # from exactly there.
    (stopped,) = events(records, "stopped")
    assert stopped["signal"] == "SIGTERM" and stopped["step"] >= fault.at_step
    assert result["resumed_from"] == stopped["step"] == first["step"]
    assert first["outcome"].endswith(f" -- the trainer stopped on SIGTERM at step {stopped['step']} and saved a "
                                     "checkpoint"), first
    # Slurm calls the job CANCELLED at once; the next one was submitted only once its ranks had
    # saved and gone, not beside them in the same run directory.
    assert submitted_at(last["job"]) >= int(stopped["time"]), (submitted_at(last["job"]), stopped["time"])


def test_scontrol_requeue_restarts_the_same_job_which_resumes(corpus, tmp_path, clean_queue):
    clean_queue.append(f"{(name := 'fault-requeue')}-train")
    result, fault, records = run_with_fault(
        name, tmp_path, corpus, lambda job_id, _: subprocess.run(["scontrol", "requeue", job_id], check=True))
    # Slurm restarts the job under its id (not held: it is eligible again after cred_expire); the
    # job layer follows Slurm's state through the requeue, so the task sees one attempt.
    (attempt,) = result["attempts"]
    assert attempt["job"] == fault.job_id and attempt["outcome"] == "completed"
    shown = subprocess.run(["scontrol", "show", "job", fault.job_id], capture_output=True, text=True).stdout
    assert "Restarts=1" in shown
    (stopped,) = events(records, "stopped")
    assert stopped["signal"] == "SIGTERM"
    assert result["resumed_from"] == stopped["step"] >= fault.at_step


def test_preemption_on_spot_capacity_resubmits_and_resumes(corpus, tmp_path, clean_queue):
    """Spot capacity: a higher-priority job takes the job's resources; Slurm signals the trainer
    (which saves and exits within the partition's grace time) and does not requeue, so the task
    resubmits."""
    SlurmCluster(executor="slurm", partition="spot", gres=PREEMPT_GRES).save("spot-node", overwrite=True)
    clean_queue.extend([f"{(name := 'fault-preempt')}-train", "urgent-preemptor"])
    result, fault, records = run_with_fault(name, tmp_path, corpus, lambda *_: preempt(), "cluster.block=spot-node")
    first, last = result["attempts"]
    assert first["job"] == fault.job_id and last["job"] != fault.job_id
    (stopped,) = events(records, "stopped")
    assert stopped["signal"] == "SIGTERM" and result["resumed_from"] == stopped["step"] == first["step"]


def elapsed_s(job_id: str) -> int:
    """How long the job has run, from squeue's ``[days-]hours:minutes:seconds``."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%M"], capture_output=True, text=True, check=True)
    days, _, clock = out.stdout.strip().rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return int(days or 0) * 86400 + seconds


def test_time_limit_stops_the_trainer_with_usr2_and_the_next_job_resumes(corpus, tmp_path, clean_queue):
    """The job reaches its time limit mid-run: Slurm sends USR2 ahead of it (``--signal``), the
    trainer saves where it is and exits, and the next job resumes exactly there.

    The limit is cut on the running job (``scontrol update``), past its first checkpoint, rather
    than set at submission: a job's start-up here takes 20-70 s depending on what else the machine
    runs, so a 1-minute limit from the start is reached anywhere between start-up and the end of
    the run. slurmctld checks limits every 30 s and sends the signal at the first check within
    30 s + its delay of the limit; with a 20 s delay and the limit cut to a whole minute 50-110 s
    away, it comes within 90 s, 20-50 s before the limit. Meanwhile the ranks run at a tenth of a
    core, so the run's 120 steps are not through before it comes (at most about 80 steps at
    1.2 s or more each)."""
    clean_queue.append(f"{(name := 'fault-time-limit')}-train")
    throttled = CpuGroup(name, quota_pct=10)

    def limit_reached(job_id: str, run_dir: Path) -> int:
        throttled.add(trainer_processes(run_dir / "train.json").values())
        minutes = -(-(elapsed_s(job_id) + 50) // 60)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"], check=True)
        return minutes

    try:
        result, fault, records = run_with_fault(name, tmp_path, corpus, limit_reached, "backend.native.save_before_limit_s=20",
                                                steps=120)
    finally:
        throttled.close()
    first, last = result["attempts"]
    (stopped,) = events(records, "stopped")
    assert stopped["signal"] == "SIGUSR2" and result["resumed_from"] == stopped["step"] == first["step"] >= fault.at_step
    assert first["job"] == fault.job_id and last["job"] != fault.job_id
    # torchrun got USR2 as well (Slurm signals every process of the step): it forwards it, waits
    # for the ranks, then ends with its own SignalException, exit 1 -- so Slurm records FAILED,
    # not TIMEOUT, and the trainer's exit 3 does not reach the job layer. The history says what
    # the trainer did after Slurm's record.
    assert first["outcome"].startswith("FAILED: ") and "exit code 1:0" in first["outcome"], first
    assert first["outcome"].endswith(f" -- the trainer stopped on SIGUSR2 at step {stopped['step']} and saved a "
                                     "checkpoint"), first
    shown = subprocess.run(["sacct", "-X", "-n", "-P", "-j", fault.job_id, "-o", "Timelimit"], capture_output=True,
                           text=True, check=True).stdout
    assert shown.strip() == f"00:{fault.result:02d}:00", shown  # the limit was the cut one


def test_killed_rank_fails_the_job_and_the_run_resumes_from_its_checkpoint(corpus, tmp_path, clean_queue):
    clean_queue.append(f"{(name := 'fault-kill-rank')}-train")

    def kill_rank_1(job_id: str, run_dir: Path) -> dict[str, int]:
        processes = trainer_processes(run_dir / "train.json")
        os.kill(processes["rank1"], signal.SIGKILL)
        return processes

    result, fault, records = run_with_fault(name, tmp_path, corpus, kill_rank_1, "cluster.devices_per_node=2")
    assert set(fault.result) == {"launcher", "rank0", "rank1"}
    first, _ = result["attempts"]
    # torchrun saw rank 1 die (-9), stopped rank 0 and exited 1.
    assert first["job"] == fault.job_id and first["outcome"].startswith("FAILED: ")
    assert "exit code 1:0" in first["outcome"]
    # No clean stop: the steps after the last periodic checkpoint were dropped and trained again.
    assert events(records, "stopped") == [] and "the trainer stopped" not in first["outcome"]
    assert result["resumed_from"] % INTERVAL == 0 and result["resumed_from"] <= fault.at_step <= first["step"]


@contextlib.contextmanager
def partition_down_for(name: str, seconds: float):
    """A partition of the cluster's node (as a cluster block of that name) that is down: jobs
    submitted to it wait in the queue (reason PartitionDown) until it comes up, ``seconds`` after
    this is entered. No other test's job waits with them, as behind a job filling the node."""
    subprocess.run(["scontrol", "delete", f"PartitionName={name}"], capture_output=True)  # a failed run's
    subprocess.run(["scontrol", "create", f"PartitionName={name}", "Nodes=ALL", "MaxTime=INFINITE", "State=DOWN"],
                   check=True)
    SlurmCluster(executor="slurm", partition=name).save(name, overwrite=True)
    release = threading.Timer(seconds, lambda: subprocess.run(
        ["scontrol", "update", f"PartitionName={name}", "State=UP"], check=True))
    release.start()
    try:
        yield
    finally:
        release.cancel()
        subprocess.run(["scancel", "-p", name], check=False)
        deadline = time.monotonic() + 60  # a partition is deleted once its jobs are gone
        while subprocess.run(["scontrol", "delete", f"PartitionName={name}"], capture_output=True).returncode:
            assert time.monotonic() < deadline, f"partition {name} kept its jobs"
            time.sleep(0.5)


def sacct_times(job_id: str, fields: str) -> list[float]:
    """The job's accounting times ``fields`` (e.g. ``Submit,Start``), as epoch seconds."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", fields],
                         capture_output=True, text=True, check=True).stdout
    return [time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%S")) for t in out.split()[-1].split("|")]


def submitted_at(job_id: str) -> float:
    (submitted,) = sacct_times(job_id, "Submit")
    return submitted


def seconds_in_queue(job_id: str) -> float:
    submitted, started = sacct_times(job_id, "Submit,Start")
    return started - submitted


def test_hung_run_is_cancelled_and_resubmitted_but_a_queued_job_is_not_hung(corpus, tmp_path, clean_queue):
    """The hang clock runs while the job runs: the first job waits in the queue for longer than
    hang_timeout_min and is left alone; once it trains, its rank is stopped (SIGSTOP), and that
    is a hang."""
    name = "fault-hang"
    clean_queue.append(f"{name}-train")

    def stop_rank(job_id: str, run_dir: Path) -> dict[str, int]:
        processes = trainer_processes(run_dir / "train.json")
        os.kill(processes["rank0"], signal.SIGSTOP)
        return processes

    with partition_down_for(name, HANG_TIMEOUT_MIN * 60 + 15):
        result, fault, records = run_with_fault(name, tmp_path, corpus, stop_rank, f"cluster.block={name}",
                                                f"backend.native.hang_timeout_min={HANG_TIMEOUT_MIN}")
    first = result["attempts"][0]
    assert first["job"] == fault.job_id, f"the job waiting in the queue was cancelled as hung: {first}"
    assert len(result["attempts"]) == 2
    assert seconds_in_queue(first["job"]) > HANG_TIMEOUT_MIN * 60
    assert first["outcome"].startswith(f"hung: no new metrics for {HANG_TIMEOUT_MIN:.1f} min")
    assert first["step"] >= fault.at_step
    # The cancel sent SIGCONT and SIGTERM to the stopped rank: it finished its step, saved
    # and exited within KillWait; the next job resumed there.
    (stopped,) = events(records, "stopped")
    assert stopped["signal"] == "SIGTERM" and result["resumed_from"] == stopped["step"] >= fault.at_step
    # The next job was submitted only once the cancelled ranks had saved and gone: with free
    # nodes it would otherwise start beside them in the same run directory.
    second = result["attempts"][1]["job"]
    assert submitted_at(second) >= int(stopped["time"]), (submitted_at(second), stopped["time"])


def test_a_diverged_run_fails_at_once_with_the_trainers_reason(corpus, tmp_path, clean_queue):
    """A loss that is not finite step after step would diverge again in every resubmission: the
    task stops after the first job, and the flow's message says why, not just torchrun's exit 1."""
    name = "diverged"
    clean_queue.append(f"{name}-train")
    overrides = overrides_for(name, tmp_path, corpus, "training.lr=1e6", "training.min_lr=0",
                              "training.warmup_steps=0", "backend.native.max_nan_steps_in_a_row=2",
                              "backend.native.max_attempts_without_checkpoint=3")
    state = train_only(overrides, corpus.dataset, corpus.data_dir, return_state=True)
    assert state.is_failed()
    message = str(state.message)
    assert "the trainer stopped: loss or gradient norm was not finite for 2 steps in a row" in message, message
    assert "not resubmitted" in message and message.count("FAILED: ") == 1, message
    # What it measured before it failed travels with the failure, for the flow's run summary.
    measured = state.result(raise_on_failure=False).metrics
    assert measured["final_step"] >= 1 and measured["tokens_per_s"] > 0, measured
    (run_dir,) = (tmp_path / "train").glob("train-*")
    assert_nothing_left(f"{name}-train", run_dir / "train.json")


def test_event_lines_after_the_last_step_are_signs_of_life(tmp_path):
    """After its last step the trainer checkpoints and exports for minutes at scale, logging
    events but no step: that is progress, while silence that long is a hang."""
    from tasks.attempts import MetricsFollower, RunHung

    clock = [1000.0]
    metrics = tmp_path / "metrics.jsonl"

    @flow
    def follow() -> str:
        follower = MetricsFollower(load_spec("tiny-local"), metrics, total_steps=2, hang_timeout_s=60,
                                   clock=lambda: clock[0])

        def after(seconds: float, *lines: str) -> None:
            clock[0] += seconds
            with open(metrics, "a") as out:
                out.writelines(line + "\n" for line in lines)
            follower.poll()

        after(0, '{"step": 1, "loss": 3.0}', '{"step": 2, "loss": 2.5}')
        after(50, '{"step": 2, "event": "checkpoint", "path": "/ckpt"}')
        after(50, '{"step": 2, "event": "export", "path": "/hf"}')
        after(50)  # 50 s since the last event: still within the timeout
        try:
            after(20)
        except RunHung as hung:
            return str(hung)
        return "not hung"

    assert follow().startswith("no new metrics for 1.0 min (last step 2)")
