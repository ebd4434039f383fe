"""preflight: before anything is queued, whether the cluster can run the spec at all.

On every executor, a Megatron-LM run's ``model.init_from`` must be a Megatron-LM checkpoint
(render/megatron_lm.py says what one is), or every rank of the training job would fail at its load;
and a run that trains must have room for one checkpoint on the filesystem of ``paths.root``, or
none of its jobs could ever save (pretrain/checkpoint_room.py; the train task asks again, for all
the checkpoints the run keeps, once its directory is known).

On the local executor (no Slurm controller) this host is the cluster: a stage sized for a cluster
(more than one node, a conversion larger than this host's free memory) is refused at once.

On Slurm, a run that will queue jobs on more than one node (precompile, train) first asks
``sinfo`` whether the partition has that many nodes, with the GPUs the job asks for, and then
runs ``python -m trainer preflight`` as a one-node job on that partition, under the cluster's
setup lines: the tools, paths and devices the backend's launch needs on a node. A failure names
what is missing and how to fix it and is not retried; the result is a table artifact. A pass is
remembered for the block's ``preflight_max_age_min``, and a later run of the same spec on the same
block skips the probe.

On Kubernetes (a ``kubernetes-cluster/`` block, :func:`tasks.executor.cluster_for`) every run
first asks the API server whether the namespace and the volume claim every pod mounts exist; a
run on more than one node then runs the same probe as a one-pod job through the Kubernetes job
layer, in the pods' image and with a training pod's resources. There is no partition to ask how
many nodes of that shape the node group has (a pod no node can take waits Pending until its
job's time limit): the artifact says so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.logging import get_run_logger

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster
from jobs.kubernetes import KubernetesTarget, find_claim
from jobs.node import Command
from jobs.nodes import read_partition
from jobs.contract import ClusterMismatch, JobFailed, ends_cancelled, stage_request
from jobs.slurm import executor_kind, local_refusal
from pretrain import manifest
from pretrain.checkpoint_room import room_refusal
from pretrain.spec import PretrainSpec
from render import kubernetes as manifests
from render.megatron_lm import in_container, pretrained_checkpoint_refusal
from render.preflight_command import preflight_command
from tasks.artifacts import artifact_key
from tasks.executor import Cluster, cluster_for, job_folder, run_job

# The stages whose jobs span cluster.nodes (tokenize and convert run on one node each).
MULTI_NODE_STAGES = {"precompile", "train"}
PROBE_TIME_LIMIT_MIN = 10
UNCHECKED_ON_KUBERNETES = ("not checked on Kubernetes: whether the node group has that many nodes of the training "
                           "pods' shape (a pod no node can take waits Pending until its job's time limit)")


class PreflightFailed(ClusterMismatch):
    pass


def checkpoint_bytes(directory: Path) -> int:
    """The weights of a Hugging Face checkpoint directory, as the conversion reads them."""
    return sum(p.stat().st_size for p in directory.glob("*.safetensors")) if directory.is_dir() else 0


def refuse_on_this_host(spec: PretrainSpec, stages: set[str]) -> None:
    """The local executor's refusals, before anything runs (jobs.slurm.local_refusal is the rule).

    The converter streams one shard at a time, but the runbooks convert on a compute node "which
    has sufficient memory to load the model" (aws-samples/awsome-distributed-training,
    3.test_cases/pytorch/neuronx-distributed/llama3/slurm/README.md): a checkpoint larger than
    this host's free memory is not a job for the machine the Prefect worker runs on."""
    if stages & MULTI_NODE_STAGES and (refused := local_refusal(spec.name, spec.cluster.nodes)):
        raise refused
    if spec.backend.kind == "neuron" and spec.model.init_from and "convert" in stages:
        size = checkpoint_bytes(Path(spec.model.init_from).expanduser())
        if refused := local_refusal(f"{spec.name} convert of {spec.model.init_from}", 1, size):
            raise refused


def partition_rows(spec: PretrainSpec, cluster: SlurmCluster) -> list[dict]:
    """What sinfo says the partition has, against what the run's jobs ask for."""
    c = spec.cluster
    partition = read_partition(cluster.partition)
    if partition is None:
        return [{"check": "partition", "ok": False, "found": f"no partition {cluster.partition!r} in sinfo",
                 "fix": "set the cluster block's partition to one that `sinfo` lists"}]
    total, usable = len(partition.nodes), len(partition.usable)
    limit = partition.max_nodes
    ok = total >= c.nodes and (limit is None or limit >= c.nodes)
    rows = [{"check": f"partition {partition.name}: nodes", "ok": ok,
             "found": f"{total} node(s), {usable} in service" + (f"; jobs of at most {limit} nodes" if limit else ""),
             "fix": "" if ok else f"cluster.nodes={c.nodes}: lower it, or choose a partition with that many nodes"}]
    if spec.backend.cuda and not cluster.gres:
        enough = sum(gpus >= c.devices_per_node for gpus in partition.gpus.values())
        ok = enough >= c.nodes
        rows.append({"check": f"partition {partition.name}: GPUs", "ok": ok,
                     "found": f"{enough} node(s) with {c.devices_per_node} or more GPUs in their GRES",
                     "fix": "" if ok else f"cluster.devices_per_node={c.devices_per_node} on {c.nodes} node(s): use "
                     "a partition of GPU nodes, or set the block's gres to the site's GRES"})
    train = stage_request(spec, f"{spec.name}-train", Command(["true"]))
    if train.cpus_per_task:  # sbatch refuses a job whose tasks ask more CPUs than a node has
        wanted = train.cpus_per_task * train.tasks_per_node
        enough = sum(cpus >= wanted for cpus in partition.cpus.values())
        ok = enough >= c.nodes
        rows.append({"check": f"partition {partition.name}: CPUs", "ok": ok,
                     "found": f"{enough} node(s) with {wanted} or more CPUs",
                     "fix": "" if ok else f"the training's jobs ask {train.cpus_per_task} CPUs per task on "
                     f"{c.nodes} node(s): set cluster.cpus_per_task to what the nodes have, or choose a partition "
                     "of larger nodes"})
    return rows


def claim_rows(cluster: KubernetesCluster) -> list[dict]:
    """Whether the namespace and the volume claim every pod mounts exist, as the API server answers."""
    missing, said = find_claim(cluster)
    namespace, claim = cluster.namespace, cluster.volume_claim
    if missing == "namespace":
        return [{"check": f"namespace {namespace}", "ok": False, "found": said,
                 "fix": f"create it (kubectl create namespace {namespace}), or set the KubernetesCluster block's "
                 "namespace"}]
    return [{"check": f"volume claim {claim} in namespace {namespace}", "ok": not missing, "found": said,
             "fix": "" if not missing else f"create the PersistentVolumeClaim {claim} in namespace {namespace} "
             "(the runbook's FSx claim), or set the KubernetesCluster block's volume_claim"}]


def where(cluster: Cluster) -> str:
    if isinstance(cluster, KubernetesTarget):
        return f"namespace {cluster.cluster.namespace}"
    return cluster.partition or "the default partition"


def probe_image(cluster: Cluster) -> str | None:
    """The image the probe runs in: the pods' on Kubernetes, pyxis's on Slurm (None: the nodes' own)."""
    if isinstance(cluster, KubernetesTarget):
        return manifests.image(cluster.cluster, cluster.spec)
    return cluster.container_image


def probe(spec: PretrainSpec, cluster: Cluster, work: Path) -> dict:
    """The node's own checks (``rows``), from a one-node job on the partition (one pod on
    Kubernetes); its ``node`` and ``job``."""
    record = work / "probe.json"
    request = stage_request(spec, f"{spec.name}-preflight", Command(preflight_command(spec, str(record))), nodes=1,
                            time_limit_min=PROBE_TIME_LIMIT_MIN, signal_delay_s=0)
    submitted, failure = [], None
    try:
        run_job(request, cluster, job_folder(spec, cluster), poll_s=1.0, on_submit=submitted.append)
    except JobFailed as exc:  # the probe exits 1 when a check failed: its record says which
        failure = exc
    job = submitted[0].job_id if submitted else ""
    image = probe_image(cluster)
    if record.exists():
        result = json.loads(record.read_text())
        ran_in = [{"check": "container image", "ok": True, "found": f"{image} (the probe ran in it)",
                   "fix": ""}] if image else []
        return {"rows": ran_in + result["checks"], "node": result["node"], "job": job}
    # The job ended without checking anything: it never started the program, or never ran.
    if isinstance(cluster, KubernetesTarget):
        fix = (f"check that the nodes can pull {image} and that it has this project installed (every pod runs "
               "`python -m jobs.lease` and `python -m trainer`); the pod's log is in the task log")
    elif image:
        fix = "check that the image exists where the nodes can read it and that srun has pyxis (--container-image)"
    else:
        fix = ("see the job's log in the task log: the nodes must run this project's Python under the cluster "
               "block's setup lines")
    return {"rows": [{"check": "container image" if image else "probe job", "ok": False,
                      "found": str(failure).splitlines()[0] if failure else "no record", "fix": fix}],
            "node": failure.nodes if failure else "", "job": job}


def conclude(spec: PretrainSpec, cluster: Cluster, rows: list[dict], node: str) -> None:
    """Publish the checks as the preflight's table; refuse the run, naming each one that failed."""
    place = where(cluster)
    description = (f"What {spec.backend.kind} needs on {spec.cluster.nodes} node(s) of {place}"
                   + (f", probed on {node}" if node else ""))
    if isinstance(cluster, KubernetesTarget):
        description += f"; {UNCHECKED_ON_KUBERNETES}"
    create_table_artifact(rows, key=artifact_key(spec.name, "preflight"), description=description)
    missing = [r for r in rows if not r["ok"]]
    if missing:
        raise PreflightFailed(f"preflight: the cluster cannot run {spec.name} on {spec.cluster.nodes} node(s) "
                              f"of {place}" + (f" (probed on {node})" if node else "") + "; nothing was queued:\n"
                              + "\n".join(f"- {r['check']}: {r['found']}; fix: {r['fix']}" for r in missing))


@task(name="preflight")
@ends_cancelled
def preflight(spec: PretrainSpec, stages: list[str]) -> dict:
    """Refuse what this host or the cluster cannot run, before ``stages`` queue anything."""
    selected = set(stages)
    if spec.backend.kind == "megatron-lm" and spec.model.init_from and "train" in selected:
        if refused := pretrained_checkpoint_refusal(Path(spec.model.init_from).expanduser()):
            raise PreflightFailed(refused)
    if "train" in selected and (refused := room_refusal(spec, Path(spec.paths.root), kept_too=False)):
        raise PreflightFailed(f"preflight: {refused}; nothing was queued")
    logger = get_run_logger()
    cluster = cluster_for(spec)
    on_kubernetes = isinstance(cluster, KubernetesTarget)
    if not on_kubernetes and executor_kind(cluster) == "local":
        refuse_on_this_host(spec, selected)
        return {"executor": "local"}
    if spec.cluster.nodes == 1 or not selected & MULTI_NODE_STAGES:
        if on_kubernetes:  # every pod of every stage mounts the claim
            conclude(spec, cluster, claim_rows(cluster.cluster), "")
        return {"probed": False, "why": "no job on more than one node"}
    cluster = in_container(cluster, spec)  # the probe runs where training's ranks will
    settings = cluster.cluster if on_kubernetes else cluster
    argv = preflight_command(spec, "<record>")
    key = manifest.stable_hash({"block": spec.cluster.block, "cluster": settings.model_dump(mode="json"),
                                "probe": argv, "nodes": spec.cluster.nodes, "gpus": spec.backend.cuda})[:16]
    work = Path(spec.paths.root) / "preflight" / key
    passed = work / "passed.json"
    last = json.loads(passed.read_text()) if passed.exists() else None
    if last and (age_min := (time.time() - last["time"]) / 60) < settings.preflight_max_age_min:
        said = f"passed {age_min:.0f} min ago on node {last['node']} (job {last['job']}); not probed again"
        logger.info("preflight: %s", said)
        create_markdown_artifact(f"Preflight skipped: this spec {said} (the block's preflight_max_age_min is "
                                 f"{settings.preflight_max_age_min}).", key=artifact_key(spec.name, "preflight"),
                                 description="preflight skipped")
        return {"probed": False, "why": "passed recently", **last}
    work.mkdir(parents=True, exist_ok=True)
    rows = claim_rows(cluster.cluster) if on_kubernetes else partition_rows(spec, cluster)
    probed = probe(spec, cluster, work) if all(r["ok"] for r in rows) else {"rows": [], "node": "", "job": ""}
    rows, node = rows + probed["rows"], probed["node"]
    conclude(spec, cluster, rows, node)
    last = {"time": time.time(), "node": node, "job": probed["job"], "where": where(cluster)}
    passed.write_text(json.dumps(last))
    return {"probed": True, **last}
