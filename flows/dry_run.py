"""Every file a run would launch, rendered from the spec without submitting anything: for
`pretrain render PRESET --out DIR` and the flow's ``dry_run``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster, runbook_cluster
from tasks.executor import KUBERNETES_PREFIX, load_kubernetes_block
from jobs.contract import MissingClusterBlock
from jobs.slurm import load_cluster_block
from pretrain.hub_refs import with_local_values
from pretrain.checkpoint_interval import planned
from pretrain.spec import PretrainSpec
from render.hub_downloads import hub_downloads, hub_placeholders
from flows.stage_files import FETCHED
from tasks.artifacts import artifact_key
from flows.stages import stages_of


def render_files(spec: PretrainSpec, cluster: SlurmCluster | KubernetesCluster | None = None) -> dict[str, str]:
    """``cluster``: the site's block; None renders Slurm's defaults, or, for a spec that names a
    KubernetesCluster block, :func:`blocks.kubernetes.runbook_cluster` (the EKS runbook's)."""
    if cluster is None and (spec.cluster.block or "").startswith(KUBERNETES_PREFIX):
        cluster = runbook_cluster()
    on_kubernetes = isinstance(cluster, KubernetesCluster)
    files = {"spec.yaml": yaml.safe_dump(json.loads(spec.model_dump_json()), sort_keys=False)}
    spec = planned(spec)  # the first job's launch: checkpoint_interval=auto as the spec alone gives it
    if downloads := hub_downloads(spec, FETCHED):
        files["hub_downloads.txt"] = downloads
        # the stages after fetch read the Hub's files from the shared disk, never a URI
        spec = with_local_values(spec, hub_placeholders(spec))
    # each stage's own files, with one batch script per job it submits, as its task shapes them; on
    # Kubernetes the command lines as Slurm's jobs run them, and in place of the batch scripts the
    # objects each stage creates
    site = SlurmCluster(executor="slurm") if on_kubernetes or cluster is None else cluster
    applying = [stage for stage in stages_of(spec) if stage.why_not(spec) is None]
    for stage in applying:
        if stage.render is not None:
            files |= stage.render(spec, site)
    if on_kubernetes:
        files = {name: text for name, text in files.items() if not name.startswith("sbatch_")}
        for stage in applying:
            if stage.objects is not None:
                files |= stage.objects(spec, cluster, files)
    return files


def write_files(files: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)


@task(name="render")
def publish_rendered(spec: PretrainSpec) -> list[str]:
    """dry_run: every rendered file as a markdown artifact, nothing submitted. The sbatch script
    carries the site settings of the spec's SlurmCluster block; a block that does not exist yet
    is no reason to refuse a preview: it is rendered with Slurm's defaults and says so."""
    cluster, note = None, ""
    if spec.cluster.block:
        try:
            if spec.cluster.block.startswith(KUBERNETES_PREFIX):
                cluster = load_kubernetes_block(spec.cluster.block.removeprefix(KUBERNETES_PREFIX))
            else:
                cluster = load_cluster_block(spec.cluster.block).model_copy(update={"executor": "slurm"})
        except MissingClusterBlock as missing:
            get_run_logger().warning("dry run: %s; the sbatch script shows Slurm's defaults instead", missing)
            note = f"; without the site settings of cluster.block={spec.cluster.block!r}: no such block yet"
    files = render_files(spec, cluster)
    for name, text in files.items():
        language = {"yaml": "yaml", "json": "json", "txt": "text"}.get(name.rsplit(".", 1)[-1], "bash")
        create_markdown_artifact(f"**{name}**\n\n```{language}\n{text}```",
                                 key=artifact_key(spec.name, "render-" + name.split(".")[0].replace("_", "-")),
                                 description=f"{name} rendered for {spec.name} (dry run)"
                                             + (note if name.startswith("sbatch") else ""))
    return sorted(files)
