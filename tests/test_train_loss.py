"""The training loss, eager and compiled as the trainer compiles it with its blocks."""

from __future__ import annotations

import pytest
import torch

from trainer.train.loss import loss_function, token_loss

pytestmark = pytest.mark.pure


def _batch(vocab: int = 1000, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 16, vocab, generator=generator).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, vocab, (2, 16), generator=generator)
    mask = torch.ones(2, 16)
    mask[0, 10:] = 0  # a document's padding, or an end-of-document position left out
    return logits, labels, mask


def test_the_loss_is_the_mean_cross_entropy_of_the_kept_positions():
    logits, labels, mask = _batch()
    kept = mask.bool()
    expected = torch.nn.functional.cross_entropy(logits.float()[kept], labels[kept])
    assert torch.allclose(token_loss(logits, labels, mask), expected)
    assert torch.allclose(token_loss(logits, labels, torch.zeros_like(mask)), torch.zeros(()))  # nothing kept: 0, not NaN


def test_the_loss_is_compiled_with_the_blocks_on_gpus_only():
    """Where it pays: on NVIDIA GPUs the fp32 logits are gigabytes of memory traffic; on the CPU
    (the demo, the suite) compiling gained nothing and cost a compile in every cold cache."""
    compiled = loss_function(torch.device("cuda"), compile=True)  # built lazily: no GPU needed
    assert compiled is not token_loss and compiled._torchdynamo_orig_callable is token_loss
    assert loss_function(torch.device("cuda"), compile=False) is token_loss
    assert loss_function(torch.device("cpu"), compile=True) is token_loss


def test_the_compiled_loss_gives_the_eager_loss_and_gradients():
    """What the trainer compiles on a GPU, compiled here by inductor's CPU backend: the same value
    and the same gradients of the bf16 logits, so compiling changes the speed and nothing else."""
    compiled = torch.compile(token_loss)
    eager_logits, labels, mask = _batch()
    compiled_logits = eager_logits.detach().clone().requires_grad_()
    eager = token_loss(eager_logits, labels, mask)
    eager.backward()
    fused = compiled(compiled_logits, labels, mask)
    fused.backward()
    assert torch.allclose(fused, eager, rtol=1e-5)
    assert compiled_logits.grad.dtype == torch.bfloat16
    assert torch.allclose(compiled_logits.grad.float(), eager_logits.grad.float(), atol=1e-3)
