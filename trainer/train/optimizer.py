"""AdamW with Megatron's schedule: linear warmup, then cosine or linear decay to ``min_lr``."""

from __future__ import annotations

import math

import torch

from trainer.train.config import OptimConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, *, fused: bool = False) -> torch.optim.AdamW:
    """Weight decay on matrices only: norms, biases and other vectors are not decayed (as in
    Megatron, torchtitan and nanoGPT). ``fused``: one kernel for the whole update (the device
    module decides where that exists), else foreach."""
    decayed, plain = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decayed if param.ndim >= 2 else plain).append(param)
    groups = [{"params": decayed, "weight_decay": cfg.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused, foreach=not fused)


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.decay_style == "constant":
        return cfg.lr
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / decay_steps, 1.0)
    if cfg.decay_style == "cosine":
        factor = 0.5 * (1 + math.cos(math.pi * progress))
    else:
        factor = 1 - progress
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg, total_steps) / cfg.lr)
