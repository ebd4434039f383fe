"""Every file a run would launch, rendered from the spec without submitting anything: for
`pretrain render PRESET --out DIR` and the flow's ``dry_run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster, runbook_cluster
from tasks.executor import KUBERNETES_PREFIX, load_kubernetes_block
from jobs.node import Command
from jobs.contract import MissingClusterBlock, stage_request
from jobs.slurm import batch_script, job_folder, load_cluster_block
from pretrain.hub_refs import with_local_values
from pretrain.checkpoint_interval import planned
from pretrain.spec import PretrainSpec
from render import image, kubernetes, megatron_lm, native, nxdt, torchtitan
from render.convert_command import convert_command
from render.hub_downloads import hub_downloads, hub_placeholders
from render.job_end import signal_delay_s
from render.dataset_files import arrow_output, tokenizer_paths
from render.megatron_lm import in_container
from render.nxdt_scripts import CONFIG_NAME, precompile_script, train_script
from render.shell import shell_line
from render.tokenize_command import tokenize_command
from tasks.artifacts import artifact_key
from trainer.run_layout import checkpoint_dir

# Where outputs of earlier stages will be; the real paths are content-addressed at run time.
FETCHED, DATASET, CONVERTED = "<fetch-output>", "<tokenize-output>", "<convert-output>"
TRAIN_RUN = "<train-run>"
PRECOMPILE_DIR = "<precompile-dir>"
IMAGE_DIR = "<image-output>"


def _shell(argv: list[str]) -> str:
    return shell_line(argv) + "\n"


def _exports(env: dict[str, str]) -> str:
    return "".join(f"export {k}={v}\n" for k, v in env.items())


def _sbatch(spec: PretrainSpec, cluster: SlurmCluster, name: str, **shape: Any) -> str:
    """The batch script of this stage's job on this cluster (the command itself travels pickled
    beside it; the stage's .sh file shows it)."""
    request = stage_request(spec, name, Command(["true"]), **shape)
    return batch_script(cluster, request, job_folder(spec, cluster) / "<job>")


def _manifest(body: dict[str, Any]) -> str:
    return yaml.safe_dump(body, sort_keys=False)


def kubernetes_files(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    """The objects a run on Kubernetes creates, beside the command lines they run: tokenize's
    shards as an Indexed Job (as many as data.tokenize_shards, else one: the run counts them from
    the input's size), the conversion as a Job, precompile and training as PyTorchJobs, training
    held to the nodes precompile filled."""
    time_limit, manifests = spec.cluster.time_limit_min, {}
    tokenizer = {flag: str(path) for flag, path in tokenizer_paths(spec, Path(FETCHED)).items()}
    shards = 1 if arrow_output(spec) else spec.data.tokenize_shards or 1
    commands = [Command(tokenize_command(spec, [FETCHED], f"{DATASET}/parts/shard-{i}", tokenizer,
                                         shard=None if arrow_output(spec) else f"{i}/{shards}",
                                         record=f"{DATASET}/parts/shard-{i}.json")) for i in range(shards)]
    manifests["k8s_tokenize.yaml"] = _manifest(kubernetes.indexed_job(
        cluster, spec, f"{spec.name}-tokenize", "tokenize", commands, time_limit, spec.cluster.cpus_per_task,
        spec.cluster.mem_gb))
    if "convert.sh" in files:
        manifests["k8s_convert.yaml"] = _manifest(kubernetes.batch_job(
            cluster, spec, f"{spec.name}-convert", "convert", Command(["bash", "-c", files["convert.sh"]]), time_limit))
    nodes: tuple[str, ...] = ()
    if "precompile.sh" in files:
        manifests["k8s_precompile.yaml"] = _manifest(kubernetes.pytorch_job(
            cluster, spec, f"{spec.name}-precompile", "precompile", Command(["bash", "-c", files["precompile.sh"]]),
            time_limit))
        nodes = ("<precompile-nodes>",)
    if spec.backend.kind == "megatron-lm":
        train = megatron_lm.node_command(spec, f"{DATASET}/data_text_document", Path(TRAIN_RUN))
    elif spec.backend.kind == "torchtitan":
        train = torchtitan.node_command(spec, str(torchtitan.loader_dir(Path(TRAIN_RUN))), Path(TRAIN_RUN),
                                        spec.model.init_from)
    elif spec.backend.kind == "native":
        train = Command(["bash", "-c", files["torchrun.sh"]], env=native.environment(spec))
    else:
        train = Command(["bash", "-c", files["train.sh"]])
    manifests["k8s_train.yaml"] = _manifest(kubernetes.pytorch_job(
        cluster, spec, f"{spec.name}-train", "train", train, time_limit, nodes))
    return manifests


def render_files(spec: PretrainSpec, cluster: SlurmCluster | KubernetesCluster | None = None) -> dict[str, str]:
    """``cluster``: the site's block; None renders Slurm's defaults, or, for a spec that names a
    KubernetesCluster block, :func:`blocks.kubernetes.runbook_cluster` (the EKS runbook's)."""
    if cluster is None and (spec.cluster.block or "").startswith(KUBERNETES_PREFIX):
        cluster = runbook_cluster()
    if isinstance(cluster, KubernetesCluster):
        files = render_files(spec, SlurmCluster(executor="slurm"))
        return {**{k: v for k, v in files.items() if not k.startswith("sbatch_")},
                **kubernetes_files(planned(spec), cluster, files)}
    site = cluster = cluster or SlurmCluster(executor="slurm")
    files = {"spec.yaml": yaml.safe_dump(json.loads(spec.model_dump_json()), sort_keys=False)}
    spec = planned(spec)  # the first job's launch: checkpoint_interval=auto as the spec alone gives it
    if downloads := hub_downloads(spec, FETCHED):
        files["hub_downloads.txt"] = downloads
        # the stages after fetch read the Hub's files from the shared disk, never a URI
        spec = with_local_values(spec, hub_placeholders(spec))
    tokenizer = {flag: str(path) for flag, path in tokenizer_paths(spec, Path(FETCHED)).items()}
    if spec.backend.kind != "torchtitan":  # torchtitan tokenizes as it loads
        files["tokenize.sh"] = _shell(tokenize_command(spec, [FETCHED], f"{DATASET}/data", tokenizer,
                                                       shard=None if arrow_output(spec) else "$SHARD/$SHARDS"))
    if spec.backend.kind == "neuron":
        init = CONVERTED if spec.model.init_from else None
        if spec.model.init_from:
            files["convert.sh"] = _shell(convert_command(spec, spec.model.init_from, CONVERTED))
        data = DATASET if spec.model.family == "llama" else f"{DATASET}/data_text_document"
        files["nxdt_config.yaml"] = nxdt.config_yaml(nxdt.nxdt_config(spec, data, init))
        files["train_env.sh"] = _exports(nxdt.train_environment())
        files["torchrun.sh"] = _shell(nxdt.torchrun_command(spec, CONFIG_NAME))
        files["precompile.sh"] = precompile_script(spec, f"{PRECOMPILE_DIR}/conf", f"{PRECOMPILE_DIR}/attempt",
                                                   retry_failed=False)
        files["train.sh"] = train_script(spec, Path(TRAIN_RUN), cache_url=None)
    elif spec.backend.kind == "native":
        # the tokenizer's end-of-document id is looked up when the run is submitted
        config = native.train_config(spec, dataset=f"{DATASET}/data_text_document", run_dir=TRAIN_RUN, eod_id=0)
        files["train.json"] = json.dumps(config, indent=2) + "\n"
        files["train_env.sh"] = _exports(native.environment(spec))
        files["torchrun.sh"] = _shell(native.torchrun_command(spec, f"{TRAIN_RUN}/train.json",
                                                              f"{TRAIN_RUN}/record.json"))
    elif spec.backend.kind == "megatron-lm":
        built = spec.backend.megatron_lm and spec.backend.megatron_lm.image
        if built:
            files["Containerfile"] = image.installed_containerfile(built)
            files["build_image.sh"] = image.build_script(
                built, image.image_tag(spec.name, "<key>"), f"{IMAGE_DIR}/context", f"{IMAGE_DIR}/{image.SQUASHFS}",
                f"{IMAGE_DIR}/record.json")
        files["train_env.sh"] = _exports(megatron_lm.environment())
        files["torchrun.sh"] = _shell(megatron_lm.torchrun_command(spec, f"{DATASET}/data_text_document",
                                                                str(checkpoint_dir(TRAIN_RUN))))
        cluster = in_container(cluster, spec, f"{IMAGE_DIR}/{image.SQUASHFS}" if built else None)
    elif spec.backend.kind == "torchtitan":
        files["train_env.sh"] = _exports(torchtitan.environment(spec))
        files["torchrun.sh"] = _shell(torchtitan.torchrun_command(spec, str(torchtitan.loader_dir(Path(TRAIN_RUN))),
                                                                  TRAIN_RUN, spec.model.init_from))
    # One batch script per job the run submits, shaped as the tasks shape them.
    if "tokenize.sh" in files:
        files["sbatch_tokenize.sh"] = _sbatch(spec, site, "tokenize-<i>-of-<n>", nodes=1, gpus_per_node=None,
                                              exclusive=False)
    if "convert.sh" in files:
        files["sbatch_convert.sh"] = _sbatch(spec, site, f"{spec.name}-convert", nodes=1, gpus_per_node=None,
                                             exclusive=False)
    if "build_image.sh" in files:
        files["sbatch_image.sh"] = _sbatch(spec, site, f"{spec.name}-image", nodes=1, gpus_per_node=None,
                                           exclusive=False, time_limit_min=image.BUILD_TIME_LIMIT_MIN)
    if spec.backend.kind == "neuron" or (spec.backend.kind == "native" and spec.backend.native.compile):
        files["sbatch_precompile.sh"] = _sbatch(spec, site, f"{spec.name}-precompile")
    files["sbatch_train.sh"] = _sbatch(spec, cluster, f"{spec.name}-train", signal_delay_s=signal_delay_s(spec))
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
