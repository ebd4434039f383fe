"""The Slurm job layer against the real local cluster: every way a job can end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from prefect import flow, get_client, task
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from blocks.cluster import SlurmCluster
from deployments.stack.processes import alive
from jobs.node import Command
from jobs.nodes import expand_nodes
from slurm_faults import PREEMPT_GRES, preempt
from jobs.contract import JobFailed, JobRequest
from jobs.slurm import (batch_script, job_outcome, jobs_of_this_flow_run, parse_sacct, queue_state, run_array,
                        run_job, slurm_parameters, submit, wait)

SLURM = SlurmCluster(executor="slurm")
LOCAL = SlurmCluster(executor="local")


def bash(script: str) -> Command:
    return Command(["bash", "-c", script])


def squeue_ids() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def wait_running(job, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job.job_id, "-o", "%T"], capture_output=True, text=True)
        if out.stdout.strip() == "RUNNING" and job.paths.stdout.exists():
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job.job_id} did not start")


# ---------------------------------------------------------------- pure parts


T0, T1 = "2026-11-29T10:07:37", "2026-11-29T10:08:11"


def sacct_lines(*records: str) -> str:
    """sacct lines of SACCT_FIELDS, each given without its Submit and End."""
    return "".join(f"{record}|{T0}|{T1}\n" for record in records)


def test_parse_sacct_reads_states_exit_codes_and_nodes():
    text = sacct_lines("41|COMPLETED|0:0|localhost|00:00:01", "42|CANCELLED by 0|0:15|localhost|00:00:07",
                       "43_1|TIMEOUT|0:0|n[1-2]|00:01:30", "44|PENDING|0:0|None assigned|00:00:00")
    records = parse_sacct(text)
    assert records["44"].nodes == ""  # not sacct's placeholder, which no consumer could use as a node list
    assert records["41"].state == "COMPLETED"
    assert records["42"].state == "CANCELLED" and records["42"].exit_code == "0:15"
    assert records["43_1"].nodes == "n[1-2]"


def test_a_job_slurm_queued_again_after_losing_a_node_stands_as_its_node_fail():
    """sacct --duplicates of a 3-node job whose node3 died (the local cluster's, as measured):
    the NODE_FAIL record, then the requeued copy, PENDING from the moment the NODE_FAIL ended.
    Without the NODE_FAIL the job layer would leave the copy waiting for the lost node."""
    requeued = (f"2|NODE_FAIL|0:0|node[1-3]|00:00:33|{T0}|{T1}\n"
                f"2|PENDING|0:0|None assigned|00:00:00|{T1}|Unknown\n")
    record = parse_sacct(requeued)["2"]
    assert (record.state, record.nodes) == ("NODE_FAIL", "node[1-3]")
    # a PENDING job whose earlier record ended at another time is that PENDING job (a reused id)
    reused = requeued.replace(f"|{T1}|Unknown", "|2026-11-30T08:00:00|Unknown")
    assert parse_sacct(reused)["2"].state == "PENDING"


def test_job_outcome_says_how_every_ended_job_ended():
    """The run summary's jobs table left the outcome of every job but training's empty."""
    records = parse_sacct(sacct_lines("41|COMPLETED|0:0|localhost|00:00:01", "42|FAILED|1:0|localhost|00:00:07",
                                      "43|CANCELLED by 0|0:15|n[1-2]|00:00:07", "44|TIMEOUT|0:0|n1|00:30:00",
                                      "45|PENDING|0:0|None assigned|00:00:00", "46|RUNNING|0:0|n1|00:00:03"))
    assert {job_id: job_outcome(r) for job_id, r in records.items()} == {
        "41": "completed", "42": "FAILED with exit code 1:0", "43": "CANCELLED with exit code 0:15",
        "44": "TIMEOUT", "45": "", "46": ""}


def test_slurm_parameters_render_site_settings_and_never_submitits_default_time(tmp_path):
    cluster = SlurmCluster(executor="slurm", partition="trn1", account="ml", exclusive=True,
                           exclude=["bad-1"], container_image="nvcr.io/nvidia/pytorch:25.01-py3",
                           container_mounts=["/fsx:/fsx"], setup=["module load neuron"],
                           sbatch_options={"constraint": "trn1.32xlarge"})
    request = JobRequest("train", Command(["true"]), time_limit_min=720, nodes=16,
                         tasks_per_node=1, exclude=("bad-2",), signal_delay_s=300, exclusive=True)
    params = slurm_parameters(cluster, request)
    assert params["time"] == 720 and params["nodes"] == 16 and params["exclusive"] is True
    assert params["exclude"] == "bad-1,bad-2"
    assert params["srun_args"] == ["--export=ALL", "--container-image=nvcr.io/nvidia/pytorch:25.01-py3",
                                   "--container-mounts=/fsx:/fsx"]
    script = batch_script(cluster, request, tmp_path)
    for line in ("#SBATCH --time=720", "#SBATCH --nodes=16", "#SBATCH --partition=trn1",
                 "#SBATCH --account=ml", "#SBATCH --exclude=bad-1,bad-2", "#SBATCH --exclusive",
                 "#SBATCH --signal=USR2@300", "#SBATCH --constraint=trn1.32xlarge", "module load neuron"):
        assert line in script


def test_time_limit_is_required():
    with pytest.raises(TypeError):
        JobRequest("x", Command(["true"]))  # type: ignore[call-arg]


@pytest.mark.pure
def test_every_node_derives_one_master_port_below_the_ephemeral_range(monkeypatch):
    """Outgoing connections and servers bound to port 0 take ports from Linux's ephemeral range: a
    job's master port there was once held by another process, and torchrun failed (EADDRINUSE)."""
    from jobs.node import distributed_environment

    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    monkeypatch.delenv("MASTER_PORT", raising=False)
    for variable, value in (("SUBMITIT_EXECUTOR", "local"), ("SUBMITIT_LOCAL_NTASKS", "2"),
                            ("SUBMITIT_LOCAL_JOB_NUM_NODES", "2"), ("SUBMITIT_LOCAL_GLOBALID", "0"),
                            ("SUBMITIT_LOCAL_LOCALID", "0")):
        monkeypatch.setenv(variable, value)
    ports = set()
    for job_id in range(1, 2000):
        monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", str(job_id))
        by_node = set()
        for node in ("0", "1"):
            monkeypatch.setenv("SUBMITIT_LOCAL_NODEID", node)
            by_node.add(int(distributed_environment()["MASTER_PORT"]))
        assert len(by_node) == 1  # both nodes agree without talking
        ports |= by_node
    assert 1024 < min(ports) and max(ports) < low, (min(ports), max(ports), low)
    assert len(ports) > 1500  # spread: two jobs on one host rarely meet


# ---------------------------------------------------------------- real cluster


def test_success_returns_and_streams_the_log_into_the_prefect_task_log(local_stack, shared_dir):
    @task
    def hello() -> list:
        return run_job(JobRequest("hello", bash("echo hello from job $SLURM_JOB_ID"), time_limit_min=2),
                       SLURM, shared_dir, poll_s=0.5)

    @flow
    def hello_flow() -> list:
        return hello()

    state = hello_flow(return_state=True)
    assert state.result() == [0]
    deadline = time.monotonic() + 30  # Prefect ships logs to the API in the background
    while True:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
        streamed = [log for log in logs if "hello from job" in log.message]
        if streamed or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert streamed and streamed[0].task_run_id is not None


def test_failing_command_reports_state_exit_code_and_last_lines(local_stack, shared_dir):
    with pytest.raises(JobFailed) as info:
        run_job(JobRequest("fails", bash("echo working; echo 'disk quota exceeded' >&2; exit 3"),
                           time_limit_min=2), SLURM, shared_dir, poll_s=0.5)
    err = info.value
    assert err.state == "FAILED"
    assert "exit code 3" in str(err)
    assert "disk quota exceeded" in str(err)
    # the first line says why (the program's failure), not where submitit's logs are
    assert str(err).splitlines()[0].endswith("failed with exit code 3")


def test_scancel_fails_the_wait_promptly(local_stack, shared_dir):
    job = submit(JobRequest("victim", bash("sleep 300"), time_limit_min=5), SLURM, shared_dir)
    wait_running(job)
    subprocess.run(["scancel", job.job_id], check=True)
    started = time.monotonic()
    with pytest.raises(JobFailed) as info:
        wait(job, "victim", poll_s=0.5)
    assert info.value.state == "CANCELLED"
    assert time.monotonic() - started < 20


def test_two_tasks_get_torchrun_ranks(local_stack, shared_dir):
    out = shared_dir / "ranks"
    out.mkdir()
    script = f'echo "$RANK $WORLD_SIZE $LOCAL_RANK $NODE_RANK $NNODES $MASTER_ADDR $MASTER_PORT" > {out}/$RANK'
    results = run_job(JobRequest("ranks", bash(script), time_limit_min=2, tasks_per_node=2),
                      SLURM, shared_dir, poll_s=0.5)
    assert results == [0, 0]
    lines = sorted((out / str(r)).read_text().split() for r in (0, 1))
    assert [line[:6] for line in lines] == [["0", "2", "0", "0", "1", "localhost"],
                                            ["1", "2", "1", "0", "1", "localhost"]]
    assert lines[0][6] == lines[1][6]  # one master port for all ranks


def test_requeued_job_runs_again_and_succeeds(local_stack, shared_dir):
    marker = shared_dir / "restarted"
    script = f'if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then touch {marker}; else sleep 300; fi'
    job = submit(JobRequest("requeue", bash(script), time_limit_min=5), SLURM, shared_dir)
    wait_running(job)
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    assert wait(job, "requeue", poll_s=0.5, max_wait_s=120) == [0]
    assert marker.exists()


def test_a_job_preempted_on_spot_capacity_fails_the_wait_as_preempted(local_stack, shared_dir):
    # A program that does not stop on SIGTERM is killed at the end of the grace time, and Slurm
    # then keeps reporting PREEMPTED for a job that will not run again: the wait must end.
    ignoring = shared_dir / "ignoring-term"
    job = submit(JobRequest("spot-victim", bash(f"trap '' TERM; touch {ignoring}; sleep 300 & wait; wait"),
                            time_limit_min=5),
                 SlurmCluster(executor="slurm", partition="spot", gres=PREEMPT_GRES), shared_dir)
    wait_running(job)
    # Preempted before the program is up, the job dies of the SIGTERM at once and Slurm records
    # FAILED (exit 15), not PREEMPTED: preempt only once the program ignores SIGTERM.
    deadline = time.monotonic() + 60
    while not ignoring.exists():
        assert time.monotonic() < deadline, "the job's program did not start"
        time.sleep(0.2)
    preempt()
    with pytest.raises(JobFailed) as info:
        wait(job, "spot-victim", poll_s=0.5, max_wait_s=120)
    assert info.value.state == "PREEMPTED"


def test_a_job_preempted_where_preemption_requeues_runs_again_and_succeeds(local_stack, shared_dir):
    marker = shared_dir / "restarted"
    script = f'if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then touch {marker}; else sleep 300; fi'
    job = submit(JobRequest("preempted", bash(script), time_limit_min=5),
                 SlurmCluster(executor="slurm", partition="preemptible", gres=PREEMPT_GRES), shared_dir)
    bystander = submit(JobRequest("bystander", bash("sleep 300"), time_limit_min=5), SLURM, shared_dir)
    try:
        wait_running(job)
        wait_running(bystander)
        preempt()
        assert wait(job, "preempted", poll_s=0.5, max_wait_s=120) == [0]
        assert marker.exists()
        # The preemptor took the slot the preempted job held; a job in `debug` runs on (the other
        # tests' jobs, which run beside this one).
        assert bystander.state == "RUNNING"
    finally:
        bystander.cancel()


def test_a_job_sets_what_its_program_reads_and_takes_nothing_else_from_the_submitting_shell(
        local_stack, shared_dir, monkeypatch):
    """sbatch hands the submitting shell to a job by default: a COMPILE=1 left in the worker's shell
    would turn NxDT's training into a 10-step graph extraction, and a token there would reach every
    node. NxDT cannot run here: the job runs the rendered train.sh with its torchrun line replaced by
    a program that records the environment it was started with."""
    import json

    from pretrain.presets import load_spec
    from render.nxdt_scripts import node_script, train_environment

    monkeypatch.setenv("COMPILE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_left_in_the_workers_shell")
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "pretrain:the-workers-credential")  # the API's, if it has auth
    # the node script checks that NxDT's orchestrator is there before its launch, which here records
    # the environment instead: an empty file where the examples would be
    examples = shared_dir / "examples"
    examples.mkdir()
    (examples / "training_orchestrator.py").touch()
    spec = load_spec("llama3-70b", [f"paths.root={shared_dir}", f"backend.neuron.examples_dir={examples}"])
    report = [sys.executable, "-c", "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"]
    script = shared_dir / "train.sh"
    script.write_text(node_script(spec, "NxDT training on this node (train.sh)", train_environment(spec, None),
                                  str(shared_dir / "conf"), str(shared_dir / "run"),
                                  [*report, str(shared_dir / "program.json")], "train.log"))
    assert "export COMPILE=0" in script.read_text().splitlines()
    cluster = SlurmCluster(executor="slurm", env={"PRETRAIN_PEAK_TFLOPS": "95 (a site's)"})
    run_job(JobRequest("nxdt-environment", Command([*report, str(shared_dir / "job.json")]), time_limit_min=2),
            cluster, shared_dir, poll_s=0.5)
    run_job(JobRequest("nxdt-train", Command(["bash", str(script)]), time_limit_min=2), cluster, shared_dir,
            poll_s=0.5)
    job, program = (json.loads((shared_dir / f"{name}.json").read_text()) for name in ("job", "program"))
    assert "COMPILE" not in job and "HF_TOKEN" not in job  # nothing of the shell beyond what a job needs
    assert not any("the-workers-credential" in value for value in (*job.values(), *program.values()))
    assert job["PATH"] == os.environ["PATH"] and job["SLURM_CONF"] == os.environ["SLURM_CONF"]
    assert job["PRETRAIN_PEAK_TFLOPS"] == "95 (a site's)"  # the block's env
    assert program["COMPILE"] == "0" and "HF_TOKEN" not in program  # the program trains


def test_time_limit_ends_with_timeout(local_stack, shared_dir):
    # Slurm checks limits every ~30 s, then waits KillWait: about 60-100 s in all.
    with pytest.raises(JobFailed) as info:
        run_job(JobRequest("too-long", bash("sleep 600"), time_limit_min=1), SLURM, shared_dir, poll_s=1)
    assert info.value.state == "TIMEOUT"


def test_flow_process_terminated_cancels_its_job(local_stack, shared_dir):
    """What a Prefect worker does on cancel (SIGTERM to the flow process) leaves no job."""
    ids = shared_dir / "job-id"
    program = textwrap.dedent(f"""
        from pathlib import Path
        from blocks.cluster import SlurmCluster
        from jobs.node import Command
        from jobs.contract import JobRequest
        from jobs.slurm import run_job
        run_job(JobRequest("orphan", Command(["sleep", "300"]), time_limit_min=5),
                SlurmCluster(executor="slurm"), Path({str(shared_dir)!r}), poll_s=0.5,
                on_submit=lambda job: Path({str(ids)!r}).write_text(job.job_id))
    """)
    proc = subprocess.Popen([sys.executable, "-c", program], env=os.environ.copy())
    deadline = time.monotonic() + 60
    while not ids.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    job_id = ids.read_text()
    assert job_id in squeue_ids()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while job_id in squeue_ids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_id not in squeue_ids()


def orphan_program(shared_dir, ids, cluster: str) -> str:
    return textwrap.dedent(f"""
        from pathlib import Path
        from blocks.cluster import SlurmCluster
        from jobs.node import Command
        from jobs.contract import JobRequest
        from jobs.slurm import run_job
        run_job(JobRequest("orphan", Command(["sleep", "300"]), time_limit_min=5),
                SlurmCluster.model_validate({cluster}), Path({str(shared_dir)!r}), poll_s=0.5,
                on_submit=lambda job: Path({str(ids)!r}).write_text(job.job_id))
    """)


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_killed_flow_process_leaves_no_job_behind(local_stack, shared_dir, executor):
    """SIGKILL runs no cleanup at all: the job notices its lease is no longer renewed."""
    ids = shared_dir / "job-id"
    cluster = {"executor": executor, "lease_timeout_s": 6}
    # As `nohup prefect worker start &` from a script starts it: SIGINT ignored, inherited by the
    # local executor's job, which must still stop when its lease lapses.
    proc = subprocess.Popen([sys.executable, "-c", orphan_program(shared_dir, ids, repr(cluster))],
                            env=os.environ.copy(), start_new_session=executor == "local",
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not ids.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    job_id = ids.read_text()
    if executor == "slurm":  # the lease is watched from the job's start; it may wait behind an exclusive job
        deadline = time.monotonic() + 180
        while queue_state(job_id) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.5)
    time.sleep(10)  # longer than the lease: a followed job is left alone
    if executor == "slurm":
        assert job_id in squeue_ids()
    else:
        assert int(job_id) > 0 and alive(int(job_id))
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (job_id in squeue_ids() if executor == "slurm" else alive(int(job_id))):
        time.sleep(0.5)
    assert job_id not in squeue_ids() if executor == "slurm" else not alive(int(job_id))
    log = next(shared_dir.glob(f"orphan-*/{job_id}_0_log.out")).read_text()
    assert "has not renewed" in log and "cancelling the job" in log


# ---------------------------------------------------------------- local executor


def test_local_executor_runs_and_reports_failures(shared_dir, monkeypatch):
    assert run_job(JobRequest("local-ok", bash("echo ok"), time_limit_min=2), LOCAL, shared_dir,
                   poll_s=0.2) == [0]
    with pytest.raises(JobFailed) as info:
        run_job(JobRequest("local-bad", bash("echo broken >&2; exit 4"), time_limit_min=2), LOCAL,
                shared_dir, poll_s=0.2)
    assert "exit code 4" in str(info.value) and "broken" in str(info.value)
    # The jobs table names the host the node programs name where no Slurm names the node, and
    # says how each job ended.
    jobs = {job["name"]: job for job in jobs_of_this_flow_run() if job["name"] in ("local-ok", "local-bad")}
    assert {name: (job["nodes"], job["outcome"]) for name, job in jobs.items()} == {
        "local-ok": (socket.gethostname(), "completed"), "local-bad": (socket.gethostname(), "FAILED")}
    # On a machine without Slurm (what the local executor is for), a failure's nodes are still
    # named: the precompile and train tables list the host, not scontrol's absence.
    monkeypatch.setenv("PATH", "/nonexistent")
    assert expand_nodes(info.value.nodes) == [socket.gethostname()]


def test_array_returns_each_tasks_outcome_so_only_failures_are_retried(local_stack, shared_dir):
    requests = [JobRequest("shard", bash(script), time_limit_min=2)
                for script in ("echo shard 0", "echo shard 1 broke >&2; exit 5", "echo shard 2")]
    outcomes = run_array(requests, SLURM, shared_dir, poll_s=0.5)
    assert outcomes[0] == [0] and outcomes[2] == [0]
    assert isinstance(outcomes[1], JobFailed)
    assert "exit code 5" in str(outcomes[1]) and "shard 1 broke" in str(outcomes[1])
    assert outcomes[1].job_id.endswith("_1")  # one Slurm array, task 1
