"""backend.torchtitan: torchtitan's settings and flavours, and what torchtitan would refuse, or train
differently, of the rest of the spec."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from pretrain.spec.model import RopeScaling
from pretrain.spec.training import Restarts
from trainer.model_shape import check_heads_over_tp, check_kv_heads_over_tp

if TYPE_CHECKING:
    from pretrain.spec.pretrain_spec import PretrainSpec


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


def check_torchtitan(spec: PretrainSpec) -> None:
    """What torchtitan 0.3.0 would refuse, or train differently from the spec, refused here
    (ParallelDims in torchtitan/distributed/parallel_dims.py; docs/render.md)."""
    p, m, t, titan = spec.parallel, spec.model, spec.training, spec.backend.torchtitan
    # the head rules of trainer/model_shape.py, as torchtitan splits the heads over tp
    check_heads_over_tp(m.num_attention_heads, p.tp)
    check_kv_heads_over_tp(m.kv_heads, p.tp)
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
        _check_torchtitan_config(titan)
    train, valid, test = spec.data.split_weights
    if test:
        # the train task holds the validation share of the fetched files out (render.torchtitan.loader_view,
        # in the train task); a test share would be held out and read by nothing
        raise ValueError(f"data.split={spec.data.split!r}: torchtitan trains and validates, and has no test set; "
                         f"set the test weight to 0, e.g. data.split='{train:g},{valid + test:g},0'")
    if spec.dp % titan.data_parallel_replicate:
        raise ValueError(f"backend.torchtitan.data_parallel_replicate={titan.data_parallel_replicate} does not "
                         f"divide the {spec.dp} data-parallel ranks (world / (tp x pp x cp)): torchtitan needs "
                         "replicate x shard x tp x pp x cp = world size; change it or the node count")
    if spec.tokenizer.type != "hf":
        raise ValueError(f"tokenizer.type={spec.tokenizer.type}: torchtitan reads a Hugging Face tokenizer "
                         "directory (hf_assets_path); use tokenizer.type=hf")
    if spec.data.blend or spec.data.json_keys != ["text"]:
        raise ValueError("data.blend / data.json_keys: torchtitan's loader reads the fetched JSONL's 'text' "
                         "field and blends nothing; set data.json_keys=[text] and data.blend=[]")
    if not spec.tokenizer.append_eod:
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
        _check_pipeline_schedule(spec)


def _check_pipeline_schedule(spec: PretrainSpec) -> None:
    """The microbatch and stage rules torchtitan's pipeline (``_get_pipeline_metadata`` and
    ``_build_pipeline_schedule`` in torchtitan/distributed/pipeline_parallel.py) and
    torch.distributed.pipelining's schedules (torch/distributed/pipelining/schedules.py) raise
    on at the first step, on every rank."""
    p, titan, local = spec.parallel, spec.backend.torchtitan, spec.training.micro_batch_size
    schedule, size = titan.pipeline_schedule, titan.pipeline_microbatch_size
    where = f"backend.torchtitan.pipeline_schedule={schedule}, parallel.pp={p.pp}"
    if local % size:
        raise ValueError(f"training.micro_batch_size={local} is not divisible by backend.torchtitan."
                         f"pipeline_microbatch_size={size}: torchtitan splits each rank's batch into "
                         "microbatches of that size; change either")
    microbatches, stages = local // size, p.pp * titan.pipeline_stages_per_rank
    # the embedding and the output each count as one layer when the stages are cut
    # (pipeline_parallel_first/last_stage_less_layers = 1)
    if stages > spec.model.num_layers + 2:
        raise ValueError(f"{where}: {stages} stages ({titan.pipeline_stages_per_rank} a rank) for "
                         f"{spec.model.num_layers} layers leave stages empty; lower parallel.pp or use 1F1B")
    if schedule == "1F1B" and microbatches < p.pp:
        raise ValueError(f"{where}: 1F1B needs at least pp microbatches a step, and training.micro_batch_size="
                         f"{local} / pipeline_microbatch_size={size} gives {microbatches}; raise "
                         "training.micro_batch_size (and the global batch) or lower pp")
    rounds = max(1, microbatches // p.pp)
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble") and microbatches % rounds:
        raise ValueError(f"{where}: {schedule} needs the {microbatches} microbatches a step to split evenly "
                         f"into its {rounds} rounds (microbatches // pp); a multiple of pp always does: change "
                         "training.micro_batch_size or pipeline_microbatch_size")


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
