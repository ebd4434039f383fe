"""Each stage's files as its jobs run them on Slurm, rendered from the spec without submitting
anything: its command lines, configs and batch scripts, for `pretrain render` and the flow's dry
run. The outputs of earlier stages exist only at run time (their paths are content-addressed),
so the files name them by placeholders.

One function per stage and backend; the stages' lists (flows/stages.py) say which one renders
each stage, so nothing here decides which stages a backend runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocks.cluster import SlurmCluster
from jobs.node import Command
from jobs.contract import stage_request
from jobs.slurm import batch_script, job_folder
from pretrain.spec import PretrainSpec
from render import image, megatron_lm, native, nxdt, torchtitan
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
