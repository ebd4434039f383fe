"""The trainer's CPU allocator setting: memory a step frees is kept for the next step, so the
steps stop faulting their activations in again, at no cost in peak memory
(benchmarks/train_benchmark.py measures what that is worth in time). Each case runs training
steps in a process of its own, as the trainer's ranks do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.train.device import keep_freed_memory

REPO = Path(__file__).resolve().parents[1]

STEPS = """
import json, resource, sys, torch
from trainer.train.config import ModelConfig
from trainer.train.device import keep_freed_memory
from trainer.train.model import build

if sys.argv[1] == "tuned":
    assert keep_freed_memory(torch.device("cpu"))
torch.set_num_threads(1)
model = build(ModelConfig(family="llama", num_layers=2, hidden_size=64, ffn_hidden_size=172, num_attention_heads=4,
                          num_kv_heads=2, vocab_size=4096, max_position_embeddings=128), seed=0)
optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
tokens = torch.randint(0, 4096, (4, 128))

def step():
    logits = model(input_ids=tokens, use_cache=False).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

for _ in range(3):  # warm-up: the first steps fault their memory in whatever the setting
    step()
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"faults_per_step": sorted(faults)[4], "peak_rss_kib": usage.ru_maxrss}))
"""


@pytest.fixture(scope="module", autouse=True)
def prefect_api():
    """Overrides conftest's Prefect API server: the node program never imports Prefect."""
    yield


def training_steps(setting: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", STEPS, setting], cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_cpu_steps_reuse_freed_memory_instead_of_faulting_it_in_again():
    # glibc's default gives the step's large blocks back on free and faults them in again on the
    # next step; measured here too, so the test shows the difference the setting makes. The
    # median step counts: a tuned step still faults now and then, when the heap grows.
    default, tuned = training_steps("default"), training_steps("tuned")
    assert default["faults_per_step"] > 1000
    assert tuned["faults_per_step"] < default["faults_per_step"] / 10
    assert tuned["peak_rss_kib"] < 1.2 * default["peak_rss_kib"]


def test_accelerators_keep_their_own_allocator():
    assert keep_freed_memory(torch.device("meta")) is False
