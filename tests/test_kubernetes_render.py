"""The Kubernetes objects of a run, rendered from the spec and the KubernetesCluster block, are
valid against the real schemas: batch/v1 Job and Pod of Kubernetes v1.37.0, the PyTorchJob CRD
of Kubeflow training-operator v1.9.0 (tests/assets/kubernetes/SOURCES.md)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from cli.main import main
from blocks.kubernetes import RUNBOOK_NETWORK_ENV, KubernetesCluster, Toleration, runbook_cluster
from jobs.node import Command
from pretrain.presets import load_spec
from render import kubernetes
from flows.dry_run import render_files
from kubernetes_schemas import invalid

pytestmark = pytest.mark.pure

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/megatron-lm:0.16.1"


def eks() -> KubernetesCluster:
    return runbook_cluster().model_copy(update={
        "image": IMAGE, "namespace": "training", "service_account": "pretrain", "hugepages_2mi": "5120Mi",
        "memory": "1800Gi", "cpu": "180", "priority_class": "training",
        "tolerations": [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]})


def test_every_object_of_the_eks_preset_validates_and_carries_the_runbooks_shape():
    spec = load_spec("gpt3-7.5b-eks")
    files = render_files(spec, eks())
    assert {"k8s_tokenize.yaml", "k8s_train.yaml"} <= set(files) and not any(k.startswith("sbatch_") for k in files)
    bodies = {name: yaml.safe_load(text) for name, text in files.items() if name.startswith("k8s_")}
    for name, body in bodies.items():
        assert invalid(body) == [], name
    train = bodies["k8s_train.yaml"]["spec"]
    assert train["nprocPerNode"] == "8" and set(train["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    assert train["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1  # 2 nodes: the master and one worker
    pod = train["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32",
                                                "hugepages-2Mi": "5120Mi", "memory": "1800Gi", "cpu": "180"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
    assert {"name": "shared", "mountPath": "/fsx"} in container["volumeMounts"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    # The same torchrun line as on Slurm, its node rank and size from the training operator.
    script = container["command"][2]
    assert script.startswith('export NNODES="$PET_NNODES" NODE_RANK="$PET_NODE_RANK"; exec bash -c')
    assert "--nproc_per_node 8" in script and "--master_port 29500" in script
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"}]
    assert "elasticPolicy" not in train and train["runPolicy"]["backoffLimit"] == 0
    tokenize = bodies["k8s_tokenize.yaml"]["spec"]
    assert tokenize["completionMode"] == "Indexed" and tokenize["backoffLimitPerIndex"] == 0


def test_a_run_that_may_go_on_with_fewer_nodes_gets_its_elastic_policy_from_min_nodes():
    """cluster.min_nodes asks for it, as it does on Slurm: Workers only, between min_nodes and
    nodes pods, their pods restarted up to the backend's failure budget; pinned to precompile's nodes."""
    shrinking = ["cluster.block=kubernetes-cluster/eks", "paths.root=/fsx/pretrain", "cluster.nodes=2",
                 "backend.native.max_attempts_without_checkpoint=3"]
    spec = load_spec("tiny-local", [*shrinking, "cluster.min_nodes=1"])
    body = kubernetes.pytorch_job(eks(), spec, "tiny-train", "train", Command(["torchrun", "--nnodes", "$NNODES"]),
                                  60, nodes=("ip-10-0-1-1", "ip-10-0-1-2"))
    assert invalid(body) == []
    assert body["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 2,
                                             "maxRestarts": 3}
    assert body["spec"]["runPolicy"]["backoffLimit"] == 3
    replicas = body["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Worker"] and replicas["Worker"]["replicas"] == 2
    assert replicas["Worker"]["restartPolicy"] == "OnFailure"
    pod = replicas["Worker"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == ["ip-10-0-1-1", "ip-10-0-1-2"]
    # without cluster.min_nodes: a Master and a Worker, none restarted in place
    fixed = kubernetes.pytorch_job(eks(), load_spec("tiny-local", shrinking), "tiny-train", "train",
                                   Command(["torchrun"]), 60)["spec"]
    assert "elasticPolicy" not in fixed and fixed["runPolicy"]["backoffLimit"] == 0
    assert {name: r["replicas"] for name, r in fixed["pytorchReplicaSpecs"].items()} == {"Master": 1, "Worker": 1}


def test_neuron_preset_renders_convert_precompile_and_train_that_validate():
    spec = load_spec("llama3-70b-trn2", ["model.init_from=/fsx/Meta-Llama-3-70B", "paths.root=/fsx/pretrain"])
    files = render_files(spec, eks())
    assert {"k8s_convert.yaml", "k8s_precompile.yaml", "k8s_train.yaml"} <= set(files)
    for name in ("k8s_tokenize.yaml", "k8s_convert.yaml", "k8s_precompile.yaml", "k8s_train.yaml"):
        assert invalid(yaml.safe_load(files[name])) == [], name


@pytest.mark.parametrize("preset, objects, pinned", [
    # torchtitan tokenizes as it loads and compiles in training: its run creates no such job
    ("llama3-8b-gpu", {"k8s_train.yaml"}, False),
    # the native trainer's warm-up fills the cache on the nodes training is then held to
    ("tiny-local", {"k8s_tokenize.yaml", "k8s_precompile.yaml", "k8s_train.yaml"}, True),
])
def test_a_run_on_kubernetes_creates_the_objects_of_the_stages_its_backend_runs(preset, objects, pinned):
    files = render_files(load_spec(preset), eks())
    assert {name for name in files if name.startswith("k8s_")} == objects
    for name in objects:
        assert invalid(yaml.safe_load(files[name])) == [], name
    assert ("<precompile-nodes>" in files["k8s_train.yaml"]) == pinned


def test_the_objects_read_the_hub_files_where_fetch_puts_them_never_the_hub():
    """llama3-8b-gpu's tokenizer is a hf:// reference: the flow downloads it to the shared disk
    before any job, and the pods read it there, as the Slurm jobs do. The dry run showed the
    PyTorchJob with the hf:// reference itself."""
    files = render_files(load_spec("llama3-8b-gpu"), eks())
    assert "hf://" not in files["k8s_train.yaml"] and "<hub-output:tokenizer.path>" in files["k8s_train.yaml"]
    assert "tokenizer.path: model meta-llama/Llama-3.1-8B" in files["hub_downloads.txt"]


def test_the_schemas_catch_what_the_api_server_would_refuse():
    """The validation has teeth: a typo'd field, an integer where the CRD wants a string, a
    missing container name are each reported."""
    spec = load_spec("gpt3-7.5b-eks")
    train = kubernetes.pytorch_job(eks(), spec, "t", "train", Command(["true"]), 60)
    train["spec"]["nprocPerNode"] = 8
    assert any("nprocPerNode" in e for e in invalid(train))
    job = kubernetes.batch_job(eks(), spec, "j", "convert", Command(["true"]), 60)
    job["spec"]["template"]["spec"]["nodeSelecter"] = {}
    del job["spec"]["template"]["spec"]["containers"][0]["name"]
    problems = invalid(job)
    assert any("nodeSelecter" in e for e in problems) and any("'name' is a required property" in e for e in problems)


def test_indexed_job_runs_each_command_by_its_index():
    spec = load_spec("gpt3-7.5b-eks")
    body = kubernetes.indexed_job(eks(), spec, "tok", "tokenize", [Command(["echo", "a b"]), Command(["echo", "c"])], 10)
    script = body["spec"]["template"]["spec"]["containers"][0]["command"]
    for index, expected in (("0", "a b"), ("1", "c")):
        done = subprocess.run(script, env={"JOB_COMPLETION_INDEX": index, "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True)
        assert done.stdout == f"{expected}\n"
    assert subprocess.run(script, env={"JOB_COMPLETION_INDEX": "2", "PATH": "/usr/bin:/bin"}).returncode == 2


def test_paths_outside_the_volume_and_a_missing_or_squashfs_image_are_refused():
    spec = load_spec("gpt3-7.5b-eks", ["paths.root=/home/ubuntu/data"])
    with pytest.raises(ValueError, match="paths.root=/home/ubuntu/data is not under .* mount_path /fsx"):
        kubernetes.check_paths(eks(), spec)
    spec = load_spec("gpt3-7.5b-eks", ["backend.megatron_lm.container_image=null"])
    with pytest.raises(ValueError, match="no image for the pods: set the KubernetesCluster block's `image`"):
        kubernetes.batch_job(runbook_cluster(), spec, "j", "fetch", Command(["true"]), 10)
    # the image stage's squashfs is pyxis's: a pod pulls a registry image
    spec = load_spec("gpt3-7.5b-gpu", ["cluster.block=kubernetes-cluster/eks"])
    assert spec.backend.megatron_lm.image is not None
    with pytest.raises(ValueError, match="backend.megatron_lm.image: the image stage builds a squashfs for "
                                         "enroot/pyxis"):
        kubernetes.image(eks(), spec)


def test_cli_render_of_the_eks_preset_writes_the_jobs_and_the_pytorchjob(tmp_path):
    """Without a Prefect server at hand, the render uses the runbook's cluster (runbook_cluster)."""
    assert main(["render", "gpt3-7.5b-eks", "--out", str(tmp_path)]) == 0
    for name in ("k8s_tokenize.yaml", "k8s_train.yaml"):
        assert invalid(yaml.safe_load((tmp_path / name).read_text())) == [], name


def containers(body: dict) -> list[dict]:
    """Every container of a Job's pod or of each PyTorchJob replica's."""
    templates = ([r["template"] for r in body["spec"]["pytorchReplicaSpecs"].values()]
                 if body["kind"] == "PyTorchJob" else [body["spec"]["template"]])
    return [c for t in templates for c in t["spec"]["containers"]]


def test_every_pod_of_the_eks_preset_carries_the_runbooks_network_settings(tmp_path):
    """The runbook's PyTorchJob sets libfabric's EFA provider and NCCL's settings in its container;
    every pod of every stage gets them from the block, and the manifests still validate."""
    assert main(["render", "gpt3-7.5b-eks", "--out", str(tmp_path)]) == 0
    rendered = sorted(tmp_path.glob("k8s_*.yaml"))
    assert {p.name for p in rendered} >= {"k8s_tokenize.yaml", "k8s_train.yaml"}
    for path in rendered:
        body = yaml.safe_load(path.read_text())
        assert invalid(body) == [], path.name
        for container in containers(body):
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env.items() >= RUNBOOK_NETWORK_ENV.items(), path.name
    assert RUNBOOK_NETWORK_ENV == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1",
                                   "NCCL_SOCKET_IFNAME": "^lo", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                                   "NCCL_DEBUG": "INFO"}


def test_the_sites_env_goes_over_the_network_settings_and_the_stages_own_over_both():
    spec = load_spec("gpt3-7.5b-eks")
    cluster = eks().model_copy(update={"env": {"NCCL_DEBUG": "WARN", "PRETRAIN_PEAK_TFLOPS": "989",
                                               "MASTER_PORT": "1", "NODE_NAME": "mine"}})
    train = kubernetes.pytorch_job(cluster, spec, "t", "train", Command(["true"], env={"NCCL_SOCKET_IFNAME": "eth0"}),
                                   60)
    job = kubernetes.batch_job(cluster, spec, "j", "convert", Command(["true"]), 60)
    for body in (train, job):
        assert invalid(body) == []
        for container in containers(body):
            names = [e["name"] for e in container["env"]]
            assert len(names) == len(set(names)), names  # one entry per name
            env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
            assert env["NCCL_DEBUG"] == "WARN" and env["PRETRAIN_PEAK_TFLOPS"] == "989"
            assert env["FI_PROVIDER"] == "efa"
            assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}  # the downward API's
    assert {e["name"]: e.get("value") for e in containers(train)[0]["env"]}["NCCL_SOCKET_IFNAME"] == "eth0"
    assert {e["name"]: e.get("value") for e in containers(job)[0]["env"]}["MASTER_PORT"] == "29500"
    # a cluster without EFA leaves the network settings out
    bare = kubernetes.batch_job(eks().model_copy(update={"network_env": {}}), spec, "j", "convert",
                                Command(["true"]), 60)
    assert "FI_PROVIDER" not in {e["name"] for e in containers(bare)[0]["env"]}


@pytest.mark.parametrize("field", ["env", "network_env"])
def test_a_variable_name_no_shell_can_export_is_refused_naming_the_field(field):
    with pytest.raises(ValueError, match=rf"{field}\n.*'NCCL-DEBUG' is not a variable name a shell can export"):
        KubernetesCluster(volume_claim="fsx-claim", **{field: {"NCCL-DEBUG": "INFO"}})
