"""A run as a chain of jobs, without a cluster: the chain's records and arithmetic, the failure
budget's count, the run directory a new flow run continues, each backend's newest checkpoint, the
time-limit check and each backend's way of saving before the limit, and the checkpoint interval
(``auto``) resolved from what a run measured. The chain on the real Slurm cluster is
tests/test_run_chain_jobs.py."""

from __future__ import annotations

import json

import pytest

from pretrain import run_chain
from pretrain.checkpoint_interval import failure_inputs, measured_stall_s, planned, resolved
from pretrain.checkpoints import megatron_step, native_step, torchtitan_step
from pretrain.presets import SpecError, load_spec
from render.job_end import megatron_exit_duration_min, nxdt_max_time, signal_delay_s
from render.megatron_lm import pretrain_gpt_args
from render.nxdt import nxdt_config
from tasks.runs import run_key_inputs
from flows.dry_run import render_files
from trainer.run_layout import MARKER, step_dir

pytestmark = pytest.mark.pure


def job(before: int, after: int, step: int, outcome: str, *, submitted: float = 0.0, ended: float = 100.0,
        caught_up: float | None = None, completed: bool = False, nodes: int = 2) -> dict:
    return {"flow_run": "f", "job": "1", "nodes": "a,b", "node_count": nodes, "submitted": submitted,
            "caught_up_at": caught_up, "ended": ended, "checkpoint_before": before, "checkpoint_after": after,
            "step": step, "outcome": outcome, "completed": completed}


# ---------------------------------------------------------------- the chain's records


def test_the_budget_counts_only_the_jobs_in_a_row_since_the_checkpoint_last_advanced():
    chain = [job(0, 0, 3, "FAILED: crash"), job(0, 10, 14, "TIMEOUT: limit"), job(10, 10, 12, "FAILED: crash"),
             job(10, 10, 11, "hung: no new metrics")]
    assert run_chain.attempts_without_checkpoint(chain) == 2
    assert run_chain.attempts_without_checkpoint(chain[:2]) == 0  # the time limit after an advance costs none
    assert run_chain.attempts_without_checkpoint([*chain, job(10, 20, 20, "FAILED: crash")]) == 0


def test_why_a_job_ended_takes_the_trainers_words_before_the_schedulers():
    assert run_chain.why_ended(job(0, 10, 10, "FAILED: job 4 ended FAILED with exit code 1:0 -- the trainer "
                                               "stopped on SIGUSR2 at step 10 and saved a checkpoint")) == "time limit"
    assert run_chain.why_ended(job(0, 10, 10, "PREEMPTED: job 5 ended PREEMPTED")) == "preempted"
    assert run_chain.why_ended(job(0, 0, 2, "NODE_FAIL: job 6 ended NODE_FAIL")) == "node failure"
    assert run_chain.why_ended(job(0, 0, 2, "FAILED: job 7 ended FAILED with exit code 1:0")) == "failed"
    assert run_chain.why_ended(job(0, 30, 30, "completed", completed=True)) == "completed"
    assert run_chain.why_ended(job(0, 20, 20, "completed")) == "exited before the last step"  # an exit duration


def test_the_time_lost_between_jobs_runs_from_one_end_to_the_next_jobs_catching_up():
    chain = [job(0, 10, 12, "TIMEOUT", submitted=0, ended=100), job(10, 20, 25, "TIMEOUT", submitted=100,
                                                                      ended=200, caught_up=130),
             job(20, 20, 20, "FAILED", submitted=200, ended=250)]
    assert run_chain.lost_before(chain, 0) is None
    assert run_chain.lost_before(chain, 1) == 30.0
    assert run_chain.lost_before(chain, 2) is None  # never got past step 25: its whole time is lost


def test_goodput_is_the_kept_steps_time_over_the_wall_time_since_the_first_job():
    chain = [job(0, 10, 12, "TIMEOUT", submitted=1000, ended=1100), job(10, 20, 23, "TIMEOUT", submitted=1100,
                                                                         ended=1200)]
    assert run_chain.goodput(chain, step_s=5.0, now=1200) == pytest.approx(20 * 5 / 200)
    done = [*chain, job(20, 30, 30, "completed", submitted=1200, ended=1300, completed=True)]
    assert run_chain.goodput(done, step_s=5.0, now=1300) == pytest.approx(30 * 5 / 300)
    assert run_chain.goodput(chain, step_s=None, now=1200) is None


def test_failures_count_crashes_and_node_failures_not_time_limits_or_preemptions():
    chain = [job(0, 10, 12, "TIMEOUT", ended=3600), job(10, 10, 11, "NODE_FAIL", ended=3600),
             job(10, 10, 11, "FAILED: exit 1", ended=3600), job(10, 20, 20, "PREEMPTED", ended=3600)]
    node_hours, failures = run_chain.failure_history(chain)
    assert node_hours == pytest.approx(4 * 2) and failures == 2


def test_the_chain_file_keeps_every_record_and_drops_only_a_torn_line(tmp_path):
    path = tmp_path / run_chain.CHAIN_FILE
    first, second, third = job(0, 10, 10, "TIMEOUT"), job(10, 20, 20, "TIMEOUT"), job(20, 30, 30, "TIMEOUT")
    run_chain.append(path, first)
    run_chain.append(path, second)
    with open(path, "a") as f:
        f.write('{"flow_run": "f", "job": ')  # the flow process died writing it
    assert run_chain.read(path) == [first, second]
    run_chain.append(path, third)  # the next flow run's job: on a line of its own, not joined to the torn one
    assert run_chain.read(path) == [first, second, third]
    assert run_chain.read(tmp_path / "none.jsonl") == []


def test_the_chain_artifact_has_a_row_per_job_the_goodput_and_the_budget_left():
    chain = [job(0, 10, 12, "TIMEOUT: job 1 ended TIMEOUT"), job(10, 10, 11, "FAILED: job 2 | crashed")]
    text = run_chain.markdown("tiny: chain of jobs", chain, 3, step_s=1.0, now=200, advice=["best: every 5 steps"])
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 2
    assert "0 -> 12 (+12)" in rows[0] and "| time limit: TIMEOUT" in rows[0] and "| no |" in rows[0]
    assert "| yes |" in rows[1] and "job 2 / crashed" in rows[1]  # a | in an outcome does not split the row
    assert "jobs in a row without a new checkpoint: 1 of 3 allowed" in text
    assert "- best: every 5 steps" in text


# ---------------------------------------------------------------- which run a flow run continues


def test_a_new_flow_run_continues_the_run_unless_what_it_trains_changed():
    spec = load_spec("tiny-local")
    key = run_key_inputs(spec, "/data/x")
    for driving in ("cluster.time_limit_min=60", "backend.native.max_attempts_without_checkpoint=10",
                    "backend.native.hang_timeout_min=30", "training.checkpoint_interval=20", "cluster.block=other",
                    "backend.native.save_before_limit_s=120", "description=longer"):
        assert run_key_inputs(load_spec("tiny-local", [driving]), "/data/x") == key, driving
    for trained in ("training.lr=0.01", "model.num_layers=2", "name=tiny-local-again", "training.seed=7"):
        assert run_key_inputs(load_spec("tiny-local", [trained]), "/data/x") != key, trained
    assert run_key_inputs(spec, "/data/y") != key
    # afresh: a flow run of its own (outside a flow run, the placeholder stands for its id)
    assert "flow_run" in run_key_inputs(load_spec("tiny-local", ["training.continue_run=false"]), "/data/x")
    assert "flow_run" in run_key_inputs(load_spec("tiny-local", ["training.benchmark=true"]), "/data/x")
    assert "flow_run" not in key


# ---------------------------------------------------------------- the spec


def test_the_old_budget_field_is_refused_naming_the_new_one():
    with pytest.raises(SpecError) as refused:
        load_spec("tiny-local", ["backend.native.max_restarts=3"])
    assert "backend.native: max_restarts=3 is no longer read" in str(refused.value)
    assert "use max_attempts_without_checkpoint" in str(refused.value)
    with pytest.raises(SpecError, match="stop_signal_delay_s=90 is no longer read .* use save_before_limit_s"):
        load_spec("tiny-local", ["backend.native.stop_signal_delay_s=90"])


def test_a_time_limit_no_job_can_advance_the_run_in_is_refused_with_its_parts():
    with pytest.raises(SpecError) as refused:
        load_spec("llama3-70b", ["training.checkpoint_interval=1000"])
    message = str(refused.value)
    assert ("cluster.time_limit_min=4320 is shorter than one job needs to advance the run: cluster.startup_min=20 + "
            "backend.neuron.save_before_limit_s=600 + training.checkpoint_interval=1000 x training.step_time_s=320"
            in message)
    assert "raise the time limit, or lower the checkpoint interval" in message
    # without a step time, start-up and the save alone must fit
    with pytest.raises(SpecError, match="cluster.startup_min=0.5 \\+ backend.native.save_before_limit_s=90 = 2.0 min"):
        load_spec("tiny-local", ["cluster.time_limit_min=1", "cluster.startup_min=0.5"])
    assert load_spec("tiny-local", ["cluster.time_limit_min=1", "cluster.startup_min=0.5",
                                    "backend.native.save_before_limit_s=0"]).cluster.time_limit_min == 1


def test_auto_needs_a_step_time_and_is_resolved_before_any_launch():
    with pytest.raises(SpecError, match="checkpoint_interval=auto needs training.step_time_s"):
        load_spec("tiny-local", ["training.checkpoint_interval=auto"])
    spec = load_spec("llama3.1-70b")
    assert spec.training.checkpoint_interval == "auto"
    with pytest.raises(ValueError, match="auto reached a launch unresolved"):
        spec.training.checkpoint_steps  # noqa: B018
    first = planned(spec).training.checkpoint_interval
    assert isinstance(first, int) and 1 < first < 1000
    # `pretrain render` shows the first job's interval; its spec.yaml keeps auto
    files = render_files(spec)
    assert f"every_n_train_steps: {first}\n" in files["nxdt_config.yaml"]
    assert "checkpoint_interval: auto" in files["spec.yaml"]


def test_auto_follows_what_the_run_measures():
    spec = load_spec("llama3.1-70b")
    slow_saves = resolved(spec, failure_inputs(spec, stall_s=600.0)).training.checkpoint_interval
    quick_saves = resolved(spec, failure_inputs(spec, stall_s=5.0)).training.checkpoint_interval
    assert quick_saves < slow_saves
    # a chain that failed often lowers the MTBF it assumes, and checkpoints more often
    failing = [job(0, 0, 1, "FAILED: crash", submitted=0, ended=3600, nodes=16) for _ in range(20)]
    assert resolved(spec, failure_inputs(spec, chain=failing)).training.checkpoint_interval < planned(
        spec).training.checkpoint_interval


def test_the_save_stall_is_the_gap_around_a_checkpoint_less_the_step():
    points = [{"step": s, "time": 100.0 + s + (2.5 if s > 10 else 0) + (2.5 if s > 20 else 0), "step_time_ms": 1000.0}
              for s in range(1, 31)]
    assert measured_stall_s(points, 10) == pytest.approx(2.5)
    assert measured_stall_s([{"step": 1, "loss": 2.0}], 10) is None  # a log without step times


# ---------------------------------------------------------------- each backend's newest checkpoint


def test_each_backends_newest_complete_checkpoint(tmp_path):
    native = tmp_path / "native"
    for step, complete in ((10, True), (20, True), (30, False)):
        step_dir(native, step).mkdir(parents=True)
        if complete:
            (step_dir(native, step) / MARKER).write_text("{}")
    assert native_step(native) == 20 and native_step(tmp_path / "none") == 0

    titan = tmp_path / "titan"
    for step, complete in ((5, True), (15, False)):
        (titan / f"step-{step}").mkdir(parents=True)
        if complete:
            (titan / f"step-{step}" / ".metadata").write_bytes(b"")
    assert torchtitan_step(titan) == 5

    megatron = tmp_path / "megatron"
    megatron.mkdir()
    assert megatron_step(megatron) == 0
    (megatron / "latest_checkpointed_iteration.txt").write_text("2000\n")
    assert megatron_step(megatron) == 2000
    (megatron / "latest_checkpointed_iteration.txt").write_text("release")
    assert megatron_step(megatron) == 0  # weights to start from, not progress


# ---------------------------------------------------------------- saving before the time limit


def test_every_backend_saves_before_its_time_limit_by_its_own_means():
    native = load_spec("tiny-local")
    assert signal_delay_s(native) == native.backend.native.save_before_limit_s == 90
    assert "--signal=USR2@90" in render_files(native)["sbatch_train.sh"]

    gpt = load_spec("gpt3-7.5b-gpu")  # 2880 min, 600 s ahead
    assert signal_delay_s(gpt) == 0 and megatron_exit_duration_min(gpt) == 2870
    args = pretrain_gpt_args(gpt, "/data/x_text_document", "/runs/r/checkpoints")
    assert args[args.index("--exit-duration-in-mins") + 1] == "2870" and "--exit-signal-handler" in args

    llama = load_spec("llama3-70b")  # 4320 min less 20 of start-up and 10 of saving
    assert nxdt_max_time(llama) == "02:23:30:00"
    config = nxdt_config(llama, "/data", None)
    assert config["trainer"]["max_time"] == "02:23:30:00"
    assert config["exp_manager"]["checkpoint_callback_params"]["save_last"] is True
    assert json.dumps(config)  # the conf stays plain data
