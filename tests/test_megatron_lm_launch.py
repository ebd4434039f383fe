"""Megatron-LM launch rendering for gpt3-7.5b-gpu (p5.48xlarge, 2 x 8 H100, tp 8)."""

from __future__ import annotations

import re

import pytest

from pretrain.presets import SpecError, load_spec
from blocks.cluster import SlurmCluster
from flows.dry_run import render_files
from jobs.node import Command
from jobs.contract import JobRequest
from jobs.slurm import slurm_parameters
from render.megatron_lm import in_container
from render.megatron_lm import pretrain_gpt_args, pretrained_checkpoint_refusal, torchrun_command
from tasks.preflight import PreflightFailed, preflight

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it


def flags(args: list[str]) -> dict[str, str | bool]:
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = True
            i += 1
    return out


def test_published_gpt3_7_5b_values():
    args = flags(pretrain_gpt_args(load_spec("gpt3-7.5b-gpu"), "/fsx/gpt2_text_document", "/fsx/ckpt"))
    expected = {"--num-layers": "36", "--hidden-size": "4096", "--num-attention-heads": "32", "--seq-length": "2048",
                "--tensor-model-parallel-size": "8", "--pipeline-model-parallel-size": "1",
                "--micro-batch-size": "1", "--global-batch-size": "288", "--sequence-parallel": True, "--bf16": True,
                "--data-path": "/fsx/gpt2_text_document", "--split": "98,2,0", "--eval-iters": "40"}
    assert {k: args.get(k) for k in expected} == expected
    # The runbooks' schedule (ParallelCluster / HyperPod distributed-training.sbatch, EKS
    # pytorchjob): samples-based training with samples-based warmup and decay, never iteration-based.
    schedule = {"--train-samples": "146484375", "--lr-decay-samples": "126953125", "--lr-warmup-samples": "183105",
                "--lr": "6e-05", "--min-lr": "6e-06", "--lr-decay-style": "cosine", "--log-interval": "1",
                "--eval-interval": "1000", "--clip-grad": "1.0", "--weight-decay": "0.1", "--adam-beta1": "0.9",
                "--adam-beta2": "0.95", "--init-method-std": "0.006", "--recompute-activations": True,
                # the tokenizer's files beside the dataset, where tokenize keeps them (a URL opens nowhere)
                "--vocab-file": "/fsx/gpt2-vocab.json", "--merge-file": "/fsx/gpt2-merges.txt",
                "--tokenizer-type": "GPT2BPETokenizer"}
    assert {k: args.get(k) for k in schedule} == schedule
    assert "--lr-warmup-iters" not in args and "--train-iters" not in args and "--lr-decay-iters" not in args


def test_benchmark_mode_evaluates_nothing_and_iterations_mode():
    spec = load_spec("gpt3-7.5b-gpu", ["training.benchmark=true", "training.train_samples=null",
                                       "training.train_steps=100", "training.warmup_steps=10",
                                       "backend.megatron_lm.lr_decay_samples=null",
                                       "backend.megatron_lm.lr_warmup_samples=null"])
    args = flags(pretrain_gpt_args(spec, "/d", "/c"))
    assert args["--split"] == "100,0,0" and args["--eval-iters"] == "0"
    assert args["--train-iters"] == "100" and args["--lr-warmup-iters"] == "10" and "--train-samples" not in args


def test_the_arguments_are_rendered_for_the_pinned_megatron_lm_release():
    """--legacy-tokenizer came with Megatron-LM 0.15.0's second tokenizer system: from it on the
    launch keeps the tokenizer that reads the vocab and merges files alone; older parsers refuse
    the flag (benchmarks/megatron_lm_args.py parses these against core_v0.16.1, core_v0.12.1 and
    core_r0.8.0)."""
    assert load_spec("gpt3-7.5b-gpu").backend.megatron_lm.version == "0.16.1"
    for version, legacy in (("0.16.1", True), ("0.15.0", True), ("0.12.1", False), ("0.8.0", False)):
        spec = load_spec("gpt3-7.5b-gpu", [f"backend.megatron_lm.version={version}"])
        assert ("--legacy-tokenizer" in pretrain_gpt_args(spec, "/d", "/c")) is legacy, version
    with pytest.raises(SpecError, match="backend.megatron_lm.version='latest': give the release as MAJOR.MINOR.PATCH"):
        load_spec("gpt3-7.5b-gpu", ["backend.megatron_lm.version=latest"])


def test_extra_arguments_come_last_so_they_win():
    """Megatron's argparse keeps the last value of a repeated flag: the spec's extra arguments
    (an image without Transformer Engine, say) can change what the spec rendered."""
    spec = load_spec("gpt3-7.5b-gpu", ["backend.megatron_lm.extra_args=[--transformer-impl, local, --eval-iters, '2']"])
    args = pretrain_gpt_args(spec, "/d", "/c")
    assert args[-4:] == ["--transformer-impl", "local", "--eval-iters", "2"]
    assert args.count("--eval-iters") == 2


def test_torchrun_in_the_pyxis_container():
    spec = load_spec("gpt3-7.5b-gpu")
    line = torchrun_command(spec, "/d", "/c")
    assert line[:3] == ["torchrun", "--nproc_per_node", "8"] and "$NODE_RANK" in line
    # the image stage's squashfs, submitit started by the image's Python
    cluster = in_container(SlurmCluster(executor="slurm"), spec, "/fsx/pretrain/image/image-k/image.sqsh")
    assert slurm_parameters(cluster, JobRequest("t", Command(["true"]), time_limit_min=5))["srun_args"] == [
        "--export=ALL", "--container-image=/fsx/pretrain/image/image-k/image.sqsh", "--container-mounts=/fsx:/fsx"]
    assert cluster.python == "python"
    # or an image built elsewhere, named in the spec
    named = load_spec("gpt3-7.5b-gpu", ["backend.megatron_lm.image=null",
                                         "backend.megatron_lm.container_image=nvcr.io/nvidia/pytorch:24.09-py3"])
    assert in_container(SlurmCluster(executor="slurm"), named).container_image == "nvcr.io/nvidia/pytorch:24.09-py3"
    files = render_files(spec)
    assert "--container-image=<image-output>/image.sqsh" in files["sbatch_train.sh"]
    # The GPUs training needs are asked for (a GPU-scheduling cluster shows a job none otherwise);
    # the tokenizer asks for none, and a site's own gres setting takes the place of the request.
    assert "#SBATCH --gpus-per-node=8" in files["sbatch_train.sh"]
    assert "--gpus-per-node" not in files["sbatch_tokenize.sh"]
    site = render_files(spec, SlurmCluster(executor="slurm", gres="gpu:h100:8"))["sbatch_train.sh"]
    assert "#SBATCH --gres=gpu:h100:8" in site and "--gpus-per-node" not in site
    assert files["train_env.sh"] == "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
    # the data preprocessing step reads the tokenizer fetch brought; training reads tokenize's copy
    assert "--vocab-file '<fetch-output>/gpt2-vocab.json' --merge-file '<fetch-output>/gpt2-merges.txt'" in files["tokenize.sh"]
    assert "--vocab-file '<tokenize-output>/gpt2-vocab.json'" in files["torchrun.sh"]
    smaller = flags(pretrain_gpt_args(load_spec("gpt3-7.5b-gpu", ["model.size=1.7B"]), "/d", "/c"))
    assert (smaller["--num-layers"], smaller["--hidden-size"], smaller["--num-attention-heads"]) == ("24", "2304", "24")


def test_what_the_gpt3_launch_would_train_otherwise_is_refused_in_the_spec():
    """The launch renders GPT-3's arguments: a Llama would train as a GPT of its size, silently."""
    with pytest.raises(SpecError, match="model.family=llama: backend.kind=megatron-lm renders the GPT-3 runbooks'"):
        load_spec("gpt3-7.5b-gpu", ["model.family=llama", "model.rope_theta=500000"])
    with pytest.raises(SpecError, match="Megatron-LM loads its own checkpoints .* tools/checkpoint/convert.py"):
        load_spec("gpt3-7.5b-gpu", ["model.init_from=hf://openai-community/gpt2"])
    # a schedule the launch would not render: the preset's warm-up and decay samples under
    # iterations, or a warm-up in steps the samples would replace
    with pytest.raises(SpecError, match="lr_warmup_samples / lr_decay_samples apply to training.train_samples"):
        load_spec("gpt3-7.5b-gpu", ["training.train_samples=null", "training.train_steps=1000"])
    with pytest.raises(SpecError, match="training.warmup_steps=5000 and backend.megatron_lm.lr_warmup_samples=183105"):
        load_spec("gpt3-7.5b-gpu", ["training.warmup_steps=5000"])
    with pytest.raises(SpecError, match="only NxDT's Llama model places its stages by cuts"):
        load_spec("gpt3-7.5b-gpu", ["parallel.tp=4", "parallel.pp=2", "parallel.pipeline_cuts=[model.layers.20]"])
    # mixed precision is Megatron's --bf16 (fp32 main weights), not fp32
    assert "--bf16" in pretrain_gpt_args(load_spec("gpt3-7.5b-gpu", ["training.precision=mixed_precision"]), "/d", "/c")
    assert "--bf16" not in pretrain_gpt_args(load_spec("gpt3-7.5b-gpu", ["training.precision=fp32"]), "/d", "/c")
    # the shape the spec gives, not Megatron's default of 4 x hidden
    narrow = flags(pretrain_gpt_args(load_spec("gpt3-7.5b-gpu", ["model.ffn_hidden_size=11008"]), "/d", "/c"))
    assert narrow["--ffn-hidden-size"] == "11008"


def test_a_megatron_checkpoint_to_start_from_and_what_is_refused_before_queueing(tmp_path):
    """model.init_from reaches pretrain_gpt.py as --pretrained-checkpoint (read while the run's own
    --load has no checkpoint). The preflight refuses, before any job, a directory Megatron would
    find nothing in, naming the file it looks for, and a Hugging Face checkpoint with the fix."""
    start = tmp_path / "megatron-gpt"
    (start / "iter_0001000").mkdir(parents=True)
    (start / "latest_checkpointed_iteration.txt").write_text("1000")
    spec = load_spec("gpt3-7.5b-gpu", [f"model.init_from={start}"])
    args = flags(pretrain_gpt_args(spec, "/d", "/run/checkpoints"))
    assert args["--pretrained-checkpoint"] == str(start) and args["--load"] == "/run/checkpoints"
    assert pretrained_checkpoint_refusal(start) is None

    hf = tmp_path / "hf-gpt"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    empty = tmp_path / "empty"
    empty.mkdir()
    for directory, said in ((hf, "is a Hugging Face checkpoint (config.json), and Megatron-LM loads only its own "
                                 "format: convert it with Megatron-LM's tools/checkpoint/convert.py"),
                            (empty, "holds no Megatron-LM checkpoint (latest_checkpointed_iteration.txt is missing)")):
        refused = load_spec("gpt3-7.5b-gpu", [f"model.init_from={directory}"])
        with pytest.raises(PreflightFailed, match=re.escape(f"model.init_from={directory} {said}")) as raised:
            preflight.fn(refused, ["tokenize", "train"])
        assert raised.value.retryable is False
