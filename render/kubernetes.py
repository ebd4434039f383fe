"""Kubernetes manifests of the stages, pure functions of the spec and the KubernetesCluster block:
a one-node stage is a batch/v1 Job, tokenize's shards one Indexed Job, training (and a
multi-node precompile) a Kubeflow PyTorchJob: the EKS runbook's getdata/prepdata Jobs and its
PyTorchJob, rendered from the same spec as the Slurm scripts.

Every pod mounts the shared volume where the spec's outputs live and runs the stage's command
line through bash, which sets the names the command lines use for the distributed environment
($NNODES, $NODE_RANK, $MASTER_ADDR, $MASTER_PORT) from what the Job or the training operator
gives the pod, as the Slurm job layer does from Slurm's.
"""

from __future__ import annotations

import copy
import re
import uuid
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from jobs.node import Command
from render.megatron_lm import MASTER_PORT
from render.shell import shell_line

if TYPE_CHECKING:  # a Prefect block; rendering only reads it
    from blocks.kubernetes import KubernetesCluster
    from jobs.contract import JobRequest
    from jobs.kubernetes import KubernetesTarget
    from pretrain.spec import PretrainSpec

JOB_API, PYTORCHJOB_API = "batch/v1", "kubeflow.org/v1"
CONTAINER = "pytorch"  # the training operator finds the training container by this name
# The operator reads the rendezvous port from the container port of this name (default 23456);
# naming it keeps the port the rendered torchrun lines use.
PORT_NAME = "pytorchjob-port"
# Pods of a PyTorchJob carry their replica's index in this label (training-operator v1.9
# pkg/controller.v1/common/pod.go); an elastic job has no master to number the nodes.
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
# Job names become pod label values (job-name), at most 63 characters, and the job layer adds a
# unique suffix; an Indexed Job's pods add their index to the name.
MAX_NAME = 52

# The node a pod runs on, as the scheduler names it (what node affinity takes), from the
# downward API: the node programs record it as their node, as they record SLURMD_NODENAME on Slurm.
NODE_NAME_ENV = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
ONE_NODE = {"NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(MASTER_PORT)}


def object_name(text: str) -> str:
    """``text`` as a Kubernetes object name (RFC 1123 label: lowercase letters, digits, '-')."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:MAX_NAME].strip("-")
    if not name:
        raise ValueError(f"{text!r} has no letter or digit to name a Kubernetes object with")
    return name


def image(cluster: KubernetesCluster, spec: PretrainSpec) -> str:
    """The pods' image: one the kubelet pulls from a registry. The image stage's output is a
    squashfs for enroot/pyxis on Slurm, which no pod can run."""
    settings = spec.backend.megatron_lm
    if settings and settings.image:
        raise ValueError("backend.megatron_lm.image: the image stage builds a squashfs for enroot/pyxis (Slurm), "
                         "which a Kubernetes pod cannot run; set backend.megatron_lm.image to null and the "
                         "KubernetesCluster block's `image` to a registry image (ECR, say) with Megatron-LM and "
                         "this project installed")
    found = cluster.image or (settings.container_image if settings else None)
    if not found:
        raise ValueError("no image for the pods: set the KubernetesCluster block's `image` to a registry image "
                         "(ECR, say) with this project installed (or backend.megatron_lm.container_image)")
    return found


def check_paths(cluster: KubernetesCluster, spec: PretrainSpec) -> None:
    """Every stage reads what an earlier one wrote: the outputs must be on the shared volume."""
    if not PurePosixPath(spec.paths.root).is_relative_to(cluster.mount_path):
        raise ValueError(f"paths.root={spec.paths.root} is not under the KubernetesCluster block's mount_path "
                         f"{cluster.mount_path}: the pods could not see each other's outputs; set paths.root "
                         f"to a directory under {cluster.mount_path}")


def _cuda(spec: PretrainSpec) -> bool:
    backend = spec.backend
    return backend.kind == "megatron-lm" or (backend.kind == "native" and backend.native.device == "cuda")


def training_resources(cluster: KubernetesCluster, spec: PretrainSpec) -> dict[str, str]:
    """What one training node asks for. Quantities are strings, as the Kubernetes schema types
    them; extended resources (GPUs, EFA) and hugepages must be requested as much as limited, so
    one map serves as both."""
    gpus = cluster.gpus_per_node if cluster.gpus_per_node is not None else (
        spec.cluster.devices_per_node if _cuda(spec) else 0)
    wanted = {"nvidia.com/gpu": gpus or None, "vpc.amazonaws.com/efa": cluster.efa_per_node or None,
              "hugepages-2Mi": cluster.hugepages_2mi, "memory": cluster.memory, "cpu": cluster.cpu}
    return {name: str(value) for name, value in wanted.items() if value is not None}


def data_resources(cpus: int | None, mem_gb: float | None) -> dict[str, str]:
    wanted = {"cpu": str(cpus) if cpus else None, "memory": f"{int(mem_gb * 1024)}Mi" if mem_gb else None}
    return {name: value for name, value in wanted.items() if value is not None}


def _script(command: Command, exports: str) -> list[str]:
    """The command line, run by bash after ``exports`` so its $NAMEs expand on the node."""
    line = shell_line(command.argv)
    return ["bash", "-c", f"{exports}exec {line}" if exports else f"exec {line}"]


def _container(cluster: KubernetesCluster, spec: PretrainSpec, command: list[str], env: dict[str, str],
               resources: dict[str, str], cwd: str | None, extra_mounts: list[dict[str, Any]],
               extra_env: list[dict[str, Any]] = (), ports: list[dict[str, Any]] = ()) -> dict[str, Any]:
    # The block's variables (the site's over the network settings), then the stage's own over both
    # (its command's, the distributed environment, the downward API's): as on Slurm, where the
    # command's environment is set over what the block's env exported. One entry per name, so the
    # value a pod gets does not hang on how the API server and kubelet treat a name given twice.
    own = {entry["name"] for entry in extra_env}
    values = {**cluster.network_env, **cluster.env, **env}
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image(cluster, spec), "imagePullPolicy": cluster.image_pull_policy,
        "command": command,
        "env": [{"name": k, "value": v} for k, v in values.items() if k not in own] + list(extra_env),
        "volumeMounts": [{"name": "shared", "mountPath": cluster.mount_path}, *extra_mounts]}
    if resources:
        container["resources"] = {"requests": dict(resources), "limits": dict(resources)}
    if cwd:
        container["workingDir"] = cwd
    if ports:
        container["ports"] = list(ports)
    return container


def _pod_spec(cluster: KubernetesCluster, container: dict[str, Any], restart: str, training: bool,
              nodes: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": "shared", "persistentVolumeClaim": {"claimName": cluster.volume_claim}}]
    if training and cluster.shm_size:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": cluster.shm_size}})
    pod: dict[str, Any] = {"restartPolicy": restart, "containers": [container], "volumes": volumes}
    if cluster.service_account:
        pod["serviceAccountName"] = cluster.service_account
    if cluster.node_selector:
        pod["nodeSelector"] = dict(cluster.node_selector)
    if cluster.tolerations:
        pod["tolerations"] = [t.model_dump(exclude_none=True) for t in cluster.tolerations]
    if cluster.priority_class:
        pod["priorityClassName"] = cluster.priority_class
    # the nodes to run on and those to leave out (after a node failure), as Slurm's --nodelist
    # and --exclude; one term, so a node must pass both
    wanted = [{"key": "kubernetes.io/hostname", "operator": operator, "values": list(names)}
              for operator, names in (("In", nodes), ("NotIn", exclude)) if names]
    if wanted:
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": wanted}]}}}
    return pod


def _metadata(cluster: KubernetesCluster, spec: PretrainSpec, name: str, stage: str) -> dict[str, Any]:
    return {"name": object_name(name), "namespace": cluster.namespace, "labels": stage_labels(spec, stage)}


def stage_labels(spec: PretrainSpec, stage: str) -> dict[str, str]:
    """Labels of every object and pod of a stage: `kubectl get pods -l pretrain/run=NAME` lists a run's."""
    return {"app.kubernetes.io/part-of": "pretrain-pipeline", "pretrain/run": object_name(spec.name),
            "pretrain/stage": object_name(stage)}


def _job(cluster: KubernetesCluster, spec: PretrainSpec, name: str, stage: str, time_limit_min: int,
         pod: dict[str, Any], **job_spec: Any) -> dict[str, Any]:
    # backoffLimit 0: a failed pod fails the Job, and the Prefect task's retries decide, as on
    # Slurm; activeDeadlineSeconds is the time limit.
    body: dict[str, Any] = {"backoffLimit": 0, "activeDeadlineSeconds": time_limit_min * 60, **job_spec,
                            "template": {"metadata": {"labels": stage_labels(spec, stage)}, "spec": pod}}
    if cluster.ttl_seconds_after_finished is not None:
        body["ttlSecondsAfterFinished"] = cluster.ttl_seconds_after_finished
    return {"apiVersion": JOB_API, "kind": "Job", "metadata": _metadata(cluster, spec, name, stage), "spec": body}


def batch_job(cluster: KubernetesCluster, spec: PretrainSpec, name: str, stage: str, command: Command,
              time_limit_min: int, cpus: int | None = None, mem_gb: float | None = None,
              nodes: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """A one-node stage (fetch's getdata, convert, tokenize's merge, a one-node precompile or
    training without GPUs); ``nodes``, ``exclude``: as for :func:`pytorch_job`."""
    container = _container(cluster, spec, _script(command, ""), {**ONE_NODE, **command.env},
                           data_resources(cpus, mem_gb), command.cwd, [], NODE_NAME_ENV)
    return _job(cluster, spec, name, stage, time_limit_min,
                _pod_spec(cluster, container, "Never", False, nodes, exclude))


def indexed_job(cluster: KubernetesCluster, spec: PretrainSpec, name: str, stage: str, commands: list[Command],
                time_limit_min: int, cpus: int | None = None, mem_gb: float | None = None) -> dict[str, Any]:
    """Same-shaped commands (tokenize's shards) as one Indexed Job, the Slurm array's equivalent:
    pod ``i`` runs ``commands[i]``, chosen by the index the Job controller gives it
    ($JOB_COMPLETION_INDEX). Each index fails alone (backoffLimitPerIndex 0), so the others
    finish and a retry reruns only the failed shards."""
    if len({tuple(sorted(c.env.items())) for c in commands}) > 1 or len({c.cwd for c in commands}) > 1:
        raise ValueError(f"{name}: the commands of one Indexed Job share their environment and directory")
    cases = " ".join(f"{i}) exec {shell_line(c.argv)};;" for i, c in enumerate(commands))
    script = ["bash", "-c", f'case "$JOB_COMPLETION_INDEX" in {cases} esac; '
                            'echo "no command for index $JOB_COMPLETION_INDEX" >&2; exit 2']
    container = _container(cluster, spec, script, {**ONE_NODE, **commands[0].env}, data_resources(cpus, mem_gb),
                           commands[0].cwd, [])
    return _job(cluster, spec, name, stage, time_limit_min, _pod_spec(cluster, container, "Never", False),
                completionMode="Indexed", completions=len(commands), parallelism=len(commands),
                backoffLimitPerIndex=0, backoffLimit=len(commands))


def pytorch_job(cluster: KubernetesCluster, spec: PretrainSpec, name: str, stage: str, command: Command,
                time_limit_min: int, nodes: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
                pods: int | None = None) -> dict[str, Any]:
    """Training on ``pods`` pods (default ``cluster.nodes``), ``devices_per_node`` processes
    each, as the EKS runbook's PyTorchJob: a Master (node 0) and Workers, the operator giving each
    pod its node rank (PET_NODE_RANK) and the master's address. Where the spec lets the run go on
    with fewer nodes (``cluster.min_nodes``), Workers only, each numbered by its replica index,
    under an elasticPolicy: c10d rendezvous between ``cluster.min_nodes`` and ``pods`` pods, the
    pods restarted in place (restartPolicy OnFailure) up to the backend's failure budget
    (``max_attempts_without_checkpoint``; the operator counts every restart, advancing or not),
    so that after losing a node torchrun rendezvouses again on the nodes left and training
    resumes from its newest checkpoint there. ``nodes``: the Kubernetes nodes to run on
    (training after a precompile that filled per-node caches there); ``exclude``: the nodes to
    leave out (after a node failure)."""
    c = spec.cluster
    pods = pods or c.nodes
    elastic = c.fewest_nodes < pods
    if elastic:
        exports = 'export NNODES="$PET_NNODES" NODE_RANK="$REPLICA_INDEX" MASTER_ADDR="${PET_RDZV_ENDPOINT%:*}"; '
        downward = [*NODE_NAME_ENV, {"name": "REPLICA_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{REPLICA_INDEX_LABEL}']"}}}]
    else:
        exports, downward = 'export NNODES="$PET_NNODES" NODE_RANK="$PET_NODE_RANK"; ', NODE_NAME_ENV
    shm = [{"name": "shm", "mountPath": "/dev/shm"}] if cluster.shm_size else []
    # MASTER_ADDR and MASTER_PORT come from the operator (the port from the named container port)
    container = _container(cluster, spec, _script(command, exports), dict(command.env),
                           training_resources(cluster, spec), command.cwd, shm, downward,
                           [{"name": PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"}])
    restart = "OnFailure" if elastic else "Never"

    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": restart,
                "template": {"metadata": {"labels": stage_labels(spec, stage)},
                             "spec": _pod_spec(cluster, copy.deepcopy(container), restart, True, nodes, exclude)}}

    if elastic:
        replicas = {"Worker": replica(pods)}
    else:
        replicas = {"Master": replica(1), **({"Worker": replica(pods - 1)} if pods > 1 else {})}
    # Only the native backend resumes on fewer nodes (the spec refuses cluster.min_nodes for others).
    restarts = spec.backend.native.max_attempts_without_checkpoint if elastic else 0
    # Running: when the job ends (a failed master fails it), the operator deletes the pods still
    # running, so no worker trains on beside a resubmission; the ended pods keep their logs.
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": restarts,
                                  "activeDeadlineSeconds": time_limit_min * 60}
    if cluster.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = cluster.ttl_seconds_after_finished
    body: dict[str, Any] = {"nprocPerNode": str(c.devices_per_node), "pytorchReplicaSpecs": replicas,
                            "runPolicy": run_policy}
    if elastic:
        body["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": c.fewest_nodes, "maxReplicas": pods,
                                 "maxRestarts": restarts}
    return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob", "metadata": _metadata(cluster, spec, name, stage),
            "spec": body}


def job_name(request_name: str) -> str:
    """A name of its own for each submission, from the request's."""
    return f"{object_name(request_name)[:MAX_NAME - 7]}-{uuid.uuid4().hex[:6]}"


def leased(commands: list[Command], lease: str, timeout_s: int) -> list[Command]:
    """``commands`` run under the lease (jobs/lease.py), in the image's python."""
    return [replace(c, argv=["python", "-m", "jobs.lease", lease, str(timeout_s), "--", *c.argv]) for c in commands]


def manifest_for(request: JobRequest, target: KubernetesTarget, commands: list[Command], stage: str,
                 name: str) -> dict[str, Any]:
    """The object of ``request``: a PyTorchJob for a job on several nodes or with GPUs (training,
    precompile), an Indexed Job for several commands (an array), else a Job; on the target's
    nodes, if it names some, and never on those the request excludes."""
    cluster, spec, nodes, exclude = target.cluster, target.spec, target.nodelist, request.exclude
    if request.tasks_per_node != 1:
        raise ValueError(f"{request.name}: a Kubernetes pod runs one command; tasks_per_node="
                         f"{request.tasks_per_node} is for Slurm")
    if len(commands) > 1:
        return indexed_job(cluster, spec, name, stage, commands, request.time_limit_min, request.cpus_per_task,
                           request.mem_gb)
    if request.nodes > 1 or request.gpus_per_node:
        return pytorch_job(cluster, spec, name, stage, commands[0], request.time_limit_min, nodes, exclude,
                           request.nodes)
    return batch_job(cluster, spec, name, stage, commands[0], request.time_limit_min, request.cpus_per_task,
                     request.mem_gb, nodes, exclude)
