"""The job layer's contract: what a task asks of any cluster, whatever runs its jobs.

A task shapes a :class:`JobRequest`, hands it to a :class:`Backend` with its cluster, and gets the
per-task results back, or a :class:`JobFailed` that says why there are none and whether another
attempt can end otherwise. The backend follows the job while it runs (its log into the task's
log, the flow run's cancel through :class:`CancelWatch`, the job's lease renewed) and never lets
it outlive the call. ``jobs/slurm.py`` (submitit) and ``jobs/kubernetes.py`` implement it;
``tasks/executor.py`` picks one per cluster.
"""

from __future__ import annotations

import functools
import logging
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Protocol

from prefect import get_client
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.states import Cancelled, State

from jobs.node import LEASE

LOG_TAIL_LINES = 30
# How often a follow loop asks the server whether its flow run was cancelled.
CANCEL_CHECK_S = 5.0


@dataclass(frozen=True)
class JobRequest:
    """What one job needs. ``time_limit_min`` has no default: submitit's is 5 minutes."""

    name: str
    command: Callable[[], Any]
    time_limit_min: int
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    exclude: tuple[str, ...] = ()
    # Seconds before the time limit at which Slurm sends USR2 to let a program checkpoint;
    # 0 lets Slurm end the job at its limit with state TIMEOUT.
    signal_delay_s: int = 0
    # GPUs per node (--gpus-per-node), for jobs that train on NVIDIA GPUs; a cluster block's own
    # gres setting takes their place.
    gpus_per_node: int | None = None
    # Whole nodes (--exclusive), unless the cluster block lets jobs share them: stage_request says
    # which jobs ask.
    exclusive: bool = False


# The NxD Training runbooks launch every precompile and training job on trn1.32xlarge and
# trn2.48xlarge alike as `sbatch --exclusive --nodes N --cpus-per-task 128 --wrap "srun ..."`
# (AWS Neuron documentation, NxD Training tutorials: "Megatron GPT pretraining", "Llama3 70B
# pretraining"; aws-samples/awsome-distributed-training 3.test_cases/pytorch/neuronx-distributed).
TRAINIUM_CPUS_PER_TASK = 128


def takes_whole_nodes(spec: Any) -> bool:
    """Whether the training's jobs (precompile, train, and the preflight's probe shaped like them)
    ask for whole nodes. A job on several nodes does: its ranks wait on each other, so one slowed
    by a neighbour's job slows them all, as the runbooks' `--exclusive` avoids. A Trainium job
    does on one node too: the runbooks' clusters do not schedule NeuronCores as GRES, so only a
    whole node keeps another job off its devices. A one-node CPU or GPU job need not (Slurm's
    GRES gives it its GPUs alone), and so shares nodes, as tiny-local's jobs share the local
    stack's 2-CPU node with the suite's other jobs."""
    return spec.cluster.nodes > 1 or spec.backend.trainium


def stage_request(spec: Any, name: str, command: Callable[[], Any], **shape: Any) -> JobRequest:
    """A job of one stage, shaped by the spec's cluster section (nodes, CPUs and memory per task,
    time limit, the GPUs of a CUDA backend, whole nodes: :func:`takes_whole_nodes`, with the
    runbooks' CPUs per task on Trainium unless the spec sets them); ``shape`` overrides (a one-node
    job without GPUs on a shared node, a stop signal). Every task submits through
    this, and the dry run renders its sbatch scripts through it."""
    c, backend = spec.cluster, spec.backend
    defaults = {"time_limit_min": c.time_limit_min, "nodes": c.nodes, "cpus_per_task": c.cpus_per_task,
                "mem_gb": c.mem_gb, "gpus_per_node": c.devices_per_node if backend.cuda else None,
                "exclusive": takes_whole_nodes(spec)}
    request = {**defaults, **shape}
    if request["cpus_per_task"] is None and request["exclusive"] and backend.trainium:
        request["cpus_per_task"] = TRAINIUM_CPUS_PER_TASK
    return JobRequest(name, command, **request)


# ---------------------------------------------------------------- how a job ends without results

# The shell's exit statuses for a command it could not find (127) or not execute (126) (POSIX,
# Shell Command Language, 2.8.2 "Exit Status for Commands"): a tool missing on the node, which a
# second attempt on the same nodes meets again.
NOT_FOUND = re.compile(r"failed with exit code 12[67]\b")


class JobFailed(RuntimeError):
    """A job that its scheduler (Slurm, the local executor, Kubernetes) ended without a successful
    result, in Slurm's words for how: ``state`` is COMPLETED, FAILED, CANCELLED, TIMEOUT,
    NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, PENDING (never started) and the like; ``nodes`` names
    the job's nodes as the scheduler does.

    ``retryable`` tells Prefect's retry condition (tasks/artifacts.py) whether another attempt can
    end otherwise: not when the command was not found on the node, nor when the scheduler would
    never start the job; ``None`` derives it from ``detail``."""

    def __init__(self, job_id: str, name: str, state: str, detail: str, log_tail: list[str],
                 exit_code: str = "", nodes: str = "", log_path: str = "", retryable: bool | None = None):
        self.job_id, self.name, self.state = job_id, name, state
        self.exit_code, self.nodes, self.log_tail = exit_code, nodes, log_tail
        self.retryable = not NOT_FOUND.search(detail) if retryable is None else retryable
        lines = [f"job {job_id} ({name}) ended {state}"
                 + (f" with exit code {exit_code}" if exit_code else "")
                 + (f" on {nodes}" if nodes else "")
                 + (f": {detail}" if detail else "")]
        if log_tail:
            lines.append(f"last log lines ({log_path}):")
            lines += [f"  {line}" for line in log_tail]
        super().__init__("\n".join(lines))


class ClusterMismatch(ValueError):
    """The spec asks for what the cluster cannot give (nodes, memory, a tool, a device): the same
    answer every time."""

    retryable = False


class MissingClusterBlock(ValueError):
    retryable = False  # trying again finds the same nothing


def load_block(block_type: type, name: str, as_given: str, create: str) -> Any:
    """The cluster block ``name`` of ``block_type``; a missing one names ``cluster.block`` as the
    spec gives it and how to ``create`` one."""
    try:
        return block_type.load(name)
    except ValueError as exc:  # Prefect's "Unable to find block document named ..."
        raise MissingClusterBlock(
            f"cluster.block={as_given}: no {block_type.__name__} block of that name on this Prefect server ({exc}); "
            f"create it {create}") from None


# ---------------------------------------------------------------- cancelling

class FlowRunCancelled(RuntimeError):
    """The flow run was cancelled (UI, API, CLI) while a job was followed; the jobs are cancelled."""

    retryable = False


def ends_cancelled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Under ``@task``, for the tasks that follow jobs: the task of a cancelled flow run ends
    Cancelled, not Failed with a traceback, so the UI shows what happened. The task then returns
    a Cancelled state instead of its output; :func:`raise_if_cancelled` turns it back into
    :class:`FlowRunCancelled` for the flow."""

    @functools.wraps(fn)
    def task_body(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FlowRunCancelled as cancelled:
            return Cancelled(message=str(cancelled))

    return task_body


def raise_if_cancelled(output: Any) -> Any:
    """A stage's output, or :class:`FlowRunCancelled` when its task ended Cancelled."""
    if isinstance(output, State) and output.is_cancelled():
        raise FlowRunCancelled(output.message)
    return output


class CancelWatch:
    """Notices that this flow run is Cancelling or Cancelled on the server.

    Prefect ends a cancelled run by having its worker signal the flow process, which depends on
    the worker's event subscription and leaves a flow started without a worker (`pretrain run`,
    a script) running. Asking the server directly bounds the time a cancelled run's jobs live to
    one check, with or without a worker.
    """

    def __init__(self, every_s: float = CANCEL_CHECK_S):
        self.flow_run_id = flow_run.get_id()
        self.every_s = every_s
        self.next_check = time.monotonic() + every_s

    def cancelled(self) -> str | None:
        """The state's name when the run is being cancelled, checked at most every ``every_s``."""
        if self.flow_run_id is None or time.monotonic() < self.next_check:
            return None
        self.next_check = time.monotonic() + self.every_s
        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(self.flow_run_id).state
        except Exception as exc:  # the server is briefly unreachable: the job goes on, check again
            logging.getLogger(__name__).warning("could not read the flow run's state: %s", exc)
            return None
        return state.name if state is not None and (state.is_cancelling() or state.is_cancelled()) else None


def exit_on_sigterm() -> None:
    """Make SIGTERM unwind the stack (finally blocks, atexit) instead of killing the process
    outright, so the job a backend follows is cancelled on the way out; Prefect's flow engine
    installs its own handler that does the same."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))


def new_lease(directory: Path) -> Path:
    """A fresh lease for a job about to be submitted, in its own ``directory``: the job's program
    runs under it (:class:`jobs.node.Leased`) and the follow loop renews it
    (:func:`jobs.node.renew_lease`), so a job whose flow process died without cancelling it (SIGKILL,
    a lost machine) cancels itself."""
    directory.mkdir(parents=True, exist_ok=True)
    lease = directory / LEASE
    lease.touch()
    return lease


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run's logger inside a flow or task (so job logs land in the UI), else a
    plain one for scripts and tests."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


# ---------------------------------------------------------------- what a backend gives the tasks

class JobHandle(Protocol):
    """A submitted job, as its backend hands it to ``on_submit``."""

    @property
    def job_id(self) -> str: ...


class Backend(Protocol):
    """One kind of cluster's job layer, the same calls for every kind. ``cluster`` is that kind's
    own value (a SlurmCluster block; a Kubernetes target), ``job`` a handle it submitted."""

    # Whether a run allowed fewer nodes (``cluster.min_nodes``) goes on with fewer by being
    # resubmitted on the nodes left, not inside its job (a PyTorchJob's elasticPolicy).
    shrinks_by_resubmission: bool

    def job_folder(self, spec: Any, cluster: Any) -> Path:
        """Where the jobs' scripts, logs and leases go."""

    def run_job(self, request: JobRequest, cluster: Any, folder: Path, poll_s: float,
                max_wait_s: float | None, on_poll: Callable[[], None] | None,
                on_submit: Callable[[JobHandle], None] | None) -> list[Any]:
        """Submit, follow and return the per-task results, or raise :class:`JobFailed`; the job
        never outlives the call. ``on_poll`` runs once per poll while it waits (an exception it
        raises ends the wait and the job)."""

    def run_array(self, requests: list[JobRequest], cluster: Any, folder: Path, poll_s: float,
                  max_wait_s: float | None,
                  on_line: Callable[[Hashable, str], None] | None) -> list[list[Any] | JobFailed]:
        """Same-shaped requests as one array; each one's results or failure."""

    def on_nodes(self, cluster: Any, nodes: Iterable[str]) -> Any:
        """``cluster`` running its jobs only on ``nodes``, as the scheduler names them."""

    def still_queued(self, cluster: Any, job_id: str) -> bool:
        """Whether the scheduler still lists a job known by its id alone (an earlier flow run's)."""

    def running(self, job: Any) -> bool:
        """Whether the job runs now: not waiting in the queue, first or again after a requeue."""

    def wait_gone(self, job: Any, timeout_s: float) -> bool:
        """Until the job's processes have exited; False if they outlast ``timeout_s``."""

    def nodes(self, job: Any) -> list[str]:
        """The nodes the job ran on, as the scheduler names them."""

    def failure_nodes(self, failure: JobFailed) -> list[str]:
        """The nodes a failure names, one by one."""

    def lost_nodes(self, nodes: list[str]) -> set[str]:
        """Of a node failure's ``nodes``, those to leave out of the next submission."""

    def jobs_of_this_flow_run(self) -> list[dict[str, str]]:
        """``{"name", "job_id", "nodes", "outcome"}`` for each job this flow run submitted here,
        in submission order: ``nodes`` as the scheduler names them, ``outcome`` "completed", else
        the scheduler's state and why."""
