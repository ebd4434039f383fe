"""Which job layer runs a stage's jobs, chosen by the cluster block the spec names: a
SlurmCluster (or none) submits to Slurm or the local executor, a KubernetesCluster to
Kubernetes. The tasks call these, with the cluster and the job handles these return; nothing
else in them knows which: :func:`backend` picks the kind's :class:`jobs.contract.Backend`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Hashable, Iterable

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster
from jobs import slurm
from jobs.contract import Backend, JobFailed, JobHandle, JobRequest, load_block
from jobs.kubernetes import KubernetesBackend, KubernetesTarget, SubmittedJob
from jobs.nodes import read_partition
from jobs.slurm import SlurmBackend
from render import kubernetes as manifests

Cluster = SlurmCluster | KubernetesTarget
# Outcomes after which the nodes, not the program, are suspect: Slurm's, which the Kubernetes
# layer also gives a pod evicted from a node tainted out of service.
NODE_STATES = {"NODE_FAIL", "BOOT_FAIL"}

# Prefect's own way of naming a block document of a given type, `Block.load("slug/name")`.
KUBERNETES_PREFIX = "kubernetes-cluster/"

SLURM: Backend = SlurmBackend()
KUBERNETES: Backend = KubernetesBackend(manifests)


def backend(of: Cluster | JobHandle) -> Backend:
    """The job layer of a cluster, or of a job it submitted: the one place that tells the kinds apart."""
    return KUBERNETES if isinstance(of, (KubernetesTarget, SubmittedJob)) else SLURM


def load_kubernetes_block(name: str) -> KubernetesCluster:
    return load_block(KubernetesCluster, name, f"{KUBERNETES_PREFIX}{name}",
                      f"with KubernetesCluster(...).save({name!r})")


def cluster_for(spec: Any) -> Cluster:
    """The spec's cluster: ``cluster.block: kubernetes-cluster/NAME`` runs the stages on Kubernetes,
    any other name (or none) on Slurm, as before."""
    block = spec.cluster.block or ""
    if not block.startswith(KUBERNETES_PREFIX):
        return slurm.cluster_for(spec)
    if spec.cluster.executor != "auto":
        raise ValueError(f"cluster.executor={spec.cluster.executor} is a Slurm setting; cluster.block={block} "
                         "runs on Kubernetes: leave cluster.executor at auto")
    target = KubernetesTarget(load_kubernetes_block(block.removeprefix(KUBERNETES_PREFIX)), spec)
    manifests.check_paths(target.cluster, spec)
    manifests.image(target.cluster, spec)  # refused here, before the preflight queues anything
    return target


def jobs_of_this_flow_run() -> list[dict[str, str]]:
    """Every job this flow run submitted, on whichever kind of cluster
    (:meth:`jobs.contract.Backend.jobs_of_this_flow_run`)."""
    return [job for layer in (SLURM, KUBERNETES) for job in layer.jobs_of_this_flow_run()]


def job_folder(spec: Any, cluster: Cluster) -> Path:
    """Where a Slurm job's scripts and logs go; a Kubernetes job's lease (its logs are the pods':
    ``kubectl logs``)."""
    return backend(cluster).job_folder(spec, cluster)


def run_job(request: JobRequest, cluster: Cluster, folder: Path, poll_s: float = 2.0,
            max_wait_s: float | None = None, on_poll: Callable[[], None] | None = None,
            on_submit: Callable[[JobHandle], None] | None = None) -> list[Any]:
    return backend(cluster).run_job(request, cluster, folder, poll_s, max_wait_s, on_poll, on_submit)


def run_array(requests: list[JobRequest], cluster: Cluster, folder: Path, poll_s: float = 2.0,
              max_wait_s: float | None = None,
              on_line: Callable[[Hashable, str], None] | None = None) -> list[list[Any] | JobFailed]:
    """``on_line`` sees each streamed log line with its source: the job's index in ``requests``
    on Slurm, the pod's name on Kubernetes (an Indexed Job's pods are its tasks)."""
    return backend(cluster).run_array(requests, cluster, folder, poll_s, max_wait_s, on_line)


def on_nodes(cluster: Cluster, nodes: Iterable[str]) -> Cluster:
    """``cluster`` running its jobs only on ``nodes``, as the scheduler names them (Slurm's
    --nodelist; node affinity on Kubernetes): training on the nodes precompile warmed."""
    return backend(cluster).on_nodes(cluster, nodes)


def shrinks_by_resubmission(cluster: Cluster) -> bool:
    """Whether a run allowed fewer nodes (``cluster.min_nodes``) goes on with fewer by being
    resubmitted on the nodes left (Slurm), not inside its job (a PyTorchJob's elasticPolicy)."""
    return backend(cluster).shrinks_by_resubmission


def usable_nodes(cluster: SlurmCluster) -> set[str]:
    """The nodes of the cluster's partition that Slurm holds in service (not down, drained, failing
    or not responding), less those the block excludes: what a resubmission may still run on."""
    partition = read_partition(cluster.partition)
    return set(partition.usable) - set(cluster.exclude) if partition else set()


def job_running(job: JobHandle) -> bool:
    """Whether the job runs now: not waiting in the queue, first or again after a requeue."""
    return backend(job).running(job)


def node_mtbf_h(cluster: Cluster) -> float | None:
    """The site's per-node MTBF its cluster block gives, if any."""
    return cluster.node_mtbf_h


def still_queued(cluster: Cluster, job_id: str) -> bool:
    """Whether Slurm still lists a job known by its id alone (one an earlier flow run submitted).
    Local-executor and Kubernetes jobs are followed by the flow run that made them only: False."""
    return backend(cluster).still_queued(cluster, job_id)


def wait_gone(job: JobHandle, timeout_s: float) -> bool:
    """Until the job's processes have exited; False if they outlast ``timeout_s``."""
    return backend(job).wait_gone(job, timeout_s)


def job_nodes(job: JobHandle) -> list[str]:
    """The nodes the job ran on, as the scheduler names them; none for a local-executor job."""
    return backend(job).nodes(job)


def failure_nodes(failure: JobFailed, cluster: Cluster) -> list[str]:
    """The nodes a failure names, one by one (Slurm compresses them: ``node-[1-4]``)."""
    return backend(cluster).failure_nodes(failure)


def excluded_after(failure: JobFailed, cluster: Cluster, faulty: dict[str, str] | None = None) -> set[str]:
    """Nodes to leave out of the next submission: after any failure, the nodes whose devices
    reported errors (``faulty``, from the device sampler); after a node failure, those of the job's
    nodes that its backend holds lost (on Slurm, those Slurm now holds unhealthy; on Kubernetes,
    those whose pods were evicted for a NoExecute taint)."""
    bad = set(faulty or {})
    if failure.state not in NODE_STATES:
        return bad
    return bad | backend(cluster).lost_nodes(failure_nodes(failure, cluster))
