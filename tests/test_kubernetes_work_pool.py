"""The flow's own pod on the Kubernetes work pool (deployments/kubernetes-work-pool.json and
deployments/prefect-kubernetes.yaml): prefect-kubernetes's own code fills the work pool's template
with the deployment's job variables, as its worker does for a flow run, and the Job it would
create mounts the stages' volume where the stages' pods do and runs the stages' image, so the
flow can renew its jobs' leases (a job whose flow died is reaped by its lease)."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from blocks.kubernetes import KubernetesCluster, runbook_cluster
from pretrain.presets import load_spec
from kubernetes_api_server import RecordedApiServer
from kubernetes_schemas import invalid

pytestmark = pytest.mark.pure

DEPLOYMENTS = Path(__file__).parent.parent / "deployments"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/megatron-lm:0.16.1"
# What the pool's template adds to prefect-kubernetes's default: the claim as a volume and its mount.
SHARED = "shared"
ADDED_VARIABLES = ("volume_claim", "mount_path")


def pool_template() -> dict[str, Any]:
    return json.loads((DEPLOYMENTS / "kubernetes-work-pool.json").read_text())


def test_the_work_pools_template_is_prefect_kubernetes_default_with_the_shared_volume():
    """The template is the installed prefect-kubernetes's default (`prefect work-pool
    get-default-base-job-template --type kubernetes`) with only the claim's volume, its mount and
    their two variables added: a prefect-kubernetes whose default changes fails here, and the
    template is refreshed from it."""
    from prefect_kubernetes.worker import KubernetesWorker

    template = pool_template()
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert pod.pop("volumes") == [{"name": SHARED, "persistentVolumeClaim": {"claimName": "{{ volume_claim }}"}}]
    assert pod["containers"][0].pop("volumeMounts") == [{"name": SHARED, "mountPath": "{{ mount_path }}"}]
    variables = template["variables"]
    assert [variables["properties"].pop(name)["type"] for name in ADDED_VARIABLES] == ["string", "string"]
    assert variables.pop("required") == list(ADDED_VARIABLES)
    assert template == KubernetesWorker.get_default_base_job_template()


def flow_pod_job(cluster: KubernetesCluster, block_name: str) -> dict[str, Any]:
    """The Job a Kubernetes worker would create for a run of the EKS deployment: the deployment's
    block references resolved as `prefect deploy` resolves them (the block served by a loopback
    Prefect API route), then the pool's template filled and prepared for a flow run by
    prefect-kubernetes's own job configuration."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.utilities.templating import resolve_block_document_references
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    # the pretrain deployment; the nightly benchmark's beside it runs in a pod of the same template
    (deployment,) = [d for d in yaml.safe_load((DEPLOYMENTS / "prefect-kubernetes.yaml").read_text())["deployments"]
                     if d["entrypoint"] == "flows.pretrain:pretrain"]
    document = cluster._to_block_document(name=block_name, block_schema_id=uuid.uuid4(), block_type_id=uuid.uuid4())
    route = f"/api/block_types/slug/{cluster.get_block_type_slug()}/block_documents/name/{block_name}"

    async def fill() -> dict[str, Any]:
        async with get_client() as client:
            resolved = await resolve_block_document_references(copy.deepcopy(deployment), client=client)
            config = await KubernetesWorkerJobConfiguration.from_template_and_values(
                pool_template(), resolved["work_pool"]["job_variables"], client=client)
        config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="gpt3-7.5b-eks"))
        return config.job_manifest

    with RecordedApiServer([], {route: document.model_dump(mode="json")}) as server:
        with temporary_settings({PREFECT_API_URL: f"{server.url}/api"}):
            return asyncio.run(fill())


def test_the_flows_pod_mounts_the_blocks_claim_at_its_mount_path_and_runs_its_image():
    cluster = runbook_cluster().model_copy(update={"image": IMAGE, "namespace": "training"})
    block = load_spec("gpt3-7.5b-eks").cluster.block  # the deployment reads the block its preset runs on
    job = flow_pod_job(cluster, block.removeprefix("kubernetes-cluster/"))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    claims = {v["name"] for v in pod["volumes"]
              if v.get("persistentVolumeClaim", {}).get("claimName") == cluster.volume_claim}
    assert {m["mountPath"] for m in container["volumeMounts"] if m["name"] in claims} == {cluster.mount_path}
    assert container["image"] == IMAGE
    assert job["metadata"]["namespace"] == "training"
    # prefect-kubernetes requires `parallelism` and `completions` in the pod spec, where no Kubernetes
    # schema has them; the API server drops unknown fields with a warning (fieldValidation Warn, its
    # default for a client that does not ask, as the worker's does not). Everything else must validate.
    dropped = copy.deepcopy(job)
    for field in ("parallelism", "completions"):
        dropped["spec"]["template"]["spec"].pop(field)
    assert invalid(dropped) == []
