"""The Slurm job layer: submit a command through submitit, follow it, and end it; the job
contract (jobs/contract.py) on a SlurmCluster block, or on submitit's local executor.

Everything that knows about sbatch, sacct, squeue and scancel text lives in this module.
:func:`run_job` streams the job's log into the Prefect log while the job runs, fails promptly
with the state, exit code and last log lines when Slurm ends the job, and cancels the job when
the flow is cancelled or crashes; :class:`SlurmBackend` is what tasks/executor.py calls.
"""

from __future__ import annotations

import atexit
import logging
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable

import submitit
from prefect.runtime import flow_run

from blocks.cluster import SlurmCluster
from jobs.contract import (LOG_TAIL_LINES, CancelWatch, ClusterMismatch, FlowRunCancelled, JobFailed, JobRequest,
                           exit_on_sigterm, load_block, new_lease, run_logger)
from jobs.log_lines import LineSplitter
from jobs.node import LEASE, Leased, renew_lease
from jobs.nodes import expand_nodes, unhealthy_nodes
from jobs.pending import QueueWatch

# sacct states after which the job will not run again (REQUEUED is followed by a restart, and
# PREEMPTED too where the partition requeues preempted jobs: `ended` tells).
TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "REVOKED",
}
# Slurm queues a batch job again after a node failure (JobRequeue=1, the default: slurm.conf(5)),
# asking for the nodes it had, the lost one included. The job layer reports the failure and its
# caller decides what runs next (the train task resubmits without the lost node), so such a job is
# cancelled as it ends: scancel drops the requeue while the job completes, or ends the queued copy.
REQUEUED_BY_SLURM = {"NODE_FAIL"}


@dataclass(frozen=True)
class SacctRecord:
    job_id: str
    state: str
    exit_code: str
    nodes: str
    elapsed: str
    submit: str = ""
    end: str = ""


# ---------------------------------------------------------------- Slurm text, parsed here only

SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Elapsed,Submit,End"


def parse_sacct(text: str) -> dict[str, SacctRecord]:
    """Each job's record that says where it stands, of ``sacct -X --duplicates --parsable2
    --noheader -o JobID,State,ExitCode,NodeList,Elapsed,Submit,End`` (a job's records oldest
    first): its latest, except for a job Slurm queued again after losing one of its nodes.

    That job's latest record is PENDING, submitted the moment its NODE_FAIL record ended, and
    without ``--duplicates`` sacct shows only that one: the NODE_FAIL lasts less than a poll
    (measured on the local cluster: RUNNING, then PENDING with the NODE_FAIL behind it). The job
    layer ends such a job as the NODE_FAIL it was (``REQUEUED_BY_SLURM``), naming its lost node,
    instead of leaving it queued for that node.

    The state keeps only its first word: ``CANCELLED by 0`` is CANCELLED; a job that never got
    nodes has "" for them, not sacct's placeholder.
    """
    history: dict[str, list[SacctRecord]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7 or not parts[0]:
            continue
        job_id, state, exit_code, nodes, elapsed, submit, end = parts
        history.setdefault(job_id, []).append(SacctRecord(
            job_id, state.split()[0] if state else "UNKNOWN", exit_code,
            "" if nodes in ("None assigned", "(null)") else nodes, elapsed, submit, end))
    return {job_id: _where_it_stands(records) for job_id, records in history.items()}


def _where_it_stands(records: list[SacctRecord]) -> SacctRecord:
    latest = records[-1]
    if len(records) > 1 and latest.state == "PENDING":
        before = records[-2]
        if before.state in REQUEUED_BY_SLURM and before.end == latest.submit:
            return before
    return latest


def query_slurm_state(job_id: str) -> SacctRecord | None:
    """The job's accounting record; without accounting, whether squeue still lists it."""
    out = subprocess.run(
        ["sacct", "-X", "--duplicates", "--parsable2", "--noheader", "-o", SACCT_FIELDS, "-j", job_id],
        capture_output=True, text=True, timeout=60,
    )
    if out.returncode == 0:
        return parse_sacct(out.stdout).get(job_id)
    # Accounting is off or down: a job squeue no longer lists has ended (torchx does the same).
    state = queue_state(job_id)
    return SacctRecord(job_id, state or "ENDED_UNKNOWN", "", "", "")


def queue_state(job_id: str) -> str | None:
    """The job's state as squeue lists it; None once the controller no longer queues it."""
    queue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    return queue.stdout.split()[0] if queue.returncode == 0 and queue.stdout.strip() else None


def queued(job_name: str) -> list[str]:
    """``JOBID STATE`` of every job of that name that squeue still lists."""
    out = subprocess.run(["squeue", "-h", "-n", job_name, "-o", "%i %T"], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.splitlines()


def job_running(job: submitit.Job) -> bool:
    """Whether the job runs now: not waiting in the queue, first or again after a requeue."""
    if isinstance(job, submitit.LocalJob):
        return not job.done()
    record = query_slurm_state(job.job_id)
    return record is not None and record.state == "RUNNING"


def slurm_available() -> bool:
    """Whether a Slurm controller answers (``sinfo`` is quick and needs no accounting)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def executor_kind(cluster: SlurmCluster) -> str:
    if cluster.executor != "auto":
        return cluster.executor
    return "slurm" if slurm_available() else "local"


# What a job takes from the shell that submits it (sbatch --export; Slurm adds every SLURM_*
# variable, SLURM_CONF among them, and the user's login environment on the node): the interpreter
# and where it finds its modules and tools (the worker's venv), the user's home, locale and scratch.
# Everything else a stage's program reads, its job sets (the command's own environment, the block's
# env and setup lines), so what is left in the worker's shell (COMPILE=1 from an NxDT compile run by
# hand, a token, the Prefect API's credentials) never reaches a job. sbatch's default, ALL, would
# hand on the whole shell.
INHERITED_ENVIRONMENT = ("PATH", "VIRTUAL_ENV", "PYTHONPATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR")


def slurm_parameters(cluster: SlurmCluster, request: JobRequest) -> dict[str, Any]:
    """submitit SlurmExecutor parameters: the request's shape with the site's settings; the
    block's ``env`` is exported before its setup lines, which may build on it."""
    params: dict[str, Any] = {
        "job_name": request.name,
        "time": request.time_limit_min,
        "nodes": request.nodes,
        "ntasks_per_node": request.tasks_per_node,
        "signal_delay_s": request.signal_delay_s,
        "setup": [*(f"export {name}={shlex.quote(value)}" for name, value in cluster.env.items()), *cluster.setup],
        "additional_parameters": {"export": ",".join(INHERITED_ENVIRONMENT), **multi_node_options(request.nodes),
                                  **cluster.sbatch_options},
    }
    optional = {
        "cpus_per_task": request.cpus_per_task,
        "mem": f"{int(request.mem_gb * 1024)}M" if request.mem_gb else None,
        "partition": cluster.partition,
        "account": cluster.account,
        "qos": cluster.qos,
        "gres": cluster.gres,
        "gpus_per_node": None if cluster.gres else request.gpus_per_node,
        "exclusive": True if cluster.exclusive and request.exclusive else None,
        "nodelist": ",".join(cluster.nodelist) or None,
        "exclude": ",".join(sorted({*cluster.exclude, *request.exclude})) or None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    # The batch script's srun would take sbatch's --export list too (SLURM_EXPORT_ENV), dropping what
    # the script itself exports (the block's env, setup lines, submitit's SUBMITIT_EXECUTOR): its step
    # gets the batch script's environment whole, already cleared of the submitting shell.
    srun_args = ["--export=ALL"]
    if cluster.container_image:
        srun_args.append(f"--container-image={cluster.container_image}")
        if cluster.container_mounts:
            srun_args.append(f"--container-mounts={','.join(cluster.container_mounts)}")
    params["srun_args"] = srun_args
    return params


def multi_node_options(nodes: int) -> dict[str, int]:
    """sbatch options of every job on more than one node: ``--wait-all-nodes=1`` starts the batch
    script only once all its nodes have booted, as the Megatron-LM runbooks' multi-node scripts ask
    (aws-samples/awsome-distributed-training, 3.test_cases/megatron/megatron-lm/slurm/gpt3/
    2.distributed-training.sbatch and llama2/pretrain-llama2.sbatch); on clusters that power nodes
    up on demand (ParallelCluster, HyperPod) the first node would otherwise start the launch while
    the others boot."""
    return {"wait_all_nodes": 1} if nodes > 1 else {}


def sbatch_options(params: dict[str, Any]) -> list[str]:
    """The ``#SBATCH`` lines of :func:`slurm_parameters`, as submitit writes them into the batch
    script: a parameter's name is sbatch's long option with ``-`` for ``_``, True a bare flag, the
    stop signal ``--signal=USR2@<signal_delay_s>``; sorted, as submitit sorts them."""
    options = {k: v for k, v in params.items() if k not in ("setup", "srun_args", "signal_delay_s",
                                                            "additional_parameters")}
    options |= {"signal": f"{submitit.JobEnvironment.USR_SIG}@{params['signal_delay_s']}",
                **params["additional_parameters"]}
    flags = {key: f"#SBATCH --{key.replace('_', '-')}" for key in options}
    return [flags[key] if value is True else f"{flags[key]}={shlex.quote(str(value))}"
            for key, value in sorted(options.items())]


# The module submitit's Slurm executor runs in every task (submitit/slurm/slurm.py builds its srun
# line with it); it loads the job's pickled command from the folder.
SUBMITIT_RUNNER = "submitit.core._submit"


def batch_script(cluster: SlurmCluster, request: JobRequest, folder: Path) -> str:
    """The batch script of ``request`` on ``cluster`` with its job folder ``folder``, from the very
    parameters a submission hands submitit: its options, the block's env and setup lines, and the
    srun step with its arguments (the pyxis container, ``--export=ALL``), which starts submitit's
    runner of the job's pickled command on every task. The dry run shows it; submitit adds its
    own bookkeeping options (``--open-mode``, ``--wckey``)."""
    params, paths = slurm_parameters(cluster, request), submitit.core.utils.JobPaths(folder)
    # each task's output (%j: the job id, %t: the task's rank); the batch script's own, task 0's
    stdout, stderr = str(paths.stdout), str(paths.stderr)
    logs = {"output": stdout.replace("%t", "0"), "error": stderr.replace("%t", "0")}
    srun = ["srun", "--unbuffered", "--output", stdout, "--error", stderr, *params["srun_args"]]
    runner = f"{cluster.python or 'python'} -u -m {SUBMITIT_RUNNER} {shlex.quote(str(paths.folder))}"
    lines = ["#!/bin/bash", "", "# Parameters", *sbatch_options({**params, **logs}), "", "# setup", *params["setup"],
             "", "# command: submitit's runner, in every task, runs the job's pickled command from its folder",
             f"{shlex.join(srun)} {runner}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- what this host or Slurm refuses

def host_free_bytes() -> int:
    """Memory this host can give a new process without swapping (``MemAvailable``, proc(5))."""
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


def local_refusal(name: str, nodes: int, memory_bytes: int = 0) -> ClusterMismatch | None:
    """Why the local executor, which runs jobs as processes of this host, must not run a job of
    ``nodes`` nodes needing ``memory_bytes``; None when it may. The one rule for the job layer and
    the flow's preflight alike."""
    fix = ("run it on a Slurm cluster (cluster.executor=slurm, or a SlurmCluster block in cluster.block; "
           "`pretrain stack up` starts a local one)")
    if nodes > 1:
        return ClusterMismatch(f"{name}: the local executor runs 1 node, not {nodes} (cluster.nodes={nodes}); {fix}")
    if memory_bytes > (free := host_free_bytes()):
        return ClusterMismatch(f"{name}: needs {memory_bytes / 2**30:.1f} GiB of memory and this host, where the "
                               f"local executor runs it, has {free / 2**30:.1f} GiB free; {fix}")
    return None


class SubmissionRefused(RuntimeError):
    """sbatch refused the job."""

    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


# sbatch's refusals of a request the cluster can never grant (Slurm's error strings,
# src/common/slurm_errno.c); others, such as "Socket timed out" or "Slurm temporarily unable to
# accept job", may pass.
_REQUEST_REFUSED = ("Invalid partition name", "Node count specification invalid",
                    "Requested node configuration is not available", "More processors requested than permitted",
                    "Invalid account", "Invalid qos", "Requested time limit is invalid",
                    "Invalid generic resource", "Invalid feature specification", "Invalid node name",
                    "Memory required by task is not available", "Requested partition configuration not available")


def _sbatch(name: str, submit_call: Callable[[], Any]) -> Any:
    try:
        return submit_call()
    except submitit.core.utils.FailedJobError as exc:
        text = " ".join(str(exc).split())
        final = any(refusal.lower() in text.lower() for refusal in _REQUEST_REFUSED)
        raise SubmissionRefused(f"{name}: sbatch refused the job: {text}"
                                + (" (the cluster refuses this request every time: change the spec or the "
                                   "cluster block)" if final else ""), retryable=not final) from None


# ---------------------------------------------------------------- submitting and following

_active_jobs: dict[str, submitit.Job] = {}


def _cancel_active_jobs() -> None:
    """Last line of defence: a flow process that exits (cancel, crash, Ctrl-C) leaves no job."""
    for job in list(_active_jobs.values()):
        cancel(job)


atexit.register(_cancel_active_jobs)


def _job_dir(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _executor(request: JobRequest, cluster: SlurmCluster, job_dir: Path) -> submitit.Executor:
    if executor_kind(cluster) == "slurm":
        executor = submitit.SlurmExecutor(folder=job_dir, python=cluster.python or sys.executable)
        executor.update_parameters(**slurm_parameters(cluster, request))
        return executor
    if (refused := local_refusal(request.name, request.nodes)) is not None:
        raise refused
    executor = submitit.LocalExecutor(folder=job_dir)
    executor.update_parameters(timeout_min=request.time_limit_min, tasks_per_node=request.tasks_per_node,
                               signal_delay_s=request.signal_delay_s)
    return executor


def _leased(command: Callable[[], Any], cluster: SlurmCluster, job_dir: Path) -> Callable[[], Any]:
    """``command`` under a lease that :func:`wait_all` renews while it follows the job: should
    this process die without cancelling (SIGKILL, a lost machine), the job cancels itself."""
    if not cluster.lease_timeout_s:
        return command
    return Leased(command, str(new_lease(job_dir)), cluster.lease_timeout_s)


def _renew_lease(job: submitit.Job) -> None:
    renew_lease(str(Path(job.paths.folder) / LEASE))


# Every job this process submitted, per flow run (None outside one), in submission order: the
# run summary lists the jobs of every stage, those of a failed run too.
_submitted: dict[Any, list[tuple[str, submitit.Job]]] = {}


def _remember(names: list[str], jobs: list[submitit.Job]) -> None:
    _submitted.setdefault(flow_run.get_id(), []).extend(zip(names, jobs))


def local_node() -> str:
    """The node of a local-executor job: this machine, by its host name, which is also what the
    node programs record where Slurm names no node (``SLURMD_NODENAME`` unset)."""
    return socket.gethostname()


def job_outcome(record: SacctRecord) -> str:
    """How a job ended, from its accounting record: "completed" (the word the train stage's
    attempts use), else Slurm's state with a non-zero exit code (``FAILED with exit code 1:0``);
    "" while it may still run."""
    if record.state == "COMPLETED":
        return "completed"
    if record.state == "ENDED_UNKNOWN":
        return "ended (no Slurm accounting to say how)"
    if record.state not in TERMINAL_STATES and record.state != "PREEMPTED":
        return ""
    return record.state + (f" with exit code {record.exit_code}" if record.exit_code not in ("", "0:0") else "")


def _local_record(job: submitit.Job) -> SacctRecord:
    """A local-executor job's record in Slurm's terms (it has no accounting)."""
    if not job.done():
        return SacctRecord(job.job_id, "RUNNING", "", local_node(), "")
    try:
        failed = job.exception() is not None
    except submitit.core.utils.UncompletedJobError:  # ended without a result: killed
        failed = True
    return SacctRecord(job.job_id, "FAILED" if failed else "COMPLETED", "", local_node(), "")


def jobs_of_this_flow_run() -> list[dict[str, str]]:
    """``{"name", "job_id", "nodes", "outcome"}`` for each job this flow run submitted.

    ``nodes`` names the nodes as Slurm does (its NodeName, compressed as accounting writes it:
    ``node-[1-4]``; "" before a job started): the name ``--nodelist`` takes and the node programs
    record (``SLURMD_NODENAME``), which may differ from the machine's host name (the local stack's
    node ``localhost`` runs on whatever host it is). Local-executor jobs name the host
    (:func:`local_node`). ``outcome``: :func:`job_outcome`.
    """
    jobs = []
    for name, job in _submitted.get(flow_run.get_id(), []):
        record = _local_record(job) if isinstance(job, submitit.LocalJob) else query_slurm_state(job.job_id)
        jobs.append({"name": name, "job_id": job.job_id, "nodes": record.nodes if record is not None else "",
                     "outcome": job_outcome(record) if record is not None else ""})
    return jobs


def submit(request: JobRequest, cluster: SlurmCluster, folder: Path) -> submitit.Job:
    """Submit ``request``; its scripts and logs go to a fresh directory under ``folder``.

    A fresh directory per submission keeps a reset cluster's reused job ids from finding an
    older job's result files.
    """
    job_dir = _job_dir(folder, request.name)
    executor = _executor(request, cluster, job_dir)
    exit_on_sigterm()
    job = _sbatch(request.name, lambda: executor.submit(_leased(request.command, cluster, job_dir)))
    _active_jobs[job.job_id] = job
    _remember([request.name], [job])
    return job


def submit_array(requests: list[JobRequest], cluster: SlurmCluster, folder: Path) -> list[submitit.Job]:
    """Submit same-shaped requests as one Slurm job array (one job each on the local executor)."""
    job_dir = _job_dir(folder, requests[0].name)
    executor = _executor(requests[0], cluster, job_dir)
    exit_on_sigterm()
    jobs = _sbatch(requests[0].name,
                   lambda: executor.submit_array([_leased(r.command, cluster, job_dir) for r in requests]))
    _active_jobs.update({job.job_id: job for job in jobs})
    _remember([r.name for r in requests], jobs)
    return jobs


def run_array(requests: list[JobRequest], cluster: SlurmCluster, folder: Path, poll_s: float = 2.0,
              max_wait_s: float | None = None, on_line: Callable[[int, str], None] | None = None,
              ) -> list[list[Any] | JobFailed]:
    """Submit an array, follow every task, and return each one's results or failure; no array
    task outlives this call. ``on_line``: as in :func:`wait_all`."""
    jobs = submit_array(requests, cluster, folder)
    run_logger().info("submitted %d x %s as %s", len(jobs), requests[0].name, ", ".join(j.job_id for j in jobs))
    try:
        return wait_all(jobs, [r.name for r in requests], poll_s=poll_s, max_wait_s=max_wait_s, on_line=on_line)
    finally:
        for job in jobs:
            if job.job_id in _active_jobs:
                cancel(job)


def cancel(job: submitit.Job) -> None:
    _active_jobs.pop(job.job_id, None)
    try:
        job.cancel(check=False)
    except Exception as exc:  # the job may be gone already; cancelling is best effort by nature
        logging.getLogger(__name__).warning("could not cancel job %s: %s", job.job_id, exc)


class LogFollower:
    """Reads the lines that the job's tasks appended to their logs since the last call."""

    def __init__(self, job: submitit.Job):
        self.paths = []
        for i in range(job.num_tasks):
            paths = job.task(i).paths
            self.paths += [(i, paths.stdout), (i, paths.stderr)]
        self.offsets = {path: 0 for _, path in self.paths}
        self.splitters = {path: LineSplitter() for _, path in self.paths}
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)

    def read_new(self) -> list[tuple[int, str]]:
        lines = []
        for task, path in self.paths:
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[path])
                    data = f.read()
            except FileNotFoundError:
                continue
            self.offsets[path] += len(data)
            for line in self.splitters[path].feed(data.decode(errors="replace")):
                lines.append((task, line))
                self.tail.append(line)
        return lines


def _job_record(job: submitit.Job) -> tuple[SacctRecord | None, bool]:
    """The job's record now, and whether the job has ended (it will not run again).

    Slurm's state decides, not the result files: a requeued or preempted attempt may leave an
    error result behind that the next attempt replaces.
    """
    if isinstance(job, submitit.LocalJob):
        return SacctRecord(job.job_id, job.state, "", local_node(), ""), job.done()
    record = query_slurm_state(job.job_id)
    return record, record is not None and ended(record)


def ended(record: SacctRecord) -> bool:
    """Whether the job will not run again. PREEMPTED is final where the partition cancels
    preempted jobs (spot capacity) and passing where it requeues them; squeue, which lists a
    requeued job again, tells which."""
    if record.state == "PREEMPTED":
        return queue_state(record.job_id) is None
    return record.state in TERMINAL_STATES or record.state == "ENDED_UNKNOWN"


def _outcome(job: submitit.Job, name: str, record: SacctRecord, follower: LogFollower) -> list[Any] | JobFailed:
    """The per-task results of an ended job, or the failure that says why there are none."""
    def failed(state: str, detail: str) -> JobFailed:
        if state == "NODE_FAIL" and (lost := sorted(unhealthy_nodes(expand_nodes(record.nodes)))):
            # The node list names every node of the job; Slurm's node states tell which one it lost.
            detail = "; ".join(filter(None, [f"lost node {', '.join(lost)}", detail]))
        return JobFailed(job.job_id, name, state, detail, list(follower.tail),
                              exit_code=record.exit_code, nodes=record.nodes, log_path=str(job.paths.stdout))

    if not isinstance(job, submitit.LocalJob) and not all(
            job.task(i).paths.result_pickle.exists() for i in range(job.num_tasks)):
        return failed(record.state, "")
    try:
        return job.results()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as exc:
        return failed(record.state if record.state in {*TERMINAL_STATES, "PREEMPTED"} else "FAILED",
                      failure_reason(str(exc)))


def failure_reason(text: str) -> str:
    """The line that says why, from submitit's failure text: the last line of the job's
    traceback (``CommandFailed: ... exit code 1``), not the log paths submitit appends."""
    lines = [line.strip() for line in text.split("You can check full logs", 1)[0].splitlines()]
    lines = [line for line in lines if line and set(line) != {"-"}]
    return lines[-1] if lines else "no reason given"


def wait_all(jobs: list[submitit.Job], names: list[str], poll_s: float = 2.0,
             max_wait_s: float | None = None, on_poll: Callable[[], None] | None = None,
             on_line: Callable[[int, str], None] | None = None) -> list[list[Any] | JobFailed]:
    """Follow ``jobs`` (an array's tasks, say) to their ends, logging their output.

    Returns, per job, its per-task results or the :class:`JobFailed` that ended it, so the
    caller can keep what succeeded and retry only what failed. ``on_poll`` runs once per poll
    while jobs are pending (progress reports, hang checks); an exception it raises ends the wait.
    ``on_line`` sees each log line as it is streamed, with the index of its job in ``jobs``.
    A cancelled flow run cancels the jobs and raises :class:`FlowRunCancelled`. A job Slurm keeps
    pending for a reason it will never satisfy is cancelled and ends as a non-retryable failure.
    """
    logger = run_logger()
    followers = [LogFollower(job) for job in jobs]
    queue = [QueueWatch(job.job_id, name, logger) for job, name in zip(jobs, names)]
    outcomes: list[list[Any] | JobFailed | None] = [None] * len(jobs)
    deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
    watch = CancelWatch()

    def stream(i: int) -> None:
        job = jobs[i]
        for task, line in followers[i].read_new():
            logger.info("[%s%s] %s", job.job_id, f".{task}" if job.num_tasks > 1 else "", line)
            if on_line is not None:
                on_line(i, line)

    pending = list(range(len(jobs)))
    while pending:
        for i in list(pending):
            stream(i)
            record, done = _job_record(jobs[i])
            if done:
                time.sleep(0.2)  # the last lines reach the log just before the job ends
                stream(i)
                if record.state in REQUEUED_BY_SLURM:
                    cancel(jobs[i])
                else:
                    _active_jobs.pop(jobs[i].job_id, None)
                outcomes[i] = _outcome(jobs[i], names[i], record, followers[i])
                pending.remove(i)
            elif (not isinstance(jobs[i], submitit.LocalJob) and record is not None and record.state == "PENDING"
                  and (never := queue[i].pending())):
                cancel(jobs[i])
                outcomes[i] = JobFailed(jobs[i].job_id, names[i], "PENDING", never, [], retryable=False)
                pending.remove(i)
        if pending and deadline is not None and time.monotonic() > deadline:
            for i in pending:
                cancel(jobs[i])
                outcomes[i] = JobFailed(jobs[i].job_id, names[i], "CANCELLED",
                                             f"no result after {max_wait_s:.0f} s", list(followers[i].tail),
                                             log_path=str(jobs[i].paths.stdout))
            break
        if pending and (state := watch.cancelled()):
            for i in pending:
                cancel(jobs[i])
            ids = ", ".join(jobs[i].job_id for i in pending)
            logger.warning("the flow run is %s: cancelled Slurm job(s) %s", state, ids)
            raise FlowRunCancelled(f"the flow run was cancelled ({state}); cancelled Slurm job(s) {ids}")
        if pending:
            for i in pending:
                _renew_lease(jobs[i])
            if on_poll is not None:
                on_poll()
            time.sleep(poll_s)
    return outcomes  # type: ignore[return-value]


def wait(job: submitit.Job, name: str, poll_s: float = 2.0, max_wait_s: float | None = None,
         on_poll: Callable[[], None] | None = None) -> list[Any]:
    """Follow one job to its end; its per-task results, or :class:`JobFailed` with the reason
    as soon as it ends without them."""
    (outcome,) = wait_all([job], [name], poll_s, max_wait_s, on_poll)
    if isinstance(outcome, JobFailed):
        raise outcome
    return outcome


def run_job(request: JobRequest, cluster: SlurmCluster, folder: Path, poll_s: float = 2.0,
            max_wait_s: float | None = None, on_submit: Callable[[submitit.Job], None] | None = None,
            on_poll: Callable[[], None] | None = None) -> list[Any]:
    """Submit, follow and return the per-task results; the job never outlives this call."""
    job = submit(request, cluster, folder)
    run_logger().info("submitted %s as job %s (%s)", request.name, job.job_id, job.paths.folder)
    if on_submit is not None:
        on_submit(job)
    try:
        return wait(job, request.name, poll_s=poll_s, max_wait_s=max_wait_s, on_poll=on_poll)
    finally:
        if job.job_id in _active_jobs:  # left by an exception: a cancelled flow, a crash
            cancel(job)


def wait_gone(job: submitit.Job, timeout_s: float, poll_s: float = 1.0) -> bool:
    """Until the job's processes have exited (squeue no longer lists it, COMPLETING included);
    False if they outlast ``timeout_s``. A cancelled training job's ranks save a checkpoint into
    the run directory on their way out: the next attempt must not start beside them."""
    deadline = time.monotonic() + timeout_s
    while not job.done() if isinstance(job, submitit.LocalJob) else queue_state(job.job_id) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def load_cluster_block(name: str) -> SlurmCluster:
    return load_block(SlurmCluster, name, repr(name), f"in the UI (Blocks > Slurm Cluster) or with "
                      f"SlurmCluster(...).save({name!r}), or leave cluster.block unset")


def cluster_for(spec: Any) -> SlurmCluster:
    """The spec's SlurmCluster block (or the defaults), with the spec's executor choice."""
    cluster = load_cluster_block(spec.cluster.block) if spec.cluster.block else SlurmCluster()
    if spec.cluster.executor != "auto":
        cluster = cluster.model_copy(update={"executor": spec.cluster.executor})
    return cluster


def job_folder(spec: Any, cluster: SlurmCluster) -> Path:
    """Where job scripts and logs go: the block's shared folder, else ``<paths.root>/jobs``."""
    return Path(cluster.job_folder or Path(spec.paths.root) / "jobs").expanduser()


class SlurmBackend:
    """The job contract's :class:`jobs.contract.Backend` on a SlurmCluster block: Slurm, or
    submitit's local executor; its job handles are submitit's jobs."""

    shrinks_by_resubmission = True

    def job_folder(self, spec: Any, cluster: SlurmCluster) -> Path:
        return job_folder(spec, cluster)

    def run_job(self, request: JobRequest, cluster: SlurmCluster, folder: Path, poll_s: float,
                max_wait_s: float | None, on_poll: Callable[[], None] | None,
                on_submit: Callable[[submitit.Job], None] | None) -> list[Any]:
        return run_job(request, cluster, folder, poll_s, max_wait_s, on_submit=on_submit, on_poll=on_poll)

    def run_array(self, requests: list[JobRequest], cluster: SlurmCluster, folder: Path, poll_s: float,
                  max_wait_s: float | None,
                  on_line: Callable[[Hashable, str], None] | None) -> list[list[Any] | JobFailed]:
        """``on_line`` sees each line with the index of its job in ``requests``."""
        return run_array(requests, cluster, folder, poll_s, max_wait_s, on_line)

    def on_nodes(self, cluster: SlurmCluster, nodes: Iterable[str]) -> SlurmCluster:
        return cluster.model_copy(update={"nodelist": list(nodes)})

    def still_queued(self, cluster: SlurmCluster, job_id: str) -> bool:
        """A local-executor job is followed by the flow run that made it only: False."""
        return executor_kind(cluster) != "local" and queue_state(job_id) is not None

    def running(self, job: submitit.Job) -> bool:
        return job_running(job)

    def jobs_of_this_flow_run(self) -> list[dict[str, str]]:
        return jobs_of_this_flow_run()

    def wait_gone(self, job: submitit.Job, timeout_s: float) -> bool:
        return wait_gone(job, timeout_s)

    def nodes(self, job: submitit.Job) -> list[str]:
        """Accounting's nodes of the job; none for a local-executor job."""
        if isinstance(job, submitit.LocalJob):
            return []
        record = query_slurm_state(job.job_id)
        return expand_nodes(record.nodes) if record else []

    def failure_nodes(self, failure: JobFailed) -> list[str]:
        return expand_nodes(failure.nodes)  # Slurm compresses them: node-[1-4]

    def lost_nodes(self, nodes: list[str]) -> set[str]:
        """Those Slurm now holds unhealthy: the others did nothing wrong, and leaving all of a
        many-node job's nodes out could leave too few to schedule the retry on."""
        return unhealthy_nodes(nodes)
