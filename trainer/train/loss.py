"""The training loss: next-token cross entropy, averaged over the positions the mask keeps."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from trainer.train import device as devices


def token_loss(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Cross entropy in fp32 (bf16 logits lose the small probabilities the loss is made of), the
    mean over the positions ``loss_mask`` keeps."""
    losses = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    mask = loss_mask.flatten()
    return (losses * mask).sum() / mask.sum().clamp(min=1)


def loss_function(device: torch.device, compile: bool) -> Callable[..., torch.Tensor]:
    """:func:`token_loss`, compiled with the blocks on NVIDIA GPUs, as torchtitan compiles its
    loss: eagerly, the fp32 copy of the logits and its log-softmax are each written out in full,
    forward and backward, and at Llama 3's vocabulary of 128,256 that is 8.4 GB apiece for a
    micro-batch of 16,384 tokens; compiled, the cast, the log-softmax and the pick of each label's
    entry fuse into passes over the bf16 logits. Elsewhere it stays eager: on the CPU, at the
    demo's vocabulary of 4,096, compiling it gained nothing (0.96x, ``train_benchmark.py profile
    --smoke``) and cost a C++ compile of its own in every cold cache; on Trainium the neuron
    backend's handling of it is unmeasured."""
    if compile and device.type == "cuda":
        return torch.compile(token_loss, backend=devices.compile_backend(device))
    return token_loss
