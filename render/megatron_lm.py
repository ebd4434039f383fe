"""Megatron-LM launch from the spec: ``pretrain_gpt.py`` arguments and the per-node torchrun line
that runs inside the pyxis container (the ParallelCluster / HyperPod / EKS GPT-3 runbooks)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.node import Command
from pretrain.spec import MegatronLMSpec, PretrainSpec
from render.dataset_files import blend, gpt2_bpe_files
from render.job_end import megatron_exit_duration_min
from render.monitor import monitor_command
from render.shell import require_program, shell_line
from trainer.run_layout import checkpoint_dir

if TYPE_CHECKING:  # a Prefect block; rendering only copies it
    from blocks.cluster import SlurmCluster
    from jobs.kubernetes import KubernetesTarget

MASTER_PORT = 29500
PRETRAIN_GPT = "/workspace/Megatron-LM/pretrain_gpt.py"
# Megatron-LM 0.15.0 added a second tokenizer system and made it the default; its
# --legacy-tokenizer (new in core_v0.15.0's megatron/training/arguments.py) keeps the one earlier
# releases always used, which older parsers refuse as an unknown argument.
LEGACY_TOKENIZER_FLAG_SINCE = (0, 15, 0)


# Megatron-LM names a checkpoint directory's newest iteration in this file, and loads nothing from
# a directory without it (get_checkpoint_tracker_filename, checkpoint_exists in
# megatron/training/checkpointing.py at core_v0.16.1).
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"


def pretrained_checkpoint_refusal(directory: Path) -> str | None:
    """Why Megatron-LM could not start from ``directory`` (``model.init_from``), or None. Without
    the tracker file, every rank of the queued job would fail with "No checkpoint found in load
    directory or pretrained directory"."""
    if (directory / CHECKPOINT_TRACKER).is_file():
        return None
    if (directory / "config.json").is_file():
        return (f"model.init_from={directory} is a Hugging Face checkpoint (config.json), and Megatron-LM loads "
                "only its own format: convert it with Megatron-LM's tools/checkpoint/convert.py (the checkout "
                "the image pins) and set model.init_from to the converted directory")
    return (f"model.init_from={directory} holds no Megatron-LM checkpoint ({CHECKPOINT_TRACKER} is missing): "
            "give the directory a Megatron-LM run saved to (its --save)")


def release(version: str) -> tuple[int, ...]:
    """``backend.megatron_lm.version`` ("0.16.1") as numbers, for comparing releases."""
    return tuple(int(part) for part in version.split("."))


def pretrain_gpt_args(spec: PretrainSpec, data_prefix: str, checkpoint_dir: str) -> list[str]:
    """The arguments, in the runbooks' order of concerns: model, parallelism, batch and schedule,
    data, logging and checkpoints. Benchmark mode evaluates nothing (split 100,0,0)."""
    m, p, t = spec.model, spec.parallel, spec.training
    mlm = spec.backend.megatron_lm or MegatronLMSpec()
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--num-attention-heads", str(m.num_attention_heads), "--ffn-hidden-size", str(m.ffn_hidden_size),
            "--seq-length", str(m.seq_length),
            "--max-position-embeddings", str(m.max_position_embeddings),
            "--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp),
            "--micro-batch-size", str(t.micro_batch_size), "--global-batch-size", str(t.global_batch_size),
            "--lr", str(t.lr), "--min-lr", str(t.min_lr), "--lr-decay-style", t.lr_decay_style,
            "--clip-grad", str(t.grad_clip), "--weight-decay", str(t.weight_decay),
            "--adam-beta1", str(t.adam_betas[0]), "--adam-beta2", str(t.adam_betas[1]),
            "--init-method-std", str(mlm.init_method_std), "--seed", str(t.seed)]
    if m.num_kv_heads and m.num_kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if p.cp > 1:
        args += ["--context-parallel-size", str(p.cp)]
    if t.train_samples:
        # Sample-based training needs sample-based warmup and decay (Megatron asserts it).
        warmup = t.warmup_steps * t.global_batch_size if mlm.lr_warmup_samples is None else mlm.lr_warmup_samples
        args += ["--train-samples", str(t.train_samples),
                 "--lr-decay-samples", str(mlm.lr_decay_samples or t.train_samples),
                 "--lr-warmup-samples", str(warmup)]
    else:
        args += ["--train-iters", str(t.train_steps), "--lr-decay-iters", str(t.train_steps),
                 "--lr-warmup-iters", str(t.warmup_steps)]
    if t.precision != "fp32":  # Megatron's --bf16 is mixed precision: bf16 compute, fp32 main weights
        args.append("--bf16")
    if mlm.recompute_activations:
        args.append("--recompute-activations")
    split = "100,0,0" if t.benchmark else spec.data.split
    vocab, merges = gpt2_bpe_files(spec, data_prefix)
    data_path = [str(x) for pair in blend(spec, data_prefix) for x in pair] if spec.data.blend else [data_prefix]
    # --legacy-tokenizer: Megatron-LM 0.16's default tokenizer system builds GPT2BPETokenizer as
    # AutoTokenizer.from_pretrained("gpt2", vocab_file=...), which asks the Hugging Face Hub for
    # gpt2's files first and fails on a node without internet (seen on a lent H100); the legacy
    # one reads the vocab and merges files alone, as the runbooks' Megatron-LM did.
    legacy = ["--legacy-tokenizer"] if release(mlm.version) >= LEGACY_TOKENIZER_FLAG_SINCE else []
    args += ["--data-path", *data_path, "--split", split, "--tokenizer-type", "GPT2BPETokenizer", *legacy,
             "--vocab-file", vocab, "--merge-file", merges,
             "--log-interval", "1", "--eval-interval", str(t.eval_interval), "--eval-iters", str(t.eval_batches),
             "--save", checkpoint_dir, "--load", checkpoint_dir, "--save-interval", str(t.checkpoint_steps),
             # Save and exit before the job's time limit (render/job_end.py); and on SIGTERM (a
             # preemption, scancel), after the iteration under way, when it still has the time.
             "--exit-duration-in-mins", str(megatron_exit_duration_min(spec)), "--exit-signal-handler"]
    if m.init_from:
        # Read only while --load has no checkpoint of its own: the first attempt starts from its
        # weights (iteration 0, a fresh optimizer, as --finetune); a resubmitted one resumes --load.
        args += ["--pretrained-checkpoint", m.init_from]
    return args + mlm.extra_args


def environment() -> dict[str, str]:
    """What the runbooks export before the launch: one hardware queue per GPU, so a tensor-parallel
    communication kernel is scheduled ahead of the compute it overlaps (Megatron-LM asks for it
    under tensor and sequence parallelism)."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def torchrun_command(spec: PretrainSpec, data_prefix: str, checkpoint_dir: str) -> list[str]:
    """One line per node; $NNODES, $NODE_RANK and $MASTER_ADDR come from the Slurm environment."""
    return ["torchrun", "--nproc_per_node", str(spec.cluster.devices_per_node), "--nnodes", "$NNODES",
            "--node_rank", "$NODE_RANK", "--master_addr", "$MASTER_ADDR", "--master_port", str(MASTER_PORT),
            PRETRAIN_GPT, *pretrain_gpt_args(spec, data_prefix, checkpoint_dir)]


def node_command(spec: PretrainSpec, dataset: str, run: Path) -> Command:
    """Each node's torchrun line, its output kept in the run directory (pipefail: the line's
    exit status is torchrun's, not tee's), the device sampler beside it."""
    line = shell_line(torchrun_command(spec, dataset, str(checkpoint_dir(run))))
    log = f"{shlex.quote(str(run))}/node-$NODE_RANK.log"
    guard = require_program(PRETRAIN_GPT, "the job runs in an image with Megatron-LM at /workspace/Megatron-LM, as "
                            "the runbooks' Dockerfile puts it (backend.megatron_lm.image or container_image)", log)
    return Command(["bash", "-c", f"set -o pipefail; {guard}; {line} 2>&1 | tee -a {log}"],
                   env=environment(), sidecar=monitor_command(spec, str(run)))


def in_container(cluster: SlurmCluster | KubernetesTarget, spec: PretrainSpec,
                 image: str | None = None) -> SlurmCluster | KubernetesTarget:
    """``cluster`` running its srun steps in a pyxis image: ``image``, the image stage's squashfs,
    or else the ``container_image`` the spec names; unchanged without either. A Kubernetes
    target, which has no srun steps, as it is: its pods run in their image already."""
    settings = spec.backend.megatron_lm
    container = image or (settings.container_image if settings else None)
    if not container or not hasattr(cluster, "container_image"):
        return cluster
    update: dict = {"container_image": container, "container_mounts": settings.container_mounts}
    if image and settings.image and settings.image.install_project:
        # srun starts submitit's Python inside the container: the image's, which has submitit
        # and this project (render/image.py), not the head node's interpreter path.
        update["python"] = "python"
    return cluster.model_copy(update=update)
