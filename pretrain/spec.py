"""PretrainSpec: the one description of a pretraining run that every stage is rendered from.

Conversion flags, NxDT YAML, Megatron-LM arguments and sbatch scripts all come from this one
object, so they cannot disagree. Validation rejects the runbooks' known traps before anything is
queued, each with a message that names the field and the fix.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pretrain.hub_refs import checked, is_hub_uri, parse_hub_uri
from trainer.model_shape import (check_attention_shape, check_converted_kv_heads, check_heads_over_tp,
                                 check_kv_heads_over_tp, check_native_float8, check_native_model,
                                 check_native_tp, check_qkv_layout)
from trainer.nxdt_layout import LayoutError, NxdtLayout
from trainer.run_layout import data_parallel_size, grad_accumulation


class Strict(BaseModel):
    """A typo'd field is an error that names it, not a silently ignored key."""

    model_config = ConfigDict(extra="forbid")


class HubDataset(Strict):
    """A dataset repository read with the ``datasets`` library, as NxD's get_dataset.py reads
    wikicorpus, and written as JSONL shards for the tokenize stage."""

    config: str | None = Field(None, description="The dataset's configuration (load_dataset's name), e.g. raw_en.")
    split: str = Field("train", description="The split to write, e.g. train.")


class DataSource(Strict):
    uri: str = Field(description="s3://bucket/key, s3://bucket/prefix/, https://..., a local path, or "
                     "hf://[datasets/]ORG/NAME[@REVISION][/PATTERNS] (the Hugging Face Hub; token from hub.token_block).")
    credentials: str | None = Field(
        None, description="s3://: name of a prefect-aws AwsCredentials block; https://: name of a Secret "
        "block holding a bearer token. None: anonymous access (public buckets such as s3://neuron-s3, "
        "public URLs). hf:// sources use hub.token_block.")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint, overriding the block's.")
    decompress: bool = Field(False, description="Unpack .xz/.gz/.zst/.bz2 files after download.")
    sha256: str | None = Field(None, description="Expected sha256 of a single-file source.")
    dataset: HubDataset | None = Field(None, description="For hf://datasets/ URIs: read the repository with "
                                       "the datasets library (config, split) and write JSONL shards; unset: "
                                       "its files as they are (a tokenized save_to_disk directory, say).")

    @model_validator(mode="after")
    def _hub_source(self) -> DataSource:
        if not is_hub_uri(self.uri):
            if self.dataset is not None:
                raise ValueError(f"dataset: is for hf://datasets/ sources; uri={self.uri!r} is not one")
            return self
        ref = parse_hub_uri(self.uri, "uri")
        if self.credentials or self.endpoint_url:
            raise ValueError(f"uri={self.uri!r}: an hf:// source takes its token from hub.token_block and its "
                             "endpoint from hub.endpoint; remove credentials/endpoint_url from the source")
        if self.dataset is not None and ref.repo_type != "dataset":
            raise ValueError(f"uri={self.uri!r} is a model repository; dataset: needs hf://datasets/ORG/NAME")
        return self


class BlendSource(Strict):
    prefix: str = Field(description="A tokenized Megatron dataset on the shared filesystem: the path "
                        "of its .bin/.idx pair without the suffix.")
    weight: float = Field(gt=0, description="Its share of the blend, relative to the other weights.")


class DataSpec(Strict):
    sources: list[DataSource] = Field(min_length=1, description="Raw data: JSONL corpora, or "
                                      "already tokenized .bin/.idx files.")
    weight: float = Field(1.0, gt=0, description="The share of this spec's own dataset in a blend.")
    blend: list[BlendSource] = Field(default_factory=list, description="Other tokenized datasets "
                                     "trained on with this one, each sampled by its weight (Megatron's blend).")
    json_keys: list[str] = Field(["text"], description="JSON keys holding the text (Megatron --json-keys); "
                                 "tokenize writes a dataset of each, and training reads the first's.")
    split: str = Field("969,30,1", description="train,valid,test weights, Megatron style.")
    tokenize_shards: int | None = Field(None, gt=0, description="Slurm array tasks for tokenize; "
                                        "default one per 256 MB of input.")

    @field_validator("split")
    @classmethod
    def _split_is_three_weights(cls, value: str) -> str:
        parts = value.split(",")
        if len(parts) != 3 or not all(p.strip().replace(".", "", 1).isdigit() for p in parts):
            raise ValueError(f"data.split={value!r}: give three non-negative weights, e.g. '969,30,1'")
        if sum(float(p) for p in parts) <= 0:
            raise ValueError(f"data.split={value!r}: the weights must not all be zero")
        return value

    @property
    def split_weights(self) -> tuple[float, float, float]:
        train, valid, test = (float(p) for p in self.split.split(","))
        return train, valid, test


class TokenizerSpec(Strict):
    type: Literal["gpt2-bpe", "hf", "sentencepiece"] = Field(
        description="gpt2-bpe: vocab.json + merges.txt (Megatron GPT2BPETokenizer); hf: a "
        "directory with tokenizer.json (e.g. Llama 3); sentencepiece: a .model file.")
    path: str | None = Field(None, description="hf directory or sentencepiece .model (path or URI).")
    vocab_file: str | None = Field(None, description="gpt2-bpe vocab.json (path or URI).")
    merges_file: str | None = Field(None, description="gpt2-bpe merges.txt (path or URI).")
    append_eod: bool = Field(True, description="Append the end-of-document token (Megatron --append-eod).")

    @field_validator("path", "vocab_file", "merges_file")
    @classmethod
    def _hub_uri(cls, value: str | None, info: ValidationInfo) -> str | None:
        return checked(value, f"tokenizer.{info.field_name}")

    @model_validator(mode="after")
    def _files_for_type(self) -> TokenizerSpec:
        if self.type == "gpt2-bpe" and not (self.vocab_file and self.merges_file):
            raise ValueError("tokenizer.vocab_file and tokenizer.merges_file are required for "
                             "tokenizer.type=gpt2-bpe")
        if self.type != "gpt2-bpe" and not self.path:
            raise ValueError(f"tokenizer.path is required for tokenizer.type={self.type}")
        return self


class RopeScaling(Strict):
    """Llama 3.1's frequency-dependent RoPE scaling."""

    rope_type: Literal["llama3"] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


# Megatron-LM paper (arXiv 2104.04473, Table 1): GPT-3 style sizes (layers, hidden, heads).
GPT_SIZES: dict[str, tuple[int, int, int]] = {
    "1.7B": (24, 2304, 24), "3.6B": (30, 3072, 32), "7.5B": (36, 4096, 32),
    "18.4B": (40, 6144, 48), "39.1B": (48, 8192, 64), "76.1B": (60, 10240, 80),
    "145.6B": (80, 12288, 96), "310.1B": (96, 16384, 128),
}


class ModelSpec(Strict):
    family: Literal["llama", "gpt"]
    size: str | None = Field(None, description=f"A GPT size from the Megatron-LM table "
                             f"({', '.join(GPT_SIZES)}); fills layers, hidden and heads.")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(None, gt=0, description="Grouped-query attention KV heads; default: heads.")
    ffn_hidden_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    rope_theta: float | None = Field(None, description="RoPE base (Llama).")
    rope_scaling: RopeScaling | None = Field(None, description="Llama 3.1 rope scaling.")
    init_from: str | None = Field(None, description="A Hugging Face checkpoint (directory with config.json "
                                  "+ safetensors, or hf://ORG/NAME[@REVISION]) to continue pre-training from; "
                                  "converted for the backend. For backend.kind=megatron-lm, a Megatron-LM "
                                  "checkpoint directory, loaded with --pretrained-checkpoint.")
    fuse_qkv: bool = Field(True, description="NxD: one fused qkv_proj.weight_qkv per rank (the 70B YAMLs' "
                           "default); false keeps weight_q/k/v. Needs qkv_linear.")
    qkv_linear: bool = Field(True, description="NxD (Llama): attention through GQAQKVColumnParallelLinear, "
                             "weights qkv_proj.weight_q/k/v (the 70B YAMLs' value); false builds plain "
                             "self_attn.q_proj/k_proj/v_proj ColumnParallelLinear layers, without KV replication "
                             "(LlamaAttention in aws-neuron/neuronx-distributed-training src/"
                             "neuronx_distributed_training/models/hf_models/modeling_llama.py). The NxDT YAML and "
                             "the converter's key layout both follow it.")

    @field_validator("init_from")
    @classmethod
    def _hub_checkpoint(cls, value: str | None) -> str | None:
        return checked(value, "model.init_from")

    @model_validator(mode="before")
    @classmethod
    def _expand_size(cls, data: dict) -> dict:
        size = data.get("size") if isinstance(data, dict) else None
        if size is None:
            return data
        if size not in GPT_SIZES:
            raise ValueError(f"model.size={size!r}: choose one of {', '.join(GPT_SIZES)}")
        layers, hidden, heads = GPT_SIZES[size]
        # The size fills the shape; a field given explicitly next to it wins, so presets can
        # still say exactly what the runbook says.
        return {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
                "ffn_hidden_size": 4 * hidden, **data}

    @model_validator(mode="after")
    def _shape(self) -> ModelSpec:
        check_attention_shape(self.hidden_size, self.num_attention_heads, self.kv_heads)
        if self.seq_length > self.max_position_embeddings:
            raise ValueError(f"model.seq_length={self.seq_length} exceeds "
                             f"model.max_position_embeddings={self.max_position_embeddings}")
        if self.family == "gpt" and (self.rope_scaling or self.rope_theta):
            raise ValueError("model.rope_theta/rope_scaling apply to family=llama only "
                             "(GPT uses learned absolute positions)")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class ParallelSpec(Strict):
    tp: int = Field(1, gt=0, description="Tensor parallel size.")
    pp: int = Field(1, gt=0, description="Pipeline parallel size.")
    cp: int = Field(1, gt=0, description="Context parallel size (ring attention).")
    zero1: bool = Field(True, description="Shard optimizer state over data parallel ranks.")
    sequence_parallel: bool = Field(False, description="Megatron/NxD sequence parallelism.")
    kv_replicator: int = Field(1, gt=0, description="KV-head replication factor (NxD kv_size_multiplier).")
    pipeline_cuts: list[str] = Field(default_factory=list, description="Explicit pipeline cut "
                                     "points, e.g. model.layers.18; empty = even split.")


class TrainingSpec(Strict):
    train_steps: int | None = Field(None, gt=0, description="Optimizer steps; exclusive with train_samples.")
    train_samples: int | None = Field(None, gt=0, description="Samples; exclusive with train_steps.")
    micro_batch_size: int = Field(1, gt=0)
    global_batch_size: int = Field(gt=0)
    lr: float = Field(gt=0)
    min_lr: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    lr_decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = Field(0.1, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, ge=0)
    checkpoint_interval: int | Literal["auto"] = Field(
        1000, description="Steps between checkpoints; auto: the interval that loses the least time to saves and "
        "failures together (Young/Daly, docs/checkpoints.md), from the save stall and step time the run measures "
        "(training.step_time_s until it has) and the cluster's failure rate, re-derived at each job's launch.")
    step_time_s: float | None = Field(None, gt=0, description="Expected seconds per optimizer step at this scale (an "
                                      "earlier run's, or the runbook's log): the checkpoint advice and the time-limit "
                                      "check use it until the run has measured its own.")
    continue_run: bool = Field(True, description="A new flow run of this spec continues its run from the newest "
                               "checkpoint, reusing every finished stage; false: each flow run trains afresh in a "
                               "directory of its own (as training.benchmark does). Another name starts another run too.")
    eval_interval: int = Field(1000, gt=0, description="Steps between validation runs.")
    eval_iters: int = Field(10, ge=0, description="Validation batches per run; 0 disables evaluation.")
    seed: int = 1234
    precision: Literal["bf16", "fp32", "mixed_precision"] = "bf16"
    benchmark: bool = Field(False, description="Fixed steps, no evaluation: the nightly benchmark mode.")
    monitor_interval_s: float = Field(5.0, gt=0, description="Seconds between the device sampler's samples "
                                      "(python -m trainer monitor, one per node beside the ranks, every backend).")

    @field_validator("checkpoint_interval")
    @classmethod
    def _positive_interval(cls, value: int | str) -> int | str:
        if value != "auto" and value <= 0:
            raise ValueError(f"training.checkpoint_interval={value}: give a positive number of steps, or auto")
        return value

    @model_validator(mode="after")
    def _steps_xor_samples(self) -> TrainingSpec:
        if self.train_steps and self.train_samples:
            raise ValueError("training.train_steps and training.train_samples are both set: keep one "
                             "(set the other to null)")
        if not (self.train_steps or self.train_samples):
            raise ValueError("set training.train_steps or training.train_samples")
        if self.min_lr > self.lr:
            raise ValueError(f"training.min_lr={self.min_lr} is above training.lr={self.lr}")
        if self.checkpoint_interval == "auto" and not self.step_time_s:
            raise ValueError("training.checkpoint_interval=auto needs training.step_time_s, the expected seconds per "
                             "step, for the first job (later jobs use the step time the run measures)")
        return self

    @property
    def steps(self) -> int:
        """Optimizer steps of the run, as every backend is launched: ``train_steps``, or
        ``train_samples`` over the global batch, rounded up."""
        return self.train_steps or -(-self.train_samples // self.global_batch_size)

    @property
    def checkpoint_steps(self) -> int:
        """The interval every backend is launched with: ``auto`` is resolved into a number of steps
        before anything is rendered (pretrain/checkpoint_interval.py)."""
        if self.checkpoint_interval == "auto":
            raise ValueError("training.checkpoint_interval=auto reached a launch unresolved: resolve it first "
                             "(pretrain.checkpoint_interval.resolved)")
        return self.checkpoint_interval

    @property
    def eval_batches(self) -> int:
        """Validation batches per evaluation as every backend is launched: none in benchmark mode."""
        return 0 if self.benchmark else self.eval_iters


# Fields renamed when a run became a chain of jobs: the old name is refused, saying the new one.
RENAMED_RESTART_FIELDS = {
    "max_restarts": ("max_attempts_without_checkpoint", "it counted every resubmission, a time limit included, so a "
                     "run of weeks gave up after a few jobs; the new field counts the jobs in a row that ended without "
                     "advancing the newest checkpoint"),
    "stop_signal_delay_s": ("save_before_limit_s", "every backend now saves before its time limit, by its own means"),
}


class Restarts(Strict):
    """How the train stage carries a run through the jobs it takes, for every backend."""

    max_attempts_without_checkpoint: int = Field(
        3, ge=0, description="The failure budget: jobs in a row that may end without advancing the run's newest "
        "checkpoint (a crash, a hang, a node failure, a job that never got to save) before the run fails, naming "
        "each job's error. A job that advanced it spends none, whatever ended it: at its time limit, preempted or "
        "requeued, the next job goes out at once and the count starts again.")
    hang_timeout_min: float = Field(10.0, gt=0, description="Cancel and resubmit a run whose metrics have "
                                    "not advanced for this long.")
    save_before_limit_s: int = Field(
        600, ge=0, description="How long before each job's time limit it saves a checkpoint and exits, by the "
        "backend's own means: Slurm's USR2 to the native trainer; Megatron-LM's --exit-duration-in-mins; NxD "
        "Training's trainer.max_time. torchtitan has none: its checkpoint.interval alone. At least one step "
        "(training.step_time_s) and a save.")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        for old, (new, why) in RENAMED_RESTART_FIELDS.items():
            if isinstance(data, dict) and old in data:
                raise ValueError(f"{old}={data[old]} is no longer read ({why}): use {new}")
        return data


# NxD Training's published examples differ by model family in what they recompute and fuse
# (examples/conf/megatron_gpt_config.yaml and hf_llama3_70B_config.yaml in
# aws-neuron/neuronx-distributed-training, docs/nxdt-upstream.md): a spec that leaves them unset
# gets its family's. Only the GPT model reads init std and dropout from the conf; NxDT's Llama
# takes them from its config.json.
NXDT_FAMILY_DEFAULTS: dict[str, dict] = {
    "gpt": {"activations_checkpoint_recompute": ["CoreAttention"],
            "fusions": {"softmax": True, "flash_attention": False}, "init_method_std": 0.021, "dropout": 0.1},
    "llama": {"activations_checkpoint_recompute": ["CoreAttention", "LlamaMLP"],
              "fusions": {"softmax": True, "flash_attention": True}},
}


class NeuronSpec(Restarts):
    """NxD Training settings; defaults are the values of NxDT's published examples
    (aws-neuron/neuronx-distributed-training examples/conf/; docs/nxdt-upstream.md)."""

    instance_type: Literal["trn1", "trn2"] = Field(description="trn1.32xlarge or trn2.48xlarge.")
    lnc: int | None = Field(None, description="Logical NeuronCore size: trn2 defaults to 2, trn1 is 1.")
    compiler_flags: str = "--model-type transformer"
    compiler_cache_url: str = Field("/home/ubuntu/neuron_cache", description="Neuron compile cache (path or s3://).")
    per_node_compile_cache: bool = Field(
        True, description="Precompile and train with one cache directory per node, <compiler_cache_url>/node-<rank>: "
        "no two nodes share lock files, the workaround for NFS, whose file locks neuron_parallel_compile cannot "
        "rely on. false shares compiler_cache_url between nodes, which then split the graphs (FSx for Lustre). "
        "An s3:// cache is always shared.")
    examples_dir: str = Field(
        "~/neuronx-distributed-training/examples", description="NxDT's examples/ directory on the compute "
        "nodes, where the tutorials clone it: the launch runs its training_orchestrator.py.")
    async_exec_max_inflight_requests: int = 5
    bucket_size_collectives: int = 1024
    neuron_rt_exec_timeout: int = 100
    neuron_experimental_compress_rg: bool = False
    sequential_move_factor: int | None = Field(None, description="trn2 only (NxDT trainer.sequential_move_factor).")
    log_every_n_steps: int = 10
    lr_constant_steps: int = Field(0, description="NxDT CosineAnnealing constant_steps: steps at min_lr after "
                                   "the decay, which so ends at trainer.max_steps minus these (NxDT sets the "
                                   "schedule's max_steps to the trainer's).")
    init_method_std: float | None = Field(None, gt=0, description="GPT only: model.init_method_std. Unset: the "
                                          "published 0.021.")
    dropout: float | None = Field(None, ge=0, lt=1, description="GPT only: model.hidden_dropout, attention_dropout "
                                  "and ffn_dropout. Unset: the published 0.1.")
    activations_checkpoint_recompute: list[str] | None = Field(
        None, description="Selective activation checkpointing: the modules recomputed. Unset: the model "
        "family's published value ([CoreAttention] for gpt, [CoreAttention, LlamaMLP] for llama).")
    fusions: dict[str, bool] | None = Field(
        None, description="model.fusions: softmax, flash_attention, ring_attention. Unset: the model family's "
        "published value (softmax only for gpt, softmax and flash_attention for llama).")
    # the types examples/training_orchestrator.py's process_config accepts; any other raises there
    precision_type: Literal["bf16SR", "fp32", "autocast", "mixed_precision", "mixed_precision_SR",
                            "manual"] = "mixed_precision"
    parallel_layers_reduce_dtype: str | None = None
    xla_downcast_bf16: str = Field("0", description="precision.xla_downcast_bf16, which NxDT exports as "
                                   "XLA_DOWNCAST_BF16 with precision_type manual.")
    save_xser: bool = True
    async_checkpointing: bool = False
    checkpoint_filename: str | None = Field(None, description="exp_manager checkpoint filename template.")
    hf_config: str | None = Field(None, description="HF config.json (NxDT model.model_config): a path on the "
                                  "cluster, or hf://ORG/NAME[@REVISION] whose config.json fetch brings to the shared disk.")

    @field_validator("hf_config")
    @classmethod
    def _hub_config(cls, value: str | None) -> str | None:
        return checked(value, "backend.neuron.hf_config")
    hang_timeout_min: float = Field(60.0, gt=0, description="Cancel and resubmit a run whose progress has not "
                                    "advanced for this long (a 70B step takes minutes, loading the graphs more).")

    @model_validator(mode="after")
    def _lnc(self) -> NeuronSpec:
        if self.lnc is None:
            self.lnc = 2 if self.instance_type == "trn2" else 1
        if self.instance_type == "trn1" and self.lnc != 1:
            raise ValueError(f"backend.neuron.lnc={self.lnc}: trn1 has no logical NeuronCores; use 1")
        if self.lnc not in (1, 2):
            raise ValueError(f"backend.neuron.lnc={self.lnc}: choose 1 or 2")
        return self


# A commit names the same tree for ever; a tag or branch can move under an unchanged spec, and
# the image stage's key (the rendered Containerfile) would not see it.
_COMMIT_HEX = 40


class ImageSpec(Strict):
    """The training image the image stage builds on a node (podman or docker) and imports to a
    squashfs for pyxis/enroot (render/image.py renders its Containerfile)."""

    base: str = Field(description="FROM: the base image, e.g. the runbooks' NGC PyTorch "
                      "nvcr.io/nvidia/pytorch:24.09-py3, or scratch.")
    megatron_lm_repository: str = Field("https://github.com/NVIDIA/Megatron-LM.git",
                                        description="Git URL Megatron-LM is cloned from.")
    megatron_lm_commit: str | None = Field(None, description="The 40-hex commit of Megatron-LM checked out at "
                                           "/workspace/Megatron-LM (core_v0.16.1 is "
                                           "55ac7082517c3878ae653c07c09c534b8aed49f6); None clones nothing "
                                           "(a base that has it already).")
    efa_installer: str | None = Field(None, description="Version of the AWS EFA installer put into the image "
                                      "(user space only: libfabric with the EFA provider, Open MPI), e.g. 1.42.0; "
                                      "None installs nothing (no EFA, or a base that has it).")
    aws_ofi_nccl: str | None = Field(None, description="Version of aws-ofi-nccl, NCCL's plugin for libfabric, built "
                                     "into the image against the EFA installer's libfabric, e.g. 1.16.0.")
    install_project: bool = Field(True, description="Install this project (its source at the running version) "
                                  "and submitit into the image: the job layer runs its Python inside the container.")
    pip: list[str] = Field(default_factory=list, description="Extra pip packages, each pinned (name==version).")
    env: dict[str, str] = Field(default_factory=dict, description="ENV of the image, e.g. NCCL/EFA settings.")
    copy_files: dict[str, str] = Field(default_factory=dict, description="Files or directories put into the image, "
                                       "'/absolute/destination': 'path on the machine the flow runs on'.")
    engine_flags: list[str] = Field(default_factory=list, description="Global flags of podman (or docker) on the "
                                    "build node, e.g. --root on its local NVMe; render/image.py "
                                    "SANDBOX_PODMAN_FLAGS lists those a machine without systemd needs.")

    @field_validator("megatron_lm_commit")
    @classmethod
    def _commit(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != _COMMIT_HEX or any(c not in "0123456789abcdef" for c in value)):
            raise ValueError(f"backend.megatron_lm.image.megatron_lm_commit={value!r}: give the full 40-hex commit "
                             "(git rev-parse core_v0.16.1^{commit}); a tag or branch can move under an unchanged key")
        return value

    @field_validator("pip")
    @classmethod
    def _pinned(cls, value: list[str]) -> list[str]:
        if loose := [req for req in value if "==" not in req and "@" not in req]:
            raise ValueError(f"backend.megatron_lm.image.pip={loose}: pin each package (name==version, or "
                             "name @ URL): an unpinned one changes the image under an unchanged key")
        return value

    @field_validator("copy_files")
    @classmethod
    def _absolute(cls, value: dict[str, str]) -> dict[str, str]:
        if relative := [dst for dst in value if not dst.startswith("/")]:
            raise ValueError(f"backend.megatron_lm.image.copy_files: destinations {relative} must be absolute "
                             "paths in the image, e.g. /opt/site/nccl.conf")
        return value

    @field_validator("efa_installer", "aws_ofi_nccl")
    @classmethod
    def _release(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not re.fullmatch(r"\d+(\.\d+)+", value):
            raise ValueError(f"backend.megatron_lm.image.{info.field_name}={value!r}: give a release number such "
                             "as 1.16.0 (the download's name is built from it)")
        return value

    @model_validator(mode="after")
    def _plugin_needs_libfabric(self) -> ImageSpec:
        if self.aws_ofi_nccl and not self.efa_installer:
            raise ValueError("backend.megatron_lm.image.aws_ofi_nccl is built against the EFA installer's "
                             "libfabric: set backend.megatron_lm.image.efa_installer too")
        return self


class MegatronLMSpec(Restarts):
    hang_timeout_min: float = Field(30.0, gt=0, description="Cancel and resubmit a run whose iteration lines "
                                    "have not advanced for this long (the first run builds the dataset's index first).")
    container_image: str | None = Field(None, description="pyxis/enroot image with Megatron-LM at "
                                        "/workspace/Megatron-LM, at the release `version` names; exclusive with image.")
    image: ImageSpec | None = Field(None, description="Build the training image (the image stage) and train in its "
                                    ".sqsh instead of naming container_image.")
    # The release the launch has run with (benchmarks/megatron_lm_gpu.py): NVIDIA/Megatron-LM tag
    # core_v0.16.1 (commit 55ac7082517c3878ae653c07c09c534b8aed49f6), the megatron-core that
    # pyproject pins. docs/render.md lists the releases whose parser the arguments were checked with.
    version: str = Field("0.16.1", description="Megatron-LM release in the image (MAJOR.MINOR.PATCH, as "
                         "megatron/core/package_info.py gives it); the arguments are rendered for it.")
    container_mounts: list[str] = Field(default_factory=list, description="'SRC:DST' mounts.")
    lr_decay_samples: int | None = Field(None, gt=0, description="--lr-decay-samples for sample-based "
                                         "training; default training.train_samples.")
    lr_warmup_samples: int | None = Field(None, ge=0, description="--lr-warmup-samples for sample-based "
                                          "training; default training.warmup_steps x global batch.")
    init_method_std: float = Field(0.02, gt=0, description="--init-method-std (Megatron's default 0.02).")
    recompute_activations: bool = Field(False, description="--recompute-activations: selective recomputation "
                                        "of the attention core.")
    extra_args: list[str] = Field(default_factory=list, description="pretrain_gpt.py arguments the spec has no "
                                  "field for, appended verbatim (e.g. --transformer-impl local where the image "
                                  "has no Transformer Engine).")

    @model_validator(mode="after")
    def _one_image(self) -> MegatronLMSpec:
        if self.image is not None and self.container_image:
            raise ValueError(f"backend.megatron_lm.container_image={self.container_image!r} and "
                             "backend.megatron_lm.image are both set: keep image (the image stage builds it) or "
                             "container_image (an image built elsewhere), not both")
        return self

    @field_validator("version")
    @classmethod
    def _release(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            raise ValueError(f"backend.megatron_lm.version={value!r}: give the release as MAJOR.MINOR.PATCH, "
                             "e.g. 0.16.1 for tag core_v0.16.1")
        return value


class NativeSpec(Restarts):
    """The project's own trainer (``python -m trainer train``): CPU, CUDA, or Trainium through
    TorchNeuron (device ``neuron``)."""

    device: Literal["auto", "cpu", "cuda", "neuron"] = Field("auto", description="auto: the node's accelerator, else cpu.")
    compile: bool = Field(False, description="torch.compile each block (inductor; neuron on Trainium); the "
                          "precompile stage warms the shared compile cache first.")
    compile_cache_dir: str | None = Field(None, description="Shared compile cache; default <paths.root>/compile-cache.")
    precompile_steps: int = Field(2, gt=0, description="Steps of the precompile warm-up run.")
    activation_checkpointing: bool = False
    float8: bool = Field(False, description="Linear layers in float8 (torchao; bf16 precision, tp 1, a GPU of "
                         "compute capability 8.9+ such as the H100).")
    async_checkpoint: bool = Field(True, description="Write checkpoints in the background.")
    checkpoint_keep: int = Field(3, gt=0, description="Complete checkpoints kept.")
    max_nan_steps_in_a_row: int = Field(10, gt=0, description="Non-finite steps in a row that abort the run.")
    save_before_limit_s: int = Field(90, ge=0, description="Ask Slurm for USR2 this long before each job's time "
                                     "limit: the trainer saves a checkpoint at the end of its step and exits.")
    export_hf: bool = Field(True, description="Export the final model as HF safetensors + config.json.")


# torchtitan 0.3.0's Llama 3 flavours (``model_registry`` in torchtitan/models/llama3/__init__.py):
# layers, hidden, heads, KV heads, vocabulary, feed-forward. The model is torchtitan's, so the spec's shape must
# be the flavour's, or the loss curve and the HF weights would belong to another model.
TORCHTITAN_FLAVOURS: dict[str, tuple[int, int, int, int, int, int]] = {
    "debugmodel": (6, 256, 16, 16, 2048, 768), "1B": (16, 2048, 32, 8, 128256, 8192),
    "3B": (28, 3072, 24, 8, 128256, 8192), "8B": (32, 4096, 32, 8, 128256, 14336),
    "70B": (80, 8192, 64, 8, 128256, 28672)}
# Every flavour's RoPE: base 500,000 with Llama 3.1's scaling at its published factors (RopeScaling's
# defaults), whatever the checkpoint it starts from says.
TORCHTITAN_ROPE_THETA = 500000.0


def flavour_overrides(flavour: str) -> list[str]:
    """The spec overrides that make a torchtitan preset train ``flavour``: the flavour and its shape."""
    layers, hidden, heads, kv_heads, vocab, ffn = TORCHTITAN_FLAVOURS[flavour]
    return [f"backend.torchtitan.flavour={flavour}", f"model.num_layers={layers}", f"model.hidden_size={hidden}",
            f"model.num_attention_heads={heads}", f"model.num_kv_heads={kv_heads}", f"model.vocab_size={vocab}",
            f"model.ffn_hidden_size={ffn}"]


# The config functions torchtitan 0.3.0 publishes for them (torchtitan/models/llama3/config_registry.py);
# the others the spec may name are this project's, built on torchtitan's (trainer/torchtitan_configs.py).
TORCHTITAN_PUBLISHED = ("llama3_debugmodel", "llama3_debugmodel_float8", "llama3_8b", "llama3_70b")
TORCHTITAN_OWN_CONFIGS = "trainer.torchtitan_configs"
# The schedules torchtitan hands to torch.distributed.pipelining's get_schedule_class.
PIPELINE_SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble")


class TorchtitanSpec(Restarts):
    """torchtitan's trainer (``python -m torchtitan.train``), a config function of its registry
    with the spec's values as ``--section.key`` overrides (render/torchtitan.py)."""

    device: Literal["cuda", "neuron"] = Field("cuda", description="cuda: NVIDIA GPUs; neuron: Trainium through "
                                              "TorchNeuron (AWS's torchtitan-neuron fork), one rank per NeuronCore.")
    flavour: Literal["debugmodel", "1B", "3B", "8B", "70B"] = Field(
        description="torchtitan's Llama 3 model flavour; model.* must have its shape.")
    module: str = Field("llama3", description="--module: torchtitan's model module (torchtitan-neuron's is "
                        "torchtitan_neuron.models.llama3).")
    config: str | None = Field(None, description="--config: the registry function; default llama3_<flavour>, "
                               "with _float8 under float8 (torchtitan's, or this project's where torchtitan "
                               "publishes none: trainer/torchtitan_configs.py).")
    float8: bool = Field(False, description="The decoder's Linear layers in float8 (torchao's rowwise recipe, "
                         "torchtitan's Float8LinearConverter): NVIDIA GPUs of compute capability 8.9 or later, "
                         "torchao on the nodes.")
    data_parallel_replicate: int = Field(1, gt=0, description="HSDP replicas; the data-parallel ranks are "
                                         "sharded within each (data_parallel_shard_degree = dp / this).")
    pipeline_schedule: str = Field("1F1B", description=f"With parallel.pp > 1: one of {', '.join(PIPELINE_SCHEDULES)}.")
    pipeline_microbatch_size: int = Field(1, gt=0, description="parallelism.pipeline_parallel_microbatch_size: "
                                          "each rank's training.micro_batch_size runs through the pipeline in "
                                          "microbatches of this many sequences.")
    activation_checkpointing: Literal["none", "selective", "full"] = "selective"
    compile: bool = Field(False, description="torch.compile the model (inductor; the neuron backend on Trainium).")
    async_checkpoint: Literal["disabled", "async", "async_with_pinned_mem"] = Field(
        "async", description="checkpoint.async_mode: DCP saves in the background.")
    checkpoint_keep: int = Field(3, ge=0, description="checkpoint.keep_latest_k; 0 keeps all, and torchtitan "
                                 "refuses 1 (the newest may be mid-save).")
    log_freq: int = Field(10, gt=0, description="metrics.log_freq: steps between step lines.")

    @field_validator("checkpoint_keep")
    @classmethod
    def _two_replicas(cls, value: int) -> int:
        if value == 1:
            raise ValueError("backend.torchtitan.checkpoint_keep=1: torchtitan keeps at least 2 (the newest may "
                             "still be saving); use 2 or more, or 0 for all")
        return value

    @field_validator("pipeline_schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        if value not in PIPELINE_SCHEDULES:
            raise ValueError(f"backend.torchtitan.pipeline_schedule={value!r}: choose one of "
                             f"{', '.join(PIPELINE_SCHEDULES)}")
        return value

    @property
    def registry(self) -> tuple[str, str]:
        """``--module`` and ``--config``: the spec's, else the flavour's function, torchtitan's
        where it publishes one."""
        if self.config:
            return self.module, self.config
        function = f"llama3_{self.flavour.lower()}" + ("_float8" if self.float8 else "")
        if self.module == "llama3" and function not in TORCHTITAN_PUBLISHED:
            return TORCHTITAN_OWN_CONFIGS, function
        return self.module, function

    @property
    def pipeline_stages_per_rank(self) -> int:
        """Stages each pipeline rank holds: two under the looped schedules, one under 1F1B and
        GPipe (``_get_pipeline_metadata`` in torchtitan/distributed/pipeline_parallel.py)."""
        return 1 if self.pipeline_schedule in ("1F1B", "GPipe") else 2


class BackendSpec(Strict):
    kind: Literal["native", "neuron", "megatron-lm", "torchtitan"] = "native"
    native: NativeSpec = NativeSpec()
    neuron: NeuronSpec | None = None
    megatron_lm: MegatronLMSpec | None = None
    torchtitan: TorchtitanSpec | None = None

    @property
    def cuda(self) -> bool:
        """Whether the training's ranks run on NVIDIA GPUs: its jobs ask Slurm for them, since on a
        cluster that schedules GPUs a job sees none it did not ask for."""
        return (self.kind == "megatron-lm" or (self.kind == "native" and self.native.device == "cuda")
                or (self.kind == "torchtitan" and self.torchtitan.device == "cuda"))

    @property
    def trainium(self) -> bool:
        """Whether the training's ranks run on Trainium NeuronCores (NxDT, or the native trainer or
        torchtitan on device neuron)."""
        return (self.kind == "neuron" or (self.kind == "native" and self.native.device == "neuron")
                or (self.kind == "torchtitan" and self.torchtitan.device == "neuron"))

    @model_validator(mode="after")
    def _settings_for_kind(self) -> BackendSpec:
        if self.kind == "neuron" and self.neuron is None:
            raise ValueError("backend.neuron is required for backend.kind=neuron "
                             "(at least backend.neuron.instance_type: trn1 or trn2)")
        return self


class ClusterSpec(Strict):
    block: str | None = Field(None, description="Name of a SlurmCluster block with the site's settings, or "
                              "kubernetes-cluster/NAME: a KubernetesCluster block, and the stages run on Kubernetes.")
    executor: Literal["auto", "slurm", "local"] = Field(
        "auto", description="Overrides the block: slurm, local processes, or auto-detect.")
    nodes: int = Field(1, gt=0)
    min_nodes: int | None = Field(None, gt=0, description="The fewest nodes training may go on with after losing "
                                  "some: a resubmission asks for as many of cluster.nodes as the partition still "
                                  "has healthy (not down, drained or left out after a node failure), down to this "
                                  "many, and resumes there with fewer data-parallel ranks (the global batch stays, "
                                  "gradient accumulation grows). Unset: cluster.nodes, and a resubmission waits for "
                                  "that many. backend.kind=native. On a KubernetesCluster block: the PyTorchJob's "
                                  "elasticPolicy, between this many and cluster.nodes pods.")
    devices_per_node: int = Field(1, gt=0, description="Ranks per node: GPUs, (logical) NeuronCores, "
                                  "or CPU processes.")
    cpus_per_task: int | None = Field(None, gt=0)
    mem_gb: float | None = Field(None, gt=0)
    time_limit_min: int = Field(gt=0, description="Slurm time limit of each training job, in minutes: a run longer "
                                "than that is a chain of jobs, each resuming from the newest checkpoint.")
    startup_min: float = Field(5.0, gt=0, description="Minutes from a training job's start to its first step "
                               "(container, rendezvous, checkpoint load): what each job of the chain loses.")

    @model_validator(mode="after")
    def _min_nodes_up_to_nodes(self) -> ClusterSpec:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"cluster.min_nodes={self.min_nodes} is above cluster.nodes={self.nodes}: a run shrinks, "
                             "it never grows; lower cluster.min_nodes or unset it")
        return self

    @property
    def fewest_nodes(self) -> int:
        return self.min_nodes or self.nodes

    def nodes_with(self, healthy: int) -> int:
        """The nodes a resubmission asks for when the partition has ``healthy`` nodes it may use:
        all of cluster.nodes if it has them, else as many as it has, but never fewer than
        cluster.min_nodes (the job then waits for a node to come back)."""
        return max(self.fewest_nodes, min(self.nodes, healthy))


class HubSpec(Strict):
    """Access to the Hugging Face Hub for every hf:// URI of the spec."""

    token_block: str | None = Field(None, description="Name of a Prefect Secret block holding a Hugging Face "
                                    "token: gated (meta-llama) and private repositories need one. None: anonymous.")
    endpoint: str | None = Field(None, description="The Hub's URL; None: huggingface_hub's (HF_ENDPOINT, else "
                                 "https://huggingface.co).")
    cache_dir: str | None = Field(None, description="huggingface_hub's cache, where downloads land before they are "
                                  "linked into stage outputs; None: <paths.root>/hub-cache. With HF_HUB_OFFLINE=1 "
                                  "only this cache is read.")


def _default_root() -> str:
    return os.environ.get("PRETRAIN_ROOT", "~/.pretrain/data")


class PathsSpec(Strict):
    # validate_default: the default goes through _expand too, so no path ever keeps a literal "~"
    root: str = Field(default_factory=_default_root, validate_default=True, description="Shared-filesystem root for every "
                      "stage's content-addressed output (default $PRETRAIN_ROOT or ~/.pretrain/data).")

    @field_validator("root")
    @classmethod
    def _expand(cls, value: str) -> str:
        return os.path.expanduser(os.path.expandvars(value))


class PretrainSpec(Strict):
    name: str = Field(description="Run name; artifact keys and output names derive from it.")
    description: str = ""
    data: DataSpec
    tokenizer: TokenizerSpec
    model: ModelSpec
    parallel: ParallelSpec = ParallelSpec()
    training: TrainingSpec
    cluster: ClusterSpec
    backend: BackendSpec = BackendSpec()
    hub: HubSpec = HubSpec()
    paths: PathsSpec = Field(default_factory=PathsSpec)

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.devices_per_node

    @property
    def dp(self) -> int:
        """Data-parallel ranks, by the trainer's own arithmetic (trainer/run_layout.py)."""
        return self.dp_on(self.cluster.nodes, "cluster.nodes")

    def dp_on(self, nodes: int, counted: str) -> int:
        """Data-parallel ranks on ``nodes`` nodes; ``counted``: where that count comes from, for the message."""
        c, p = self.cluster, self.parallel
        return data_parallel_size(nodes * c.devices_per_node, p.tp, p.pp, p.cp,
                                  world=f"{counted} x cluster.devices_per_node = {nodes} x {c.devices_per_node} = ")

    @property
    def grad_accumulation(self) -> int:
        return self.grad_accumulation_on(self.cluster.nodes, "cluster.nodes")

    def grad_accumulation_on(self, nodes: int, counted: str) -> int:
        """Micro-batches per step on ``nodes`` nodes (``counted``: as for :meth:`dp_on`)."""
        t = self.training
        return grad_accumulation(t.global_batch_size, t.micro_batch_size, self.dp_on(nodes, counted),
                                 section="training.")

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.model.seq_length

    @model_validator(mode="after")
    def _runbook_traps(self) -> PretrainSpec:
        p, m, t = self.parallel, self.model, self.training
        self._check_heads()
        if self.backend.kind == "neuron":
            self._check_nxdt()
        if self.backend.kind == "torchtitan":
            self._check_torchtitan()
        if self.backend.kind == "megatron-lm":
            self._check_megatron_lm()
        if self.backend.kind == "native":
            # FSDP2 over the data-parallel ranks and DTensor tp are the native trainer's parallelism;
            # the rest is NxDT's and Megatron-LM's, and a native run would silently ignore it.
            if unsupported := [f"parallel.{name}={value}" for name, value, default in (
                    ("pp", p.pp, 1), ("cp", p.cp, 1), ("sequence_parallel", p.sequence_parallel, False),
                    ("kv_replicator", p.kv_replicator, 1), ("pipeline_cuts", p.pipeline_cuts, []))
                    if value != default]:
                raise ValueError(f"{', '.join(unsupported)}: backend.kind=native trains with data parallel "
                                 "(FSDP2) and parallel.tp only; reset them, or use backend.kind=neuron or megatron-lm")
        # dp = world / (tp x pp x cp) and global batch = micro batch x dp x accumulation, each
        # asked of the rule the trainer runs by; either raises naming its fields
        self.grad_accumulation  # noqa: B018
        self._check_shrinking()
        self._check_time_limit()
        # NxD's automatic partition puts the remainder on the last stages, as the converter does
        # (``create_partitions`` in aws-neuron/neuronx-distributed
        # src/neuronx_distributed/pipeline/partition.py). Megatron-LM needs equal stages and reads
        # no pipeline_cuts.
        # torchtitan cuts its own stages (_check_pipeline_schedule).
        if self.backend.kind in ("native", "megatron-lm") and m.num_layers % p.pp:
            raise ValueError(f"model.num_layers={m.num_layers} is not divisible by parallel.pp={p.pp}: "
                             "change pp (uneven stages are for backend.kind=neuron and torchtitan)")
        if p.pipeline_cuts and (self.backend.kind == "megatron-lm" or m.family == "gpt"):
            raise ValueError(f"parallel.pipeline_cuts={p.pipeline_cuts}: only NxDT's Llama model places its stages "
                             "by cuts; Megatron-LM and NxDT's GPT split the layers evenly over parallel.pp: set "
                             "parallel.pipeline_cuts=[]")
        if p.pipeline_cuts and len(p.pipeline_cuts) != p.pp - 1:
            raise ValueError(f"parallel.pipeline_cuts has {len(p.pipeline_cuts)} cuts; parallel.pp="
                             f"{p.pp} needs {p.pp - 1}")
        try:
            NxdtLayout.cut_indices(p.pipeline_cuts, m.num_layers)
        except LayoutError as exc:
            raise ValueError(f"parallel.pipeline_cuts: {exc}") from None
        if p.cp > 1 and m.seq_length % (2 * p.cp):
            raise ValueError(f"model.seq_length={m.seq_length} must be divisible by 2 x parallel.cp="
                             f"{2 * p.cp} (ring attention splits each sequence into 2 x cp chunks)")
        _, valid, _ = self.data.split_weights
        if t.eval_batches > 0 and valid == 0:
            raise ValueError(f"training.eval_iters={t.eval_iters} with data.split={self.data.split!r} "
                             "has no validation data (Megatron fails with an AssertionError, torchtitan has no "
                             "held-out files to read): set "
                             "training.eval_iters=0 or give the split a validation weight")
        return self

    @property
    def restarts(self) -> Restarts:
        """The chain-of-jobs settings of the spec's backend."""
        return getattr(self.backend, self.backend.kind.replace("-", "_")) or MegatronLMSpec()

    def _check_time_limit(self) -> None:
        """Each job of the chain must get past one checkpoint, or no job ever advances the run: its
        start-up, one checkpoint interval of steps where the step time is known, and the save
        before the limit must fit in the time limit."""
        c, t, lead = self.cluster, self.training, self.restarts.save_before_limit_s
        parts = [(f"cluster.startup_min={c.startup_min:g}", c.startup_min * 60),
                 (f"backend.{self.backend.kind.replace('-', '_')}.save_before_limit_s={lead}", lead)]
        if t.step_time_s and t.checkpoint_interval != "auto":
            parts.append((f"training.checkpoint_interval={t.checkpoint_interval} x training.step_time_s="
                          f"{t.step_time_s:g}", t.checkpoint_interval * t.step_time_s))
        needed = sum(seconds for _, seconds in parts)
        if c.time_limit_min * 60 < needed:
            raise ValueError(f"cluster.time_limit_min={c.time_limit_min} is shorter than one job needs to advance the "
                             f"run: {' + '.join(name for name, _ in parts)} = {needed / 60:.1f} min; raise the time "
                             "limit, or lower the checkpoint interval")

    def _check_shrinking(self) -> None:
        """A run that may go on with fewer nodes (cluster.min_nodes) must lay out, by the trainer's
        rules, on every count down to it, and its backend must resume on fewer ranks."""
        c = self.cluster
        if c.fewest_nodes == c.nodes:
            return
        if self.backend.kind != "native":
            raise ValueError(f"cluster.min_nodes={c.min_nodes} is below cluster.nodes={c.nodes}: only "
                             "backend.kind=native resumes a run on fewer nodes (its checkpoints reshard to any "
                             f"data-parallel size); unset cluster.min_nodes for backend.kind={self.backend.kind}")
        for nodes in range(c.fewest_nodes, c.nodes):
            allowed = f"{nodes} node(s), which cluster.min_nodes={c.min_nodes} allows"
            try:
                self.grad_accumulation_on(nodes, "nodes")
            except ValueError as exc:
                raise ValueError(f"on {allowed}: {exc}; or raise cluster.min_nodes") from None

    def _check_nxdt(self) -> None:
        """Fill the family's published defaults, then refuse what NxD Training's own code refuses
        or never reads (aws-neuron/neuronx-distributed-training; docs/nxdt-upstream.md)."""
        p, m, t, neuron = self.parallel, self.model, self.training, self.backend.neuron
        for name, value in NXDT_FAMILY_DEFAULTS[m.family].items():
            if getattr(neuron, name) is None:
                setattr(neuron, name, copy.deepcopy(value))
        if (t.precision == "fp32") != (neuron.precision_type == "fp32"):
            raise ValueError(f"training.precision={t.precision} and backend.neuron.precision_type="
                             f"{neuron.precision_type} disagree, and NxDT reads only precision_type: set both to "
                             "fp32, or neither")
        if self.data.blend and m.family == "llama":
            raise ValueError("data.blend: NxDT's Llama configs read one HF Arrow dataset (data.train_dir) and "
                             "cannot blend; blend with backend.kind=native or megatron-lm, or a GPT config")
        if m.family == "llama" and (set_gpt_only := [f"backend.neuron.{name}" for name in ("init_method_std", "dropout")
                                                      if getattr(neuron, name) is not None]):
            # the Llama examples set neither: NxDT builds its Llama from model_config, the config.json
            raise ValueError(f"{', '.join(set_gpt_only)}: NxDT's Llama model takes its init std and dropout from "
                             "the config.json (backend.neuron.hf_config), not the conf; unset them")
        if m.family == "llama" and "flash_attention" not in neuron.fusions:
            # HFLLamaModule reads model.fusions.flash_attention without a default
            raise ValueError(f"backend.neuron.fusions={neuron.fusions}: NxDT's Llama model reads "
                             "fusions.flash_attention; set it to true or false")
        if m.family == "llama" and t.eval_batches > 0:
            # HFDataModule.val_dataloader opens data.val_dir, which no stage writes
            raise ValueError(f"training.eval_iters={t.eval_iters}: NxDT's Llama configs validate on a separate "
                             "HF Arrow dataset that the tokenize stage does not write; set training.eval_iters=0")
        if m.family == "gpt" and p.cp > 1:
            # ring attention is in NxDT's Llama model only (lightning_modules/model/hf_models/llama_model.py)
            raise ValueError(f"parallel.cp={p.cp}: NxDT's Megatron GPT model has no context parallelism; "
                             "set parallel.cp=1")
        if m.family == "gpt" and not p.zero1:
            # MegatronBaseModel._validate_and_override_config raises on it
            raise ValueError("parallel.zero1=false: NxDT's Megatron GPT model refuses to train without ZeRO-1; "
                             "set parallel.zero1=true")
        if t.lr_decay_style != "cosine":
            raise ValueError(f"training.lr_decay_style={t.lr_decay_style}: NxDT's published configs schedule "
                             "with CosineAnnealing, the one rendered for backend.kind=neuron; use cosine")
        if p.cp > 1 and not neuron.fusions.get("ring_attention"):
            raise ValueError(f"parallel.cp={p.cp} needs ring attention on NxD: set "
                             "backend.neuron.fusions.ring_attention=true (and flash_attention=false)")

    def _check_torchtitan(self) -> None:
        """What torchtitan 0.3.0 would refuse, or train differently from the spec, refused here
        (ParallelDims in torchtitan/distributed/parallel_dims.py; docs/render.md)."""
        p, m, t, titan = self.parallel, self.model, self.training, self.backend.torchtitan
        # torchtitan builds the model from the flavour alone: a model.* field that differs would be
        # shown, and checked against, while another model trains
        layers, hidden, heads, kv_heads, vocab, ffn = TORCHTITAN_FLAVOURS[titan.flavour]
        given = (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, m.vocab_size, m.ffn_hidden_size)
        if m.family != "llama" or given != (layers, hidden, heads, kv_heads, vocab, ffn):
            raise ValueError(f"model: backend.torchtitan.flavour={titan.flavour} is a Llama 3 of {layers} layers, "
                             f"hidden {hidden}, {heads} heads, {kv_heads} KV heads, vocabulary {vocab}, feed-forward "
                             f"{ffn}; the spec has family={m.family}, {given}: set model.* to the flavour's shape or "
                             "change the flavour")
        if m.rope_theta != TORCHTITAN_ROPE_THETA or m.rope_scaling != RopeScaling():
            raise ValueError(f"model.rope_theta={m.rope_theta}, model.rope_scaling={m.rope_scaling}: every torchtitan "
                             f"Llama 3 flavour has RoPE base {TORCHTITAN_ROPE_THETA:.0f} with Llama 3.1's scaling; set "
                             f"model.rope_theta={TORCHTITAN_ROPE_THETA:.0f} and model.rope_scaling={{rope_type: llama3}}")
        if titan.config:
            self._check_torchtitan_config(titan)
        train, valid, test = self.data.split_weights
        if test:
            # the train task holds the validation share of the fetched files out (loader_view in
            # tasks/train_torchtitan.py); a test share would be held out and read by nothing
            raise ValueError(f"data.split={self.data.split!r}: torchtitan trains and validates, and has no test set; "
                             f"set the test weight to 0, e.g. data.split='{train:g},{valid + test:g},0'")
        if self.dp % titan.data_parallel_replicate:
            raise ValueError(f"backend.torchtitan.data_parallel_replicate={titan.data_parallel_replicate} does not "
                             f"divide the {self.dp} data-parallel ranks (world / (tp x pp x cp)): torchtitan needs "
                             "replicate x shard x tp x pp x cp = world size; change it or the node count")
        if self.tokenizer.type != "hf":
            raise ValueError(f"tokenizer.type={self.tokenizer.type}: torchtitan reads a Hugging Face tokenizer "
                             "directory (hf_assets_path); use tokenizer.type=hf")
        if self.data.blend or self.data.json_keys != ["text"]:
            raise ValueError("data.blend / data.json_keys: torchtitan's loader reads the fetched JSONL's 'text' "
                             "field and blends nothing; set data.json_keys=[text] and data.blend=[]")
        if not self.tokenizer.append_eod:
            raise ValueError("tokenizer.append_eod=false: torchtitan's loader ends every document with the "
                             "tokenizer's end-of-text token; leave it true")
        if p.sequence_parallel or p.pipeline_cuts:
            raise ValueError("parallel.sequence_parallel / parallel.pipeline_cuts: torchtitan shards sequences "
                             "with tp itself and splits stages evenly; reset them")
        if t.lr_decay_style == "constant":
            raise ValueError("training.lr_decay_style=constant: torchtitan decays linear, sqrt or cosine; pick one")
        if titan.device == "neuron" and titan.async_checkpoint == "async_with_pinned_mem":
            raise ValueError("backend.torchtitan.async_checkpoint=async_with_pinned_mem pins CUDA host memory; "
                             "use async on device=neuron")
        if titan.float8 and (titan.device == "neuron" or titan.module != "llama3"):
            raise ValueError("backend.torchtitan.float8 needs device=cuda and torchtitan's own llama3 module: "
                             "torchtitan's float8 runs torchao's kernels on NVIDIA GPUs of compute capability 8.9 "
                             "or later; set float8=false")
        if p.pp > 1:
            self._check_pipeline_schedule()

    def _check_pipeline_schedule(self) -> None:
        """The microbatch and stage rules torchtitan's pipeline (``_get_pipeline_metadata`` and
        ``_build_pipeline_schedule`` in torchtitan/distributed/pipeline_parallel.py) and
        torch.distributed.pipelining's schedules (torch/distributed/pipelining/schedules.py) raise
        on at the first step, on every rank."""
        p, titan, local = self.parallel, self.backend.torchtitan, self.training.micro_batch_size
        schedule, size = titan.pipeline_schedule, titan.pipeline_microbatch_size
        where = f"backend.torchtitan.pipeline_schedule={schedule}, parallel.pp={p.pp}"
        if local % size:
            raise ValueError(f"training.micro_batch_size={local} is not divisible by backend.torchtitan."
                             f"pipeline_microbatch_size={size}: torchtitan splits each rank's batch into "
                             "microbatches of that size; change either")
        microbatches, stages = local // size, p.pp * titan.pipeline_stages_per_rank
        # the embedding and the output each count as one layer when the stages are cut
        # (pipeline_parallel_first/last_stage_less_layers = 1)
        if stages > self.model.num_layers + 2:
            raise ValueError(f"{where}: {stages} stages ({titan.pipeline_stages_per_rank} a rank) for "
                             f"{self.model.num_layers} layers leave stages empty; lower parallel.pp or use 1F1B")
        if schedule == "1F1B" and microbatches < p.pp:
            raise ValueError(f"{where}: 1F1B needs at least pp microbatches a step, and training.micro_batch_size="
                             f"{local} / pipeline_microbatch_size={size} gives {microbatches}; raise "
                             "training.micro_batch_size (and the global batch) or lower pp")
        rounds = max(1, microbatches // p.pp)
        if schedule in ("Interleaved1F1B", "InterleavedZeroBubble") and microbatches % rounds:
            raise ValueError(f"{where}: {schedule} needs the {microbatches} microbatches a step to split evenly "
                             f"into its {rounds} rounds (microbatches // pp); a multiple of pp always does: change "
                             "training.micro_batch_size or pipeline_microbatch_size")

    def _check_megatron_lm(self) -> None:
        """What the Megatron-LM launch (render/megatron_lm.py) would otherwise train differently
        from what the spec says, silently."""
        m = self.model
        if m.family != "gpt":
            raise ValueError(f"model.family={m.family}: backend.kind=megatron-lm renders the GPT-3 runbooks' "
                             "pretrain_gpt.py arguments (learned positions, LayerNorm, GeLU), which would train a "
                             "GPT under that name; train a Llama with backend.kind=torchtitan or native")
        t, mlm = self.training, self.backend.megatron_lm or MegatronLMSpec()
        if t.train_steps and (mlm.lr_warmup_samples is not None or mlm.lr_decay_samples is not None):
            raise ValueError("backend.megatron_lm.lr_warmup_samples / lr_decay_samples apply to training.train_samples; "
                             "with training.train_steps the schedule is training.warmup_steps and train_steps: set "
                             "them to null")
        if mlm.lr_warmup_samples is not None and t.warmup_steps:
            raise ValueError(f"training.warmup_steps={t.warmup_steps} and backend.megatron_lm.lr_warmup_samples="
                             f"{mlm.lr_warmup_samples} are both set, and Megatron-LM reads the samples: keep one "
                             "(set the other to 0 or null)")
        if is_hub_uri(m.init_from):
            raise ValueError(f"model.init_from={m.init_from!r}: Megatron-LM loads its own checkpoints "
                             "(latest_checkpointed_iteration.txt and iter_*/), not a Hugging Face one; convert it "
                             "with Megatron-LM's tools/checkpoint/convert.py and give the converted directory")

    @staticmethod
    def _check_torchtitan_config(titan: TorchtitanSpec) -> None:
        """A config function named by hand decides the model and float8 itself: refuse a flavour or
        float8 it contradicts, where its name says (``llama3_<flavour>[_float8]``, as torchtitan and
        trainer/torchtitan_configs.py name theirs)."""
        named = re.fullmatch(r"llama3_([0-9a-z]+?)(_float8)?", titan.config)
        if titan.float8 and not (named and named.group(2)):
            raise ValueError(f"backend.torchtitan.config={titan.config!r} with float8=true: the config function "
                             "decides the converters, and this one's name has no _float8; leave config unset (the "
                             "flavour's float8 function is chosen) or name a float8 one")
        if named and named.group(1) != titan.flavour.lower():
            raise ValueError(f"backend.torchtitan.config={titan.config!r} trains a {named.group(1)} model, not "
                             f"flavour={titan.flavour}; leave config unset or make them agree")

    def _check_heads(self) -> None:
        """The head rules of trainer/model_shape.py, as the backend's trainer or converter asks them."""
        p, m, kind = self.parallel, self.model, self.backend.kind
        if kind != "neuron" and p.kv_replicator != 1:
            raise ValueError(f"parallel.kv_replicator is an NxD setting; set it to 1 for backend.kind={kind}")
        if kind == "native":
            check_native_model(m.family, m.num_attention_heads, m.kv_heads)
            check_native_tp(m.family, m.num_attention_heads, m.kv_heads, p.tp)
            check_native_float8(self.backend.native.float8, m.family, self.training.precision, p.tp)
            return
        if kind == "neuron" and m.family == "llama":  # NxDT's GPT is Megatron's model: no qkv_linear
            check_qkv_layout(m.qkv_linear, m.fuse_qkv, p.kv_replicator)
        elif p.kv_replicator != 1:
            raise ValueError(f"parallel.kv_replicator={p.kv_replicator}: NxDT replicates KV heads in its Llama "
                             "attention only (kv_size_multiplier); set it to 1 for family=gpt")
        check_heads_over_tp(m.num_attention_heads, p.tp)
        if kind == "neuron":
            check_kv_heads_over_tp(m.kv_heads, p.tp, p.kv_replicator)
            if m.init_from:
                check_converted_kv_heads(m.kv_heads, p.tp, p.kv_replicator)
        else:
            check_kv_heads_over_tp(m.kv_heads, p.tp)
