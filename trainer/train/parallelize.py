"""Parallelism applied to a built model by functions, in a fixed order: tensor parallel,
float8, activation checkpointing, compile, then FSDP2. The model classes stay stock Hugging Face.
The model is on the meta device here, as in torchtitan: model.materialize gives it its values
once it is split."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainer.run_layout import data_parallel_size
from trainer.train import device as devices
from trainer.train.config import TrainConfig
from trainer.train.model import decoder_blocks


def build_mesh(device: torch.device, world_size: int, tp: int) -> DeviceMesh:
    dp = data_parallel_size(world_size, tp, world="of this run ")
    return init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))


def apply_tp(model: torch.nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron's layout: Q/K/V and the MLP's first matrices split by output (column), the
    attention output and the MLP's last matrix by input (row), one all-reduce each. Each rank
    keeps whole heads, and HF's attention reshapes with -1 heads, so it runs unchanged. Llama only:
    the config refused anything else at start-up (trainer.model_shape.check_native_tp)."""
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for block in decoder_blocks(model):
        parallelize_module(block, tp_mesh, plan)


def float8_eligible(module: torch.nn.Module, fqn: str) -> bool:
    """Linear layers whose shapes float8 matmuls take (both dimensions multiples of 16), except
    the output projection, which stays in bf16 as torchtitan keeps it: its logits feed the loss
    directly. (GPT-2's blocks are Conv1D modules, so float8 changes nothing there.)"""
    return (isinstance(module, torch.nn.Linear) and fqn != "lm_head"
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def apply_float8(model: torch.nn.Module) -> None:
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        raise ValueError("parallel.float8 needs torchao on the nodes: pip install 'pretrain-pipeline[float8]' "
                         "(torchao 0.18)") from None
    convert_to_float8_training(model, module_filter_fn=float8_eligible)


def apply_ac(model: torch.nn.Module) -> None:
    # HF's own switch keeps parameter names unchanged, so checkpoints and exports do not depend on it.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_compile(model: torch.nn.Module, device: torch.device) -> None:
    """Per block, as torchtitan does: the blocks are identical, so one graph serves them all."""
    for block in decoder_blocks(model):
        block.compile(backend=devices.compile_backend(device), fullgraph=False)


def apply_fsdp(model: torch.nn.Module, dp_mesh: DeviceMesh, param_dtype: torch.dtype) -> None:
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in decoder_blocks(model):
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def parallelize(model: torch.nn.Module, mesh: DeviceMesh, cfg: TrainConfig, device: torch.device) -> bool:
    """Apply the parallelisms in torchtitan's order; returns whether the model is sharded (FSDP2).

    A world of one has nothing to shard: as in torchtitan, FSDP is applied only across several
    data-parallel ranks. Measured on torch 2.13's CPU build, FSDP2 there costs ~15 % a step, and
    every step after a ``torch.distributed.checkpoint`` save of its state ~40 % more (not seen
    without FSDP); the trainer then casts to the compute dtype with autocast instead.
    """
    if mesh["tp"].size() > 1:
        apply_tp(model, mesh["tp"])
    if cfg.parallel.float8:
        apply_float8(model)
    if cfg.parallel.activation_checkpointing:
        apply_ac(model)
    if cfg.parallel.compile:
        apply_compile(model, device)
    if mesh.size() == 1:
        return False
    apply_fsdp(model, mesh["dp"], devices.compute_dtype(device, cfg.precision))
    return True


def grad_norm(parameters: list[torch.nn.Parameter]) -> torch.Tensor:
    """Global L2 norm of the gradients across every rank and every mesh.

    Parameters live on different meshes (2D dp x tp for the tensor-parallel matrices, 1D dp for
    the rest), which torch's clip_grad_norm_ cannot mix. Each rank sums the squares of its local
    shards, weighted down by how many ranks hold the same values, and one all-reduce adds them.
    """
    world = dist.get_world_size()
    grads, copies = [], []
    for p in parameters:
        if p.grad is None:
            continue
        grad, held_by = p.grad, world
        if isinstance(grad, DTensor):
            sharded = math.prod(grad.device_mesh.size(i) for i, pl in enumerate(grad.placements) if isinstance(pl, Shard))
            grad, held_by = grad.to_local(), world // sharded
        grads.append(grad)
        copies.append(held_by)
    device = next(iter(parameters)).device
    norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)) if grads else torch.zeros(0, device=device)
    local = (norms.pow(2) / torch.tensor(copies, dtype=torch.float32, device=device)).sum()
    dist.all_reduce(local)
    return local.sqrt()


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global norm is at most ``max_norm`` (0: report only)."""
    norm = grad_norm(parameters)
    if max_norm > 0 and torch.isfinite(norm):
        scale = max_norm / (float(norm) + 1e-6)
        if scale < 1.0:  # a norm within the limit leaves the gradients as they are
            torch._foreach_mul_([p.grad for p in parameters if p.grad is not None], scale)
    return norm
