"""backend.native: the project's own trainer's settings, and what it refuses of the rest of the spec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from pretrain.spec.training import Restarts
from trainer.model_shape import check_native_float8, check_native_model, check_native_tp

if TYPE_CHECKING:
    from pretrain.spec.pretrain_spec import PretrainSpec


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


def check_native(spec: PretrainSpec) -> None:
    """The head rules of trainer/model_shape.py as the native trainer asks them, then its parallelism."""
    p, m = spec.parallel, spec.model
    check_native_model(m.family, m.num_attention_heads, m.kv_heads)
    check_native_tp(m.family, m.num_attention_heads, m.kv_heads, p.tp)
    check_native_float8(spec.backend.native.float8, m.family, spec.training.precision, p.tp)
    # FSDP2 over the data-parallel ranks and DTensor tp are the native trainer's parallelism;
    # the rest is NxDT's and Megatron-LM's, and a native run would silently ignore it.
    if unsupported := [f"parallel.{name}={value}" for name, value, default in (
            ("pp", p.pp, 1), ("cp", p.cp, 1), ("sequence_parallel", p.sequence_parallel, False),
            ("kv_replicator", p.kv_replicator, 1), ("pipeline_cuts", p.pipeline_cuts, []))
            if value != default]:
        raise ValueError(f"{', '.join(unsupported)}: backend.kind=native trains with data parallel "
                         "(FSDP2) and parallel.tp only; reset them, or use backend.kind=neuron or megatron-lm")
