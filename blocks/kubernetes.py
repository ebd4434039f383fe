"""The Kubernetes cluster a pipeline runs on (EKS, say): the site's settings, saved once as a
Prefect block, beside :class:`blocks.cluster.SlurmCluster`.

As with Slurm, the spec says what a workload needs (nodes, devices per node, time) and this
block says how the site grants it: the namespace, the shared volume every stage reads and
writes, the image, the node pool and what one node offers the pods on it.
"""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import BaseModel, ConfigDict, Field, field_validator

from blocks.cluster import node_mtbf_h_field, variable_names

# The network settings of the EKS runbook's PyTorchJob (aws-samples/awsome-distributed-training,
# 3.test_cases/megatron/megatron-lm/kubernetes/gpt3/manifests/pytorchjob.yaml-template, its
# container's env): libfabric's EFA provider (the template's ${FI_PROVIDER}; efa is the provider of
# the nodes' EFA interfaces) with GPUDirect RDMA and fork safety, NCCL's sockets on any interface
# but loopback, NCCL errors that end the process instead of hanging it, and NCCL's INFO log, which
# says which transport each communicator chose. The template's debugging and tracing settings
# (TORCH_DISTRIBUTED_DEBUG, the NCCL trace dumps to its hostPath /local) are left out.
RUNBOOK_NETWORK_ENV = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "NCCL_SOCKET_IFNAME": "^lo",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_DEBUG": "INFO",
}


class Toleration(BaseModel):
    """A pod toleration, as Kubernetes spells it (the GPU node groups of EKS are often tainted)."""

    model_config = ConfigDict(extra="forbid")

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class KubernetesCluster(Block):
    _block_type_name = "Kubernetes Cluster"
    _block_type_slug = "kubernetes-cluster"
    _description = "Where and how pretrain-pipeline runs its stages as Kubernetes Jobs and PyTorchJobs."

    namespace: str = Field("default", description="Namespace of every Job and PyTorchJob.")
    volume_claim: str = Field(
        description="PersistentVolumeClaim of the shared filesystem (the runbook's FSx claim, fsx-claim); "
        "every stage reads and writes its outputs there.")
    mount_path: str = Field(
        "/fsx", description="Where the claim is mounted in every pod; the spec's paths.root must lie under it.")
    image: str | None = Field(
        None, description="Registry image of every pod (ECR, say), with this project installed: the kubelet "
        "pulls it. The image stage's output is a squashfs for enroot/pyxis on Slurm, which no pod can run; a spec "
        "on this block sets backend.megatron_lm.image to null. None: backend.megatron_lm.container_image.")
    service_account: str | None = Field(None, description="serviceAccountName of the pods.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels, e.g. {'node.kubernetes.io/instance-type': 'p5.48xlarge'}.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints of the node group to tolerate.")
    gpus_per_node: int | None = Field(
        None, ge=0, description="nvidia.com/gpu per training pod; None: the spec's cluster.devices_per_node "
        "for a GPU backend, none otherwise.")
    efa_per_node: int = Field(
        0, ge=0, description="vpc.amazonaws.com/efa per training pod (32 on p5.48xlarge, 16 on p5en).")
    hugepages_2mi: str | None = Field(None, description="hugepages-2Mi per training pod, e.g. '5120Mi' (EFA).")
    memory: str | None = Field(None, description="Memory per training pod, e.g. '1800Gi'.")
    cpu: str | None = Field(None, description="CPU per training pod, e.g. '180'.")
    shm_size: str | None = Field(
        "64Gi", description="A memory-backed /dev/shm of this size for the training pods (NCCL and the "
        "data loader workers need more than the container runtime's 64 MB); None: the runtime's.")
    ttl_seconds_after_finished: int | None = Field(
        3600, ge=0, description="Kubernetes deletes a finished Job or PyTorchJob (and its pods) this long after "
        "it ended; the logs were already streamed into the Prefect task's log.")
    kubeconfig_context: str | None = Field(
        None, description="Context of ~/.kube/config to use; None: the in-cluster service account when "
        "the flow runs in a pod (a Kubernetes work pool), else the current context.")
    api_server: str | None = Field(
        None, description="URL of an API server this process reaches without credentials of its own, "
        "e.g. `kubectl proxy`'s http://127.0.0.1:8001; None: the in-cluster service account or the kubeconfig.")
    lease_timeout_s: int = Field(
        300, ge=0,
        description="A job whose flow process has stopped following it for this long (its pod was killed, "
        "its node lost) stops itself: every pod runs its command under a lease file on the shared volume "
        "that the flow process renews, so the flow's pod must mount the claim at mount_path too (the work "
        "pool's template, deployments/kubernetes-work-pool.json, does); 0 never.")
    preflight_max_age_min: int = Field(
        360, ge=0, description="A run that trains on more than one node first runs a one-pod probe of what its "
        "backend needs; it skips the probe when the same block and spec passed it this recently (minutes). "
        "0 probes before every such run.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    priority_class: str | None = Field(None, description="priorityClassName of the pods.")
    network_env: dict[str, str] = Field(
        default_factory=lambda: dict(RUNBOOK_NETWORK_ENV),
        description="Network variables of every pod: by default the EKS runbook's PyTorchJob's (EFA through "
        "libfabric, NCCL's interfaces, error handling and log; blocks/kubernetes.py RUNBOOK_NETWORK_ENV cites the "
        "template); {} for a cluster without EFA.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="The site's own variables, in every pod (e.g. {'PRETRAIN_PEAK_TFLOPS': '989'}); one that "
        "network_env names too takes this value. A stage's own variables (its command's, NNODES, NODE_RANK, "
        "MASTER_ADDR, MASTER_PORT, NODE_NAME) take theirs over both.")

    node_mtbf_h: float | None = node_mtbf_h_field()

    @field_validator("network_env", "env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return variable_names(env)


def runbook_cluster() -> KubernetesCluster:
    """The cluster of the EKS Megatron-LM runbook (aws-samples/awsome-distributed-training,
    3.test_cases/megatron/megatron-lm/kubernetes/gpt3): the FSx claim fsx-claim mounted at /fsx,
    p5.48xlarge nodes with 8 GPUs and 32 EFA interfaces each, /dev/shm for NCCL. Save it with
    your image as the block the EKS preset names; `pretrain render` uses it when no block is at hand."""
    return KubernetesCluster(volume_claim="fsx-claim", mount_path="/fsx",
                             node_selector={"node.kubernetes.io/instance-type": "p5.48xlarge"},
                             gpus_per_node=8, efa_per_node=32)
