"""backend.neuron: NxD Training's settings, and what NxDT refuses or never reads of the rest of the spec."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from pretrain.hub_refs import checked
from pretrain.spec.training import Restarts
from trainer.model_shape import check_converted_kv_heads, check_heads_over_tp, check_kv_heads_over_tp, check_qkv_layout

if TYPE_CHECKING:
    from pretrain.spec.pretrain_spec import PretrainSpec


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


def check_nxdt(spec: PretrainSpec) -> None:
    """Ask the head rules of trainer/model_shape.py as NxDT's model and the converter ask them, fill
    the family's published defaults, then refuse what NxD Training's own code refuses or never reads
    (aws-neuron/neuronx-distributed-training; docs/nxdt-upstream.md)."""
    p, m, t, neuron = spec.parallel, spec.model, spec.training, spec.backend.neuron
    if m.family == "llama":  # NxDT's GPT is Megatron's model: no qkv_linear
        check_qkv_layout(m.qkv_linear, m.fuse_qkv, p.kv_replicator)
    elif p.kv_replicator != 1:
        raise ValueError(f"parallel.kv_replicator={p.kv_replicator}: NxDT replicates KV heads in its Llama "
                         "attention only (kv_size_multiplier); set it to 1 for family=gpt")
    check_heads_over_tp(m.num_attention_heads, p.tp)
    check_kv_heads_over_tp(m.kv_heads, p.tp, p.kv_replicator)
    if m.init_from:
        check_converted_kv_heads(m.kv_heads, p.tp, p.kv_replicator)
    for name, value in NXDT_FAMILY_DEFAULTS[m.family].items():
        if getattr(neuron, name) is None:
            setattr(neuron, name, copy.deepcopy(value))
    if (t.precision == "fp32") != (neuron.precision_type == "fp32"):
        raise ValueError(f"training.precision={t.precision} and backend.neuron.precision_type="
                         f"{neuron.precision_type} disagree, and NxDT reads only precision_type: set both to "
                         "fp32, or neither")
    if spec.data.blend and m.family == "llama":
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
