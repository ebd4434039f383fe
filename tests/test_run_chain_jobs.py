"""A run as a chain of jobs on the real local Slurm cluster: the failure budget against jobs that
crash with and without advancing the checkpoint (cheap jobs, a shell script standing for the
trainer's writes, since the loop reads only the checkpoints and the metrics); one flow run at a
time driving a run; and the native trainer carried through 1-minute time limits to its last step,
its losses bit-equal to the uninterrupted run's."""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest
from prefect import flow

from jobs.node import Command
from jobs.contract import stage_request
from jobs.slurm import queue_state
from pretrain import run_chain
from pretrain.checkpoints import native_step
from pretrain.metrics_records import events, logged_steps, metrics_records
from pretrain.presets import load_spec
from tasks.attempts import MetricsFollower, run_attempts
from tasks.executor import cluster_for
from tasks.runs import RunClaim
from trainer.run_layout import MARKER, checkpoint_dir, step_dir

STEPS = 40


def scripted_spec(root: Path, budget: int):
    return load_spec("tiny-local", [f"paths.root={root}", "cluster.executor=slurm", "cluster.time_limit_min=5",
                                    f"training.train_steps={STEPS}",
                                    f"backend.native.max_attempts_without_checkpoint={budget}"])


def scripted_job(run: Path, attempt: int, advance_to: int, exit_code: int) -> Command:
    """A job that writes step records up to ``advance_to`` and a complete native checkpoint there,
    as the trainer would, then prints an error and exits ``exit_code``."""
    checkpoint = step_dir(checkpoint_dir(run), advance_to)
    lines = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, advance_to + 1))
    script = (f"printf %s {shlex.quote(lines)} > {run}/metrics.jsonl; "
              + (f"mkdir -p {checkpoint} && echo {{}} > {checkpoint}/{MARKER}; " if advance_to else "")
              + f"echo 'RuntimeError: attempt {attempt} crashed' >&2; exit {exit_code}")
    return Command(["bash", "-c", script])


def run_scripted(spec, run: Path, plan: list[tuple[int, int]]):
    """The chain of jobs on ``plan``: job ``i`` advances the checkpoint to ``plan[i][0]`` and exits ``plan[i][1]``."""
    run.mkdir(parents=True, exist_ok=True)
    follower = MetricsFollower(spec, run / "metrics.jsonl", STEPS, 600)

    def prepare(attempt: int, launch):
        advance_to, code = plan[attempt]
        return stage_request(launch, f"{spec.name}-chain", scripted_job(run, attempt + 1, advance_to, code), nodes=1)

    return run_attempts(spec, cluster_for(spec), follower, spec.backend.native.max_attempts_without_checkpoint,
                        prepare, run, lambda: native_step(checkpoint_dir(run)))


def test_jobs_that_crash_without_advancing_the_checkpoint_spend_the_budget_and_the_failure_names_each(
        local_stack, tmp_path, clean_queue):
    spec = scripted_spec(tmp_path, budget=3)
    clean_queue.append(f"{spec.name}-chain")
    run = tmp_path / "run"
    attempts = run_scripted(spec, run, [(0, 1)] * 6)
    assert len(attempts.history) == 4, "three in a row allowed, the fourth spends the budget"
    assert not attempts.finished
    message = str(attempts.failure())
    assert message.startswith("4 jobs in a row ended without advancing the newest checkpoint (step 0): the failure "
                              "budget, backend.native.max_attempts_without_checkpoint=3, is spent")
    for attempt in attempts.history:
        assert f"job {attempt['job']}: FAILED: " in message
    chain = run_chain.read(run / run_chain.CHAIN_FILE)
    assert [r["job"] for r in chain] == [a["job"] for a in attempts.history]
    assert all(r["checkpoint_after"] == 0 and not r["completed"] for r in chain)


def test_jobs_that_crash_after_advancing_the_checkpoint_spend_nothing_and_the_run_completes(
        local_stack, tmp_path, clean_queue):
    spec = scripted_spec(tmp_path, budget=1)
    clean_queue.append(f"{spec.name}-chain")
    run = tmp_path / "run"
    # four crashes, each after a new checkpoint, with a budget of one: the run goes on to its last step
    attempts = run_scripted(spec, run, [(8, 1), (16, 1), (24, 1), (32, 1), (STEPS, 0)])
    assert attempts.finished and not attempts.reason
    assert [a["outcome"].split(":")[0] for a in attempts.history] == ["FAILED"] * 4 + ["completed"]
    chain = run_chain.read(run / run_chain.CHAIN_FILE)
    assert [(r["checkpoint_before"], r["checkpoint_after"]) for r in chain] == [
        (0, 8), (8, 16), (16, 24), (24, 32), (32, STEPS)]
    assert chain[-1]["completed"] and run_chain.attempts_without_checkpoint(chain) == 0


def test_a_job_that_exits_well_short_of_the_last_step_is_a_continuation_not_the_end(
        local_stack, tmp_path, clean_queue):
    """Megatron-LM exits 0 after saving at its exit duration: the run is done only at its last step."""
    spec = scripted_spec(tmp_path, budget=0)
    clean_queue.append(f"{spec.name}-chain")
    attempts = run_scripted(spec, tmp_path / "run", [(20, 0), (STEPS, 0)])
    assert attempts.finished and [a["outcome"] for a in attempts.history] == ["completed", "completed"]


def test_a_second_flow_run_waits_for_the_one_driving_the_run_and_for_its_job(local_stack, tmp_path, clean_queue):
    spec = scripted_spec(tmp_path, budget=0)
    run = tmp_path / "run"
    run.mkdir()
    cluster = cluster_for(spec)
    owner = run / RunClaim.OWNER
    owner.write_text(json.dumps({"flow_run": "the-first-flow-run"}))
    released: list[float] = []

    def first_flow_run() -> None:  # renews its claim for 3 s, then its process dies
        until = time.time() + 3
        while time.time() < until:
            owner.touch()
            time.sleep(0.2)
        released.append(time.time())

    # its newest job still runs: a second flow run must not start another beside it
    clean_queue.append("first-runs-job")
    job = subprocess.run(["sbatch", "--parsable", "-J", "first-runs-job", "-o", "/dev/null", "-t", "2",
                          "--wrap", "sleep 8"], capture_output=True, text=True, check=True).stdout.strip()
    run_chain.append(run / run_chain.CHAIN_FILE, {"flow_run": "the-first-flow-run", "job": job})
    threading.Thread(target=first_flow_run, daemon=True).start()
    with RunClaim(run, cluster, renew_s=0.2, stale_s=1.0, poll_s=0.2) as claim:
        entered = time.time()
        assert queue_state(job) is None, "the first flow run's job had ended"
        assert json.loads(owner.read_text())["flow_run"] == claim.me
    assert released and entered > released[0] + 1.0, "the claim waited until the first one's went stale"
    assert not owner.exists(), "released at the end"


@flow
def train_flow(overrides: list[str], dataset: str, data_dir: str) -> dict:
    from tasks.train import train
    return train(load_spec("tiny-local", overrides), dataset, data_dir)


@pytest.fixture(scope="module")
def corpus(local_stack, prefect_harness, tmp_path_factory):
    from deployments.demo import save_credentials_block, seed_corpus
    from pretrain.corpus import corpus_texts
    from pretrain.toy_tokenizers import llama3_style
    from tasks.fetch import fetch
    from tasks.tokenize import tokenize

    root = tmp_path_factory.mktemp("chain-data")
    tokenizer = llama3_style(root / "tokenizer", corpus_texts())
    seed_corpus(local_stack["PRETRAIN_S3_ENDPOINT"])
    save_credentials_block(local_stack["PRETRAIN_S3_ENDPOINT"])

    @flow
    def prepare() -> tuple[str, str]:
        spec = load_spec("tiny-local", [f"paths.root={root}", f"tokenizer.path={tokenizer}", "cluster.executor=slurm"])
        data_dir = fetch(spec)
        return data_dir, tokenize(spec, data_dir)

    data_dir, dataset = prepare()
    return tokenizer, data_dir, dataset


# The chain's run: one rank of a 2-layer model. Its ranks are held, once they train, to the CPU
# share that makes a step last CHAIN_STEP_S, adjusted as they go, so a job, which Slurm ends 60-90
# s after it started, trains at most about 75 / CHAIN_STEP_S steps after its start-up: the run's
# CHAIN_STEPS need five jobs or more on any machine, more than the four a 70B run got when the
# budget counted time limits (max_restarts=3).
CHAIN_STEPS = 240
CHAIN_STEP_S = 1.6


@pytest.mark.timeout(1800)  # seven or so jobs of 1 minute, each Slurm ends 60-90 s after its start
def test_a_run_longer_than_its_jobs_time_limit_is_carried_to_its_last_step_bit_for_bit(
        corpus, tmp_path, clean_queue):
    """Each job of a 1-minute time limit trains from the newest checkpoint until Slurm ends it at
    its limit (SIGTERM: the trainer saves where it is); the next goes out at once. The run needs
    five jobs or more, trains every step once, and its losses are the uninterrupted run's, bit for
    bit. Start-up runs at full speed; a job Slurm is ending gets its full speed back to save."""
    from slurm_faults import CpuGroup, trainer_processes

    tokenizer, data_dir, dataset = corpus

    def overrides(root: Path, *extra: str) -> list[str]:
        return [f"paths.root={root}", f"tokenizer.path={tokenizer}", "cluster.executor=slurm", "name=chain",
                "cluster.devices_per_node=1", "cluster.cpus_per_task=1", "model.num_layers=2",
                "training.global_batch_size=8", f"training.train_steps={CHAIN_STEPS}",
                "training.checkpoint_interval=10", "training.eval_iters=0", "backend.native.compile=false",
                "backend.native.export_hf=false", *extra]

    clean_queue.append("chain-train")
    baseline = train_flow(overrides(tmp_path / "baseline", "cluster.time_limit_min=10"), dataset, data_dir)
    reference = {r["step"]: r for r in metrics_records(Path(baseline["run_dir"]) / "metrics.jsonl")
                 if "loss" in r and "event" not in r}
    step_s = sorted(r["step_time_ms"] for r in reference.values())[len(reference) // 2] / 1000
    quota = [min(100 * step_s / CHAIN_STEP_S, 100.0)]  # the uninterrupted run's pace, a first guess
    adjusted = [0]  # the step of the last adjustment
    throttled = CpuGroup("chain", quota_pct=max(1, round(quota[0])))
    stop = threading.Event()
    chain_root = tmp_path / "chain"

    def throttle_while_training() -> None:
        while not stop.wait(0.5):
            for config in chain_root.glob("train/*/train.json"):
                ranks = [pid for name, pid in trainer_processes(config).items() if name != "launcher"]
                stream = config.parent / "metrics.jsonl"
                records = metrics_records(stream) if stream.exists() else []
                jobs = subprocess.run(["squeue", "-h", "-n", "chain-train", "-o", "%T"], capture_output=True,
                                      text=True).stdout.split()
                if not (jobs == ["RUNNING"] and records and records[-1].get("event") is None):
                    throttled.release()  # starting, or ending at its limit: the save gets the whole KillWait
                    continue
                throttled.add(ranks)
                # the share that keeps the steps at CHAIN_STEP_S, from the pace of the last five steps
                # since the previous adjustment (damped: the pace answers a change some steps late)
                recent = [r for r in records[-5:] if "loss" in r and r["step"] > adjusted[0]]
                if len(recent) == 5:
                    pace = (recent[-1]["time"] - recent[0]["time"]) / 4
                    quota[0] = min(max(quota[0] * (pace / CHAIN_STEP_S) ** 0.5, 1.0), 100.0)
                    throttled.set_quota(quota[0])
                    adjusted[0] = recent[-1]["step"]

    threading.Thread(target=throttle_while_training, daemon=True).start()
    chained = overrides(chain_root, "cluster.time_limit_min=1", "cluster.startup_min=0.5",
                        "backend.native.save_before_limit_s=0", "backend.native.max_attempts_without_checkpoint=2")
    try:
        result = train_flow(chained, dataset, data_dir)
    finally:
        stop.set()
        throttled.close()
    run = Path(result["run_dir"])
    chain = run_chain.read(run / run_chain.CHAIN_FILE)
    print(f"\nchain of {len(chain)} jobs at {step_s:.3f} s a step unthrottled: "
          + "; ".join(f"{r['checkpoint_before']}->{r['checkpoint_after']} ({run_chain.why_ended(r)})" for r in chain))
    assert result["status"] == "finished" and result["step"] == CHAIN_STEPS
    assert len(chain) >= 5 and chain[-1]["completed"]
    assert all(run_chain.advanced(r) for r in chain), "every job advanced the run"
    records = metrics_records(run / "metrics.jsonl")
    assert logged_steps(records) == list(range(1, CHAIN_STEPS + 1)), "every step exactly once, in order"
    assert len(events(records, "resumed")) == len(chain) - 1
    losses = {r["step"]: r["loss"] for r in records if "loss" in r and "event" not in r}
    assert losses == {step: r["loss"] for step, r in reference.items()}, "bit for bit"

    # a new flow run of the same spec continues the same run: at its last step already, it trains nothing
    again = train_flow(chained, dataset, data_dir)
    assert again["run_dir"] == result["run_dir"] and again["resumed_from"] == again["step"] == CHAIN_STEPS
    assert len(run_chain.read(run / run_chain.CHAIN_FILE)) == len(chain) + 1
    assert logged_steps(metrics_records(run / "metrics.jsonl")) == list(range(1, CHAIN_STEPS + 1))
