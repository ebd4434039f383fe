"""The preflight of a run on a KubernetesCluster block (cluster.block: kubernetes-cluster/NAME),
against the loopback API server (tests/kubernetes_api_server.py) answering with recorded API
objects (tests/assets/kubernetes/SOURCES.md): the target comes from the executor's one rule
(tasks.executor.cluster_for), the API server says whether the namespace and the volume claim
every pod mounts exist, and before training on more than one node the probe runs as a one-pod
job through the Kubernetes job layer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prefect import flow

from blocks.kubernetes import runbook_cluster
from flows.pretrain import StageTimer, run_stages
from pretrain.manifest import MissingOutput
from pretrain.presets import load_spec
from tasks.preflight import PreflightFailed, preflight
from kubernetes_api_server import RecordedApiServer, Replay, recorded
from kubernetes_schemas import invalid
from tests.model_that_fits import MODEL_THAT_FITS

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/megatron-lm:0.16.1"
REPO = Path(__file__).resolve().parents[1]


def claim_path(namespace: str, claim: str) -> str:
    return f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"


def eks_spec(server: RecordedApiServer, root: Path, namespace: str, claim: str, image: str | None = IMAGE,
             overrides: tuple[str, ...] = (), preset: str = "gpt3-7.5b-eks"):
    """``preset`` (the EKS one) on a KubernetesCluster block of its own: the runbook's cluster, its
    API server the loopback one, its namespace and claim those of the recorded answers, the
    shared volume at ``root``; the model cut to checkpoints this machine's disk holds."""
    block = f"preflight-{namespace}-{claim}"
    runbook_cluster().model_copy(update={"image": image, "namespace": namespace, "volume_claim": claim,
                                         "mount_path": str(root), "api_server": server.url}).save(block, overwrite=True)
    return load_spec(preset, [*MODEL_THAT_FITS, f"cluster.block=kubernetes-cluster/{block}", f"paths.root={root}/pretrain",
                              *overrides])


def test_a_run_on_a_kubernetes_block_passes_preflight_and_goes_on_to_its_first_stage(tmp_path):
    """The claim is there (phase Bound): the preflight passes the block through, and the run goes
    on to fetch, which, left out of this run, names the stage to add."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a"}\n')
    bound = recorded("pvc-bound.yaml")
    with RecordedApiServer([], {claim_path("default", "longhorn-simple-pvc"): bound}) as server:
        spec = eks_spec(server, tmp_path, "default", "longhorn-simple-pvc",
                        overrides=(f"data.sources=[{{uri: {corpus}}}]",))
        timer = StageTimer()

        @flow
        def run():
            return run_stages(spec, ["tokenize"], timer)

        state = run(return_state=True)
    assert list(timer.seconds) == ["preflight", "fetch"]
    assert isinstance(state.result(raise_on_failure=False), MissingOutput)
    assert "add 'fetch' to the flow's stages" in state.message
    assert [r.path for r in server.requests] == [claim_path("default", "longhorn-simple-pvc")]


@pytest.mark.parametrize("namespace, answers, refused", [
    # the claim's GET is answered NotFound whether or not its namespace exists; the namespace's says which
    ("openshift-etcd", {"claim": "status-claim-not-found.json", "namespace": "status-namespace-not-found.json"},
     'namespace openshift-etcd: namespaces "openshift-etcd" not found; fix: create it (kubectl create namespace '
     'openshift-etcd), or set the KubernetesCluster block\'s namespace'),
    # a namespaced service account may not read its namespace (403): the claim's answer stands
    ("kube-system", {"claim": "status-claim-not-found.json", "namespace": "status-namespace-forbidden.json"},
     'volume claim mysql-pvc in namespace kube-system: persistentvolumeclaims "mysql-pvc" not found; fix: create '
     "the PersistentVolumeClaim mysql-pvc in namespace kube-system (the runbook's FSx claim), or set the "
     "KubernetesCluster block's volume_claim"),
])
def test_a_missing_namespace_or_claim_fails_the_preflight_naming_it_before_anything_is_queued(
        tmp_path, namespace, answers, refused):
    paths = {"claim": claim_path(namespace, "mysql-pvc"), "namespace": f"/api/v1/namespaces/{namespace}"}
    with RecordedApiServer([], {paths[k]: recorded(name) for k, name in answers.items()}) as server:
        spec = eks_spec(server, tmp_path, namespace, "mysql-pvc")

        @flow
        def check():
            return preflight(spec, ["fetch", "tokenize"])

        state = check(return_state=True)
    assert state.is_failed() and isinstance(state.result(raise_on_failure=False), PreflightFailed)
    assert f"on 2 node(s) of namespace {namespace}; nothing was queued:\n- {refused}" in state.message
    assert [r.path for r in server.requests] == [paths["claim"], paths["namespace"]]


@pytest.mark.parametrize("image, overrides, refused", [
    (None, ("backend.megatron_lm.container_image=null",),
     "no image for the pods: set the KubernetesCluster block's `image` to a registry image"),
    (IMAGE, ("backend.megatron_lm.container_image=null", "backend.megatron_lm.image={base: nvcr.io/nvidia/pytorch:"
             "24.09-py3, megatron_lm_commit: 55ac7082517c3878ae653c07c09c534b8aed49f6}"),
     "backend.megatron_lm.image: the image stage builds a squashfs for enroot/pyxis (Slurm), which a Kubernetes "
     "pod cannot run; set backend.megatron_lm.image to null and the KubernetesCluster block's `image`"),
])
def test_a_spec_without_a_registry_image_is_refused_naming_the_block_field(tmp_path, image, overrides, refused):
    with RecordedApiServer([]) as server:
        spec = eks_spec(server, tmp_path, "default", "longhorn-simple-pvc", image, overrides)

        @flow
        def check():
            return preflight(spec, ["fetch", "tokenize", "train"])

        state = check(return_state=True)
    assert state.is_failed() and refused in state.message
    assert server.requests == []  # refused before the API server was asked anything


def test_before_training_on_two_nodes_the_probe_runs_as_a_one_pod_job_in_the_pods_image(tmp_path):
    """The probe ends without a record (its PyTorchJob failed, no pod left to say why): the
    preflight fails naming the image and what it must hold."""
    bound = recorded("pvc-bound.yaml")
    failed = Replay([recorded("job-status-backoff-limit-exceeded.json")])
    with RecordedApiServer([failed], {claim_path("default", "longhorn-simple-pvc"): bound}) as server:
        spec = eks_spec(server, tmp_path, "default", "longhorn-simple-pvc")

        @flow
        def check():
            return preflight(spec, ["train"])

        state = check(return_state=True)
    assert state.is_failed() and isinstance(state.result(raise_on_failure=False), PreflightFailed)
    assert ("- container image: " in state.message
            and "BackoffLimitExceeded" in state.message
            and f"fix: check that the nodes can pull {IMAGE} and that it has this project installed" in state.message)
    (create,) = server.sent("POST")
    assert create.path == "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs" and invalid(create.body) == []
    replicas = create.body["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Master"] and replicas["Master"]["replicas"] == 1  # one pod, not the run's two
    (container,) = replicas["Master"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE and container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    script = container["command"][2]
    assert "python -m trainer preflight --backend megatron-lm --devices 8 --record" in script
    assert f"{tmp_path}/pretrain/preflight/" in script and "--megatron-path /workspace/Megatron-LM" in script


def test_a_probe_that_passes_on_its_pod_lets_the_run_through_and_is_not_repeated(tmp_path):
    """A CPU run on two nodes: the probe is a Job of one pod, whose command the test runs on this
    machine as the kubelet would in the pod (the image's python being this project's, the node
    named by NODE_NAME), while the API server shows the recorded status of a Job that completed.
    The probe's record, on the shared volume, passes the run; a second run of the same spec on
    the same block within preflight_max_age_min is not probed again."""
    ran = []

    def kubelet(body):
        (container,) = body["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        env.update(NODE_NAME="ip-10-0-1-1", PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",
                   PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HOME=str(tmp_path))
        ran.append(subprocess.run(container["command"], env=env, capture_output=True, text=True, timeout=300))

    bound = recorded("pvc-bound.yaml")
    complete = Replay([recorded("job-status-complete.yaml")])
    with RecordedApiServer([complete], {claim_path("default", "longhorn-simple-pvc"): bound}, kubelet) as server:
        spec = eks_spec(server, tmp_path, "default", "longhorn-simple-pvc", "pretrain:cpu",
                        ("cluster.nodes=2",), preset="tiny-local")

        @flow
        def check():
            return preflight(spec, ["train"]), preflight(spec, ["train"])

        first, second = check()
    (probe,) = ran
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert first["probed"] and first["node"] == "ip-10-0-1-1" and first["where"] == "namespace default"
    assert second["probed"] is False and second["why"] == "passed recently" and second["job"] == first["job"]
    (create,) = server.sent("POST")  # one probe for both runs
    assert create.path == "/apis/batch/v1/namespaces/default/jobs" and invalid(create.body) == []
    assert first["job"] == f"default/{create.body['metadata']['name']}"
