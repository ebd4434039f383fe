"""Which job layer runs a stage's jobs, chosen by the cluster block the spec names: a
SlurmCluster (or none) submits to Slurm or the local executor, a KubernetesCluster to
Kubernetes. The tasks call these; nothing else in them knows which."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster
from jobs import kubernetes, slurm
from jobs.kubernetes import KubernetesTarget
from jobs.slurm import JobRequest, MissingClusterBlock, SlurmJobFailed

# Prefect's own way of naming a block document of a given type, `Block.load("slug/name")`.
KUBERNETES_PREFIX = "kubernetes-cluster/"


def load_kubernetes_block(name: str) -> KubernetesCluster:
    try:
        return KubernetesCluster.load(name)
    except ValueError as exc:  # Prefect's "Unable to find block document named ..."
        raise MissingClusterBlock(
            f"cluster.block={KUBERNETES_PREFIX}{name}: no KubernetesCluster block of that name on this Prefect "
            f"server ({exc}); create it with KubernetesCluster(...).save({name!r})") from None


def cluster_for(spec: Any) -> SlurmCluster | KubernetesTarget:
    """The spec's cluster: ``cluster.block: kubernetes-cluster/NAME`` runs the stages on Kubernetes,
    any other name (or none) on Slurm, as before."""
    block = spec.cluster.block or ""
    if not block.startswith(KUBERNETES_PREFIX):
        return slurm.cluster_for(spec)
    if spec.cluster.executor != "auto":
        raise ValueError(f"cluster.executor={spec.cluster.executor} is a Slurm setting; cluster.block={block} "
                         "runs on Kubernetes: leave cluster.executor at auto")
    target = KubernetesTarget(load_kubernetes_block(block.removeprefix(KUBERNETES_PREFIX)), spec)
    kubernetes.manifests.check_paths(target.cluster, spec)
    return target


def job_folder(spec: Any, cluster: SlurmCluster | KubernetesTarget) -> Path:
    """Where a Slurm job's scripts and logs go; a Kubernetes job keeps its own (``kubectl logs``)."""
    if isinstance(cluster, KubernetesTarget):
        return Path(spec.paths.root) / "jobs"
    return slurm.job_folder(spec, cluster)


def run_job(request: JobRequest, cluster: SlurmCluster | KubernetesTarget, folder: Path, poll_s: float = 2.0,
            max_wait_s: float | None = None, on_poll: Callable[[], None] | None = None) -> list[Any]:
    if isinstance(cluster, KubernetesTarget):
        return kubernetes.run_job(request, cluster, poll_s, max_wait_s, on_poll)
    return slurm.run_job(request, cluster, folder, poll_s, max_wait_s, on_poll=on_poll)


def run_array(requests: list[JobRequest], cluster: SlurmCluster | KubernetesTarget, folder: Path,
              poll_s: float = 2.0, max_wait_s: float | None = None) -> list[list[Any] | SlurmJobFailed]:
    if isinstance(cluster, KubernetesTarget):
        return kubernetes.run_array(requests, cluster, poll_s, max_wait_s)
    return slurm.run_array(requests, cluster, folder, poll_s, max_wait_s)
