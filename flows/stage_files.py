"""Each stage's files as its jobs run them, rendered from the spec without submitting anything:
its command lines, configs and batch scripts on Slurm, and the objects it creates on Kubernetes,
for `pretrain render` and the flow's dry run. The outputs of earlier stages exist only at run time (their paths are content-addressed),
so the files name them by placeholders.

One function per stage and backend; the stages' lists (flows/stages.py) say which one renders
each stage, so nothing here decides which stages a backend runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster
from jobs.node import Command
from jobs.contract import stage_request
from jobs.slurm import batch_script, job_folder
from pretrain.spec import PretrainSpec
from render import image, kubernetes, megatron_lm, native, nxdt, torchtitan
from render.convert_command import convert_command
from render.dataset_files import arrow_output, tokenizer_paths
from render.job_end import signal_delay_s
from render.megatron_lm import in_container
from render.nxdt_scripts import CONFIG_NAME, precompile_script, train_script
from render.shell import shell_line
from render.tokenize_command import tokenize_command
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


def sbatch(spec: PretrainSpec, cluster: SlurmCluster, name: str, **shape: Any) -> str:
    """The batch script of this stage's job on this cluster (the command itself travels pickled
    beside it; the stage's .sh file shows it)."""
    request = stage_request(spec, name, Command(["true"]), **shape)
    return batch_script(cluster, request, job_folder(spec, cluster) / "<job>")


def _one_node(spec: PretrainSpec, site: SlurmCluster, name: str, **shape: Any) -> str:
    """The batch script of a stage that runs on one node beside the others (no GPU, not exclusive)."""
    return sbatch(spec, site, name, nodes=1, gpus_per_node=None, exclusive=False, **shape)


def tokenize_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    tokenizer = {flag: str(path) for flag, path in tokenizer_paths(spec, Path(FETCHED)).items()}
    return {"tokenize.sh": _shell(tokenize_command(spec, [FETCHED], f"{DATASET}/data", tokenizer,
                                                   shard=None if arrow_output(spec) else "$SHARD/$SHARDS")),
            "sbatch_tokenize.sh": _one_node(spec, site, "tokenize-<i>-of-<n>")}


def convert_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    return {"convert.sh": _shell(convert_command(spec, spec.model.init_from, CONVERTED)),
            "sbatch_convert.sh": _one_node(spec, site, f"{spec.name}-convert")}


def _precompile_sbatch(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    return {"sbatch_precompile.sh": sbatch(spec, site, f"{spec.name}-precompile")}


def precompile_native_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    """The warm-up runs the training's own launch (train.json, torchrun.sh), capped."""
    return _precompile_sbatch(spec, site)


def precompile_neuron_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    return {"precompile.sh": precompile_script(spec, f"{PRECOMPILE_DIR}/conf", f"{PRECOMPILE_DIR}/attempt",
                                               retry_failed=False),
            **_precompile_sbatch(spec, site)}


def image_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    built = spec.backend.megatron_lm.image
    return {"Containerfile": image.installed_containerfile(built),
            "build_image.sh": image.build_script(built, image.image_tag(spec.name, "<key>"), f"{IMAGE_DIR}/context",
                                                 f"{IMAGE_DIR}/{image.SQUASHFS}", f"{IMAGE_DIR}/record.json"),
            "sbatch_image.sh": _one_node(spec, site, f"{spec.name}-image", time_limit_min=image.BUILD_TIME_LIMIT_MIN)}


def _train_sbatch(spec: PretrainSpec, cluster: SlurmCluster) -> dict[str, str]:
    return {"sbatch_train.sh": sbatch(spec, cluster, f"{spec.name}-train", signal_delay_s=signal_delay_s(spec))}


def train_native_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    # the tokenizer's end-of-document id is looked up when the run is submitted
    config = native.train_config(spec, dataset=f"{DATASET}/data_text_document", run_dir=TRAIN_RUN, eod_id=0)
    return {"train.json": json.dumps(config, indent=2) + "\n",
            "train_env.sh": _exports(native.environment(spec)),
            "torchrun.sh": _shell(native.torchrun_command(spec, f"{TRAIN_RUN}/train.json", f"{TRAIN_RUN}/record.json")),
            **_train_sbatch(spec, site)}


def train_nxdt_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    data = DATASET if spec.model.family == "llama" else f"{DATASET}/data_text_document"
    init = CONVERTED if spec.model.init_from else None
    return {"nxdt_config.yaml": nxdt.config_yaml(nxdt.nxdt_config(spec, data, init)),
            "train_env.sh": _exports(nxdt.train_environment()),
            "torchrun.sh": _shell(nxdt.torchrun_command(spec, CONFIG_NAME)),
            "train.sh": train_script(spec, Path(TRAIN_RUN), cache_url=None),
            **_train_sbatch(spec, site)}


def train_megatron_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    built = spec.backend.megatron_lm and spec.backend.megatron_lm.image
    cluster = in_container(site, spec, f"{IMAGE_DIR}/{image.SQUASHFS}" if built else None)
    return {"train_env.sh": _exports(megatron_lm.environment()),
            "torchrun.sh": _shell(megatron_lm.torchrun_command(spec, f"{DATASET}/data_text_document",
                                                               str(checkpoint_dir(TRAIN_RUN)))),
            **_train_sbatch(spec, cluster)}


def train_torchtitan_files(spec: PretrainSpec, site: SlurmCluster) -> dict[str, str]:
    return {"train_env.sh": _exports(torchtitan.environment(spec)),
            "torchrun.sh": _shell(torchtitan.torchrun_command(spec, str(torchtitan.loader_dir(Path(TRAIN_RUN))),
                                                              TRAIN_RUN, spec.model.init_from)),
            **_train_sbatch(spec, site)}


# ------------------------------------------------------------------------------- on Kubernetes
# Each takes the stage's Slurm files (the command lines its pods run too) and the objects the
# stages before it create (training is held to the nodes precompile filled).

def _yaml(body: dict[str, Any]) -> str:
    return yaml.safe_dump(body, sort_keys=False)


def tokenize_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    """tokenize's shards as an Indexed Job: as many as data.tokenize_shards, else one (the run
    counts them from the input's size)."""
    tokenizer = {flag: str(path) for flag, path in tokenizer_paths(spec, Path(FETCHED)).items()}
    shards = 1 if arrow_output(spec) else spec.data.tokenize_shards or 1
    commands = [Command(tokenize_command(spec, [FETCHED], f"{DATASET}/parts/shard-{i}", tokenizer,
                                         shard=None if arrow_output(spec) else f"{i}/{shards}",
                                         record=f"{DATASET}/parts/shard-{i}.json")) for i in range(shards)]
    return {"k8s_tokenize.yaml": _yaml(kubernetes.indexed_job(
        cluster, spec, f"{spec.name}-tokenize", "tokenize", commands, spec.cluster.time_limit_min,
        spec.cluster.cpus_per_task, spec.cluster.mem_gb))}


def convert_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    return {"k8s_convert.yaml": _yaml(kubernetes.batch_job(
        cluster, spec, f"{spec.name}-convert", "convert", Command(["bash", "-c", files["convert.sh"]]),
        spec.cluster.time_limit_min))}


def _precompile_job(spec: PretrainSpec, cluster: KubernetesCluster, command: Command) -> dict[str, str]:
    return {"k8s_precompile.yaml": _yaml(kubernetes.pytorch_job(
        cluster, spec, f"{spec.name}-precompile", "precompile", command, spec.cluster.time_limit_min))}


def precompile_native_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    """The warm-up: the training's launch on a capped config of its own."""
    return _precompile_job(spec, cluster, Command(native.torchrun_command(
        spec, f"{PRECOMPILE_DIR}/train.json", f"{PRECOMPILE_DIR}/record.json"), env=native.environment(spec)))


def precompile_neuron_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    return _precompile_job(spec, cluster, Command(["bash", "-c", files["precompile.sh"]]))


def _train_job(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str], command: Command) -> dict[str, str]:
    nodes = ("<precompile-nodes>",) if "k8s_precompile.yaml" in files else ()
    return {"k8s_train.yaml": _yaml(kubernetes.pytorch_job(
        cluster, spec, f"{spec.name}-train", "train", command, spec.cluster.time_limit_min, nodes))}


def train_native_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    return _train_job(spec, cluster, files, Command(["bash", "-c", files["torchrun.sh"]], env=native.environment(spec)))


def train_nxdt_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    return _train_job(spec, cluster, files, Command(["bash", "-c", files["train.sh"]]))


def train_megatron_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    return _train_job(spec, cluster, files, megatron_lm.node_command(spec, f"{DATASET}/data_text_document",
                                                                     Path(TRAIN_RUN)))


def train_torchtitan_objects(spec: PretrainSpec, cluster: KubernetesCluster, files: dict[str, str]) -> dict[str, str]:
    return _train_job(spec, cluster, files, torchtitan.node_command(
        spec, str(torchtitan.loader_dir(Path(TRAIN_RUN))), Path(TRAIN_RUN), spec.model.init_from))
