"""The Kubernetes job layer: submit a stage's command as a Job, an Indexed Job or a PyTorchJob
through the official client, follow it, and end it; the job contract (jobs/contract.py) on a
KubernetesCluster block, as the Slurm layer is on a SlurmCluster (:class:`KubernetesBackend`).

Everything that reads Kubernetes objects lives here. How a job ended is told in the words the
tasks already understand, Slurm's: COMPLETED, FAILED with the container's exit code,
OUT_OF_MEMORY for an OOMKilled container, PREEMPTED for a pod the scheduler preempted or the
kubelet evicted (nothing the command did: a retry can succeed), TIMEOUT for a Job past its
activeDeadlineSeconds, CANCELLED for one deleted; failures raise or return
:class:`jobs.contract.JobFailed` with the pod's reason, exit code, node and last log lines.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from pathlib import Path
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Iterable, Protocol

from prefect.runtime import flow_run

from blocks.kubernetes import KubernetesCluster
from jobs.contract import (LOG_TAIL_LINES, CancelWatch, FlowRunCancelled, JobFailed, JobRequest, exit_on_sigterm,
                           new_lease, run_logger)
from jobs.log_lines import LineSplitter
from jobs.node import Command, renew_lease

KUBEFLOW_GROUP, KUBEFLOW_VERSION, PYTORCHJOBS = "kubeflow.org", "v1", "pytorchjobs"
# The pods of a batch Job carry its name in this label (set by the Job controller); those of a
# PyTorchJob in the training operator's.
JOB_POD_LABEL = "batch.kubernetes.io/job-name"
PYTORCHJOB_POD_LABEL = "training.kubeflow.org/job-name"
# DisruptionTarget reasons (Kubernetes' pod disruption conditions) that say the pod was taken
# away, not that its command failed.
DISRUPTED = {"PreemptionByKubeScheduler", "PreemptionByScheduler", "TerminationByKubelet",
             "EvictionByEvictionAPI", "DeletionByPodGC"}
# The node lifecycle controller evicts the pods of a node tainted NoExecute (not ready,
# unreachable, or taken out of service): the node, not the pod, is suspect, as after Slurm's
# NODE_FAIL, and the next attempt leaves it out.
NODE_LOST = "DeletionByTaintManager"


@dataclass(frozen=True)
class KubernetesTarget:
    """Where a stage's jobs go on Kubernetes: the site's block and the run's spec (the image,
    the labels and the node shape come from both); ``nodelist``: run only on these nodes, as
    SlurmCluster's (training after a precompile on them)."""

    cluster: KubernetesCluster
    spec: Any
    nodelist: tuple[str, ...] = ()

    @property
    def node_mtbf_h(self) -> float | None:
        """The site's per-node MTBF its block gives, if any, as a SlurmCluster block gives it."""
        return self.cluster.node_mtbf_h


@dataclass(frozen=True)
class PodOutcome:
    """How one pod ended, in Slurm's words; ``state`` "" while it may still run."""

    state: str
    exit_code: str = ""
    detail: str = ""
    node: str = ""


def pod_outcome(status: dict[str, Any], node: str = "") -> PodOutcome:
    """How a pod ended, from its ``status`` as the API returns it (camelCase keys).

    A disruption condition or an eviction wins over the container's exit code: a preempted pod's
    container may well have exited 137 from the SIGKILL after its grace period. An OOMKilled
    container is out of memory even when the runtime recorded exit code 0 and the pod Succeeded.
    """
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True" \
                and condition.get("reason") in DISRUPTED | {NODE_LOST}:
            state = "NODE_FAIL" if condition["reason"] == NODE_LOST else "PREEMPTED"
            return PodOutcome(state, "", f"{condition['reason']}: {condition.get('message', '')}".strip(), node)
    if status.get("reason") == "Evicted":
        return PodOutcome("PREEMPTED", "", f"Evicted: {status.get('message', '').strip()}", node)
    if status.get("reason") == "DeadlineExceeded":
        return PodOutcome("TIMEOUT", "", status.get("message", ""), node)
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            name = container.get("name")
            return PodOutcome("OUT_OF_MEMORY", str(terminated.get("exitCode", "")),
                              f"container {name} OOMKilled" if name else "OOMKilled", node)
    phase = status.get("phase")
    if phase == "Succeeded":
        return PodOutcome("COMPLETED", "0", "", node)
    if phase == "Failed":
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated:
                reason = terminated.get("reason") or "Error"
                return PodOutcome("FAILED", str(terminated.get("exitCode", "")),
                                  f"{reason}: {terminated['message']}" if terminated.get("message") else reason, node)
        return PodOutcome("FAILED", "", status.get("message") or status.get("reason") or "", node)
    return PodOutcome("")


def job_condition(status: dict[str, Any]) -> tuple[str, str] | None:
    """The finished condition (type, reason: message) of a Job's or a Kubeflow job's status:
    Complete or Succeeded, or Failed; None while it runs. Both kinds use conditions with
    ``type`` and ``status: "True"``."""
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Succeeded", "Failed"):
            text = ": ".join(part for part in (condition.get("reason"), condition.get("message")) if part)
            return condition["type"], text
    return None


def job_outcome(status: dict[str, Any], pods: list[PodOutcome]) -> PodOutcome:
    """How a whole job ended: its own condition says whether; its pods say why, the first pod
    that ended badly speaking for the job, as the first failed task does for a Slurm job, with
    the nodes of the pods that ended as it did (those a NODE_FAIL names are left out next)."""
    finished = job_condition(status)
    if finished is None:
        return PodOutcome("")
    kind, text = finished
    if kind in ("Complete", "Succeeded"):
        return PodOutcome("COMPLETED", "0", text)
    bad = [p for p in pods if p.state and p.state != "COMPLETED"]
    if bad:
        return PodOutcome(bad[0].state, bad[0].exit_code, "; ".join(filter(None, (bad[0].detail, text))),
                          ",".join(sorted({p.node for p in bad if p.node and p.state == bad[0].state})))
    if "DeadlineExceeded" in text:
        return PodOutcome("TIMEOUT", "", text)
    return PodOutcome("FAILED", "", text)


# A job gone while followed: deleted by hand (`kubectl delete`), or by an operator.
DELETED = PodOutcome("CANCELLED", "", "the job was deleted")


def described(outcome: PodOutcome) -> str:
    """A job's outcome in the Slurm layer's words (``jobs.slurm.job_outcome``): "completed", else
    the state, a non-zero exit code and why."""
    if outcome.state == "COMPLETED":
        return "completed"
    code = f" with exit code {outcome.exit_code}" if outcome.exit_code not in ("", "0") else ""
    return f"{outcome.state}{code}" + (f": {outcome.detail}" if outcome.detail else "")


class PodLogs:
    """The lines of a job's pods' logs, each pod's log read once, in order, as it grows: one
    thread per pod reads the API's follow stream and hands on what arrives."""

    def __init__(self) -> None:
        self.chunks: queue.Queue[tuple[str, str]] = queue.Queue()
        self.splitters: dict[str, LineSplitter] = {}
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.followed: set[str] = set()

    def add(self, pod: str, chunk: str) -> None:
        self.chunks.put((pod, chunk))

    def read_new(self) -> list[tuple[str, str]]:
        lines = []
        while True:
            try:
                pod, chunk = self.chunks.get_nowait()
            except queue.Empty:
                return lines
            for line in self.splitters.setdefault(pod, LineSplitter()).feed(chunk):
                lines.append((pod, line))
                self.tail.append(line)

    def follow(self, core: Any, namespace: str, pod: str, container: str) -> None:
        """Start reading ``pod``'s log (once per pod), from its first line to its end."""
        if pod in self.followed:
            return
        self.followed.add(pod)

        def read() -> None:
            try:
                stream = core.read_namespaced_pod_log(pod, namespace, container=container, follow=True,
                                                      _preload_content=False)
                for data in stream.stream(decode_content=True):
                    self.add(pod, data.decode(errors="replace"))
            except Exception as exc:  # the pod was deleted under the stream: its lines so far are kept
                self.add(pod, f"\n[log stream of {pod} ended: {exc}]\n")

        threading.Thread(target=read, name=f"logs-{pod}", daemon=True).start()


@dataclass
class SubmittedJob:
    """A job created on the cluster: its kind and name, the client it was created with, and what
    the last poll read of its pods."""

    kind: str  # "Job" or "PyTorchJob"
    name: str
    namespace: str
    api: KubernetesApi = field(repr=False)
    container: str = "pytorch"  # whose log is the job's log
    logs: PodLogs = field(default_factory=PodLogs)
    lease: str | None = None  # the file its pods' lease watches (jobs/lease.py); None: no lease
    nodes: list[str] = field(default_factory=list)  # of its pods, in their names' order
    phases: dict[str, str] = field(default_factory=dict)  # of its pods, by name
    outcome: str = ""  # how it ended, once it has: the run summary's words (:func:`described`)

    @property
    def running(self) -> bool:
        """Whether it runs now: a pod of it has left the queue (the scheduler's, the kubelet's)."""
        return "Running" in self.phases.values()

    @property
    def job_id(self) -> str:
        return f"{self.namespace}/{self.name}"


def api_configuration(cluster: KubernetesCluster) -> Any:
    """Where the API server is and how to authenticate: the block's ``api_server`` as it is, else
    the pod's service account when the flow itself runs in a pod (a Kubernetes work pool), else
    the block's kubeconfig context. A configuration of its own, never the client's global default,
    so two blocks can name two clusters in one process."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if cluster.api_server:
        configuration.host = cluster.api_server
        return configuration
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(context=cluster.kubeconfig_context, client_configuration=configuration)
    return configuration


class KubernetesApi:
    """The three API groups the job layer uses, on one client of the block's cluster."""

    def __init__(self, cluster: KubernetesCluster):
        from kubernetes import client

        api_client = client.ApiClient(api_configuration(cluster))
        self.core, self.batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.serialize = api_client.sanitize_for_serialization


def pod_commands(requests: list[JobRequest]) -> list[Command]:
    """The command lines the pods run, one per request, with the image's interpreter."""
    commands = [r.command for r in requests]
    if not all(isinstance(c, Command) for c in commands):
        raise TypeError("the Kubernetes job layer runs command lines (jobs.node.Command), not Python callables")
    # The tasks name this process's interpreter, which is the compute nodes' on a shared Slurm
    # filesystem; in a pod it is the image's.
    return [replace(c, argv=["python", *c.argv[1:]]) if c.argv[:1] == [sys.executable] else c
            for c in commands]  # type: ignore[union-attr]


class Manifests(Protocol):
    """What the job layer asks of the rendering (render/kubernetes.py): the caller hands it in,
    so the job layer never imports the rendering, which sits above it."""

    CONTAINER: str

    def job_name(self, request_name: str) -> str: ...

    def leased(self, commands: list[Command], lease: str, timeout_s: int) -> list[Command]: ...

    def manifest_for(self, request: JobRequest, target: KubernetesTarget, commands: list[Command], stage: str,
                     name: str) -> dict[str, Any]: ...


# The jobs each flow run submitted (by flow run id; None outside a flow), in order, with the name
# of the request they were made for: what the run summary lists.
_submitted: dict[Any, list[tuple[str, SubmittedJob]]] = {}


def jobs_of_this_flow_run() -> list[dict[str, str]]:
    """``{"name", "job_id", "nodes", "outcome"}`` for each job this flow run created: ``job_id``
    is ``namespace/name``, ``nodes`` the Kubernetes nodes of its pods, ``outcome``
    :func:`described` ("" for a job that has not ended)."""
    return [{"name": name, "job_id": job.job_id, "nodes": ",".join(job.nodes), "outcome": job.outcome}
            for name, job in _submitted.get(flow_run.get_id(), [])]


def submit(api: KubernetesApi, requests: list[JobRequest], target: KubernetesTarget, folder: Path,
           stage: str, manifests: Manifests) -> SubmittedJob:
    """Create the job of ``requests`` (one command each), its pods under a fresh lease in
    ``folder``/NAME/ when the block asks for one."""
    name, commands, lease = manifests.job_name(requests[0].name), pod_commands(requests), None
    if target.cluster.lease_timeout_s:
        lease = new_lease(Path(folder) / name)
        commands = manifests.leased(commands, str(lease), target.cluster.lease_timeout_s)
    body = manifests.manifest_for(requests[0], target, commands, stage, name)
    meta = body["metadata"]
    exit_on_sigterm()  # a worker cancels a flow run with SIGTERM: unwind, so the job is deleted
    if body["kind"] == "PyTorchJob":
        api.custom.create_namespaced_custom_object(KUBEFLOW_GROUP, KUBEFLOW_VERSION, meta["namespace"], PYTORCHJOBS, body)
    else:
        api.batch.create_namespaced_job(meta["namespace"], body)
    job = SubmittedJob(body["kind"], meta["name"], meta["namespace"], api, manifests.CONTAINER,
                       lease=str(lease) if lease else None)
    _submitted.setdefault(flow_run.get_id(), []).append((requests[0].name, job))
    return job


def _unless_gone(call: Callable[[], Any]) -> Any:
    """``call()``, or None when its object is gone (404): deleted, by this layer or by hand."""
    from kubernetes.client.exceptions import ApiException

    try:
        return call()
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


def _said(exc: Any) -> str:
    """What the API server said in an error answer: its Status object's message."""
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


def find_claim(cluster: KubernetesCluster) -> tuple[str, str]:
    """Whether the block's volume claim, which every pod mounts, is there: ``("", its phase)``, or
    what is missing (``"namespace"`` or ``"claim"``) and the API server's words for it. A GET of
    a claim in a namespace that does not exist is answered as a claim not found, so the namespace
    is asked about only then; one this process may not read (a namespaced service account: 403)
    is left to the claim's answer."""
    from kubernetes.client.exceptions import ApiException

    api = KubernetesApi(cluster)
    try:
        claim = api.core.read_namespaced_persistent_volume_claim(cluster.volume_claim, cluster.namespace)
        return "", f"phase {claim.status.phase}" if claim.status else "no status yet"
    except ApiException as exc:
        if exc.status != 404:
            raise
        claim_missing = _said(exc)
    try:
        api.core.read_namespace(cluster.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return "namespace", _said(exc)
        if exc.status != 403:
            raise
    return "claim", claim_missing


def cancel(api: KubernetesApi, job: SubmittedJob) -> None:
    """Delete the job and, before it is gone, its pods (foreground propagation), so a cancelled
    training job's ranks are stopped before anything resubmits beside them. A job already gone
    is what was asked."""
    from kubernetes.client import V1DeleteOptions

    options = V1DeleteOptions(propagation_policy="Foreground")
    job.outcome = job.outcome or "CANCELLED: deleted by the flow run"
    if job.kind == "PyTorchJob":
        _unless_gone(lambda: api.custom.delete_namespaced_custom_object(
            KUBEFLOW_GROUP, KUBEFLOW_VERSION, job.namespace, PYTORCHJOBS, job.name, body=options))
    else:
        _unless_gone(lambda: api.batch.delete_namespaced_job(job.name, job.namespace, body=options))


def _status(api: KubernetesApi, job: SubmittedJob) -> dict[str, Any] | None:
    """The job's status; None once it is gone."""
    if job.kind == "PyTorchJob":
        obj = _unless_gone(lambda: api.custom.get_namespaced_custom_object_status(
            KUBEFLOW_GROUP, KUBEFLOW_VERSION, job.namespace, PYTORCHJOBS, job.name))
        return None if obj is None else obj.get("status") or {}
    obj = _unless_gone(lambda: api.batch.read_namespaced_job_status(job.name, job.namespace))
    return None if obj is None else api.serialize(obj.status) or {}


def _pods(api: KubernetesApi, job: SubmittedJob) -> list[tuple[str, PodOutcome]]:
    label = PYTORCHJOB_POD_LABEL if job.kind == "PyTorchJob" else JOB_POD_LABEL
    pods = api.core.list_namespaced_pod(job.namespace, label_selector=f"{label}={job.name}").items
    seen = []
    pods = sorted(pods, key=lambda pod: pod.metadata.name)
    for pod in pods:
        status = api.serialize(pod.status) or {}
        if status.get("phase") not in (None, "Pending"):
            job.logs.follow(api.core, job.namespace, pod.metadata.name, job.container)
        seen.append((pod.metadata.name, pod_outcome(status, pod.spec.node_name or "")))
    job.phases = {pod.metadata.name: pod.status.phase or "Pending" for pod in pods}
    # a pod deleted after the job ended takes its node with it: the nodes seen last stay
    job.nodes = list(dict.fromkeys(pod.spec.node_name for pod in pods if pod.spec.node_name)) or job.nodes
    return seen


def wait_all(api: KubernetesApi, jobs: list[SubmittedJob], names: list[str], poll_s: float = 5.0,
             max_wait_s: float | None = None, on_poll: Callable[[], None] | None = None,
             on_line: Callable[[str, str], None] | None = None) -> list[PodOutcome | JobFailed]:
    """Follow ``jobs`` to their ends, their pods' logs streamed into the task's log (and to
    ``on_line``, with the pod's name); a cancelled flow run deletes them and raises
    :class:`FlowRunCancelled`."""
    logger = run_logger()
    outcomes: list[PodOutcome | JobFailed | None] = [None] * len(jobs)
    deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
    watch = CancelWatch()
    pending = list(range(len(jobs)))
    while pending:
        for i in list(pending):
            job = jobs[i]
            pods = _pods(api, job)
            status = _status(api, job)
            outcome = DELETED if status is None else job_outcome(status, [p for _, p in pods])
            if outcome.state:
                time.sleep(0.5)  # the log streams deliver the last lines as the pods end
            for pod, line in job.logs.read_new():
                logger.info("[%s] %s", pod, line)
                if on_line is not None:
                    on_line(pod, line)
            if outcome.state:
                job.outcome = described(outcome)
                pending.remove(i)
                outcomes[i] = outcome if outcome.state == "COMPLETED" else JobFailed(
                    job.job_id, names[i], outcome.state, outcome.detail, list(job.logs.tail),
                    exit_code=outcome.exit_code, nodes=outcome.node, log_path=f"kubectl logs -n {job.namespace} "
                    f"-l {PYTORCHJOB_POD_LABEL if job.kind == 'PyTorchJob' else JOB_POD_LABEL}={job.name}")
        if pending and deadline is not None and time.monotonic() > deadline:
            why = f"no result after {max_wait_s:.0f} s"
            for i in pending:
                jobs[i].outcome = described(PodOutcome("CANCELLED", "", why))
                cancel(api, jobs[i])
                outcomes[i] = JobFailed(jobs[i].job_id, names[i], "CANCELLED", why, list(jobs[i].logs.tail))
            break
        if pending and (state := watch.cancelled()):
            for i in pending:
                cancel(api, jobs[i])
            ids = ", ".join(jobs[i].job_id for i in pending)
            logger.warning("the flow run is %s: deleted Kubernetes job(s) %s", state, ids)
            raise FlowRunCancelled(f"the flow run was cancelled ({state}); deleted Kubernetes job(s) {ids}")
        if pending:
            for i in pending:
                if jobs[i].lease:
                    renew_lease(jobs[i].lease)
            if on_poll is not None:
                on_poll()
            time.sleep(poll_s)
    return outcomes


def run_job(request: JobRequest, target: KubernetesTarget, folder: Path, manifests: Manifests,
            poll_s: float = 5.0, max_wait_s: float | None = None,
            on_poll: Callable[[], None] | None = None,
            on_submit: Callable[[SubmittedJob], None] | None = None) -> list[int]:
    """Submit, follow and return one result per node (0, the exit code of a command that
    succeeded, as the Slurm layer's Command returns it); the job never outlives this call."""
    api = KubernetesApi(target.cluster)
    job = submit(api, [request], target, folder, request.name, manifests)
    run_logger().info("submitted %s as %s %s", request.name, job.kind, job.job_id)
    if on_submit is not None:
        on_submit(job)
    try:
        (outcome,) = wait_all(api, [job], [request.name], poll_s, max_wait_s, on_poll)
    finally:
        cancel_if_running(api, job)
    if isinstance(outcome, JobFailed):
        raise outcome
    return [0] * request.nodes


def run_array(requests: list[JobRequest], target: KubernetesTarget, folder: Path, manifests: Manifests,
              poll_s: float = 5.0, max_wait_s: float | None = None,
              on_line: Callable[[str, str], None] | None = None) -> list[list[int] | JobFailed]:
    """Same-shaped requests as one Indexed Job; every index's outcome (an index that failed is a
    :class:`JobFailed`, the others ``[0]``)."""
    api = KubernetesApi(target.cluster)
    job = submit(api, requests, target, folder, requests[0].name.split("-")[0], manifests)
    run_logger().info("submitted %d x %s as Indexed Job %s", len(requests), requests[0].name, job.job_id)
    try:
        (outcome,) = wait_all(api, [job], [requests[0].name], poll_s, max_wait_s, on_line=on_line)
        # an index the job lists as failed failed; a job ended as a whole (deleted, past its
        # deadline) failed every index that had not finished
        failed = (failed_indexes(_status(api, job) or {}) or set(range(len(requests)))
                  if isinstance(outcome, JobFailed) else set())
    finally:
        cancel_if_running(api, job)
    return [outcome if i in failed else [0] for i in range(len(requests))]  # type: ignore[misc]


def failed_indexes(status: dict[str, Any]) -> set[int]:
    """The indexes an Indexed Job lists as failed (``failedIndexes``, "1,3-5,7")."""
    indexes: set[int] = set()
    for part in filter(None, (status.get("failedIndexes") or "").split(",")):
        first, _, last = part.partition("-")
        indexes.update(range(int(first), int(last or first) + 1))
    return indexes


def cancel_if_running(api: KubernetesApi, job: SubmittedJob) -> None:
    """A job left by an exception (a cancelled flow, a crash) is deleted; a finished one is left
    to its ttlSecondsAfterFinished, so `kubectl logs` still shows it."""
    status = _status(api, job)
    if status is not None and job_condition(status) is None:
        cancel(api, job)


def wait_gone(job: SubmittedJob, timeout_s: float, poll_s: float = 1.0) -> bool:
    """Until no pod of the job is pending or running; False if one outlasts ``timeout_s``. A
    deleted training job's ranks save a checkpoint on their way out (SIGTERM, then the grace
    period): the next attempt must not start beside them."""
    deadline = time.monotonic() + timeout_s
    while _pods(job.api, job) and {"Pending", "Running"} & set(job.phases.values()):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


class KubernetesBackend:
    """The job contract's :class:`jobs.contract.Backend` on a KubernetesCluster block, its
    ``manifests`` handed in by the caller; its job handles are :class:`SubmittedJob`."""

    # A run allowed fewer nodes goes on with fewer inside its PyTorchJob (elasticPolicy).
    shrinks_by_resubmission = False

    def __init__(self, manifests: Manifests):
        self.manifests = manifests

    def job_folder(self, spec: Any, cluster: KubernetesTarget) -> Path:
        """Where the jobs' leases go (their logs are the pods': ``kubectl logs``)."""
        return Path(spec.paths.root) / "jobs"

    def run_job(self, request: JobRequest, cluster: KubernetesTarget, folder: Path, poll_s: float,
                max_wait_s: float | None, on_poll: Callable[[], None] | None,
                on_submit: Callable[[SubmittedJob], None] | None) -> list[Any]:
        return run_job(request, cluster, folder, self.manifests, poll_s, max_wait_s, on_poll, on_submit)

    def run_array(self, requests: list[JobRequest], cluster: KubernetesTarget, folder: Path, poll_s: float,
                  max_wait_s: float | None,
                  on_line: Callable[[Hashable, str], None] | None) -> list[list[Any] | JobFailed]:
        """``on_line`` sees each line with the name of its pod (an Indexed Job's pods are its tasks)."""
        return run_array(requests, cluster, folder, self.manifests, poll_s, max_wait_s, on_line)

    def on_nodes(self, cluster: KubernetesTarget, nodes: Iterable[str]) -> KubernetesTarget:
        """Node affinity for ``nodes``."""
        return replace(cluster, nodelist=tuple(nodes))

    def still_queued(self, cluster: KubernetesTarget, job_id: str) -> bool:
        """A Kubernetes job is followed by the flow run that made it only: False."""
        return False

    def running(self, job: SubmittedJob) -> bool:
        return job.running

    def wait_gone(self, job: SubmittedJob, timeout_s: float) -> bool:
        return wait_gone(job, timeout_s)

    def nodes(self, job: SubmittedJob) -> list[str]:
        return job.nodes

    def failure_nodes(self, failure: JobFailed) -> list[str]:
        return [node for node in failure.nodes.split(",") if node]

    def lost_nodes(self, nodes: list[str]) -> set[str]:
        """All of them: a pod evicted for a NoExecute taint (not ready, unreachable, out of
        service) names its node alone."""
        return set(nodes)

    def jobs_of_this_flow_run(self) -> list[dict[str, str]]:
        return jobs_of_this_flow_run()
