"""The trainer config as ``python -m trainer train`` reads it: ``_build`` checks every value
against its field's type hint, so a typo in a ``Literal`` or a number written as a string stops
the run at start-up, naming the file, the dotted field, the value and what it must be, instead
of training something else (GPT-2 for "Llama", linear decay for "cosin", fp32 for "bf17")."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.train.config import TrainConfig

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

VALID = {
    "model": {"family": "llama", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 172,
              "num_attention_heads": 4, "num_kv_heads": 2, "vocab_size": 512, "max_position_embeddings": 64},
    "data": {"paths": ["/data/pattern_text_document"], "split": "98,2,0"},
    "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 2},
    "checkpoint": {"dir": "/run/checkpoints"},
    "metrics": {"jsonl_path": "/run/metrics.jsonl"},
    "device": "cpu", "steps": 20, "global_batch_size": 4, "seq_length": 32, "precision": "fp32",
}


@pytest.fixture(scope="module", autouse=True)
def prefect_api():
    """Overrides conftest's Prefect API server: the node program never imports Prefect."""
    yield


def load(tmp_path: Path, section: str | None, **values) -> TrainConfig:
    """VALID with ``values`` set at the top level, or in ``section``, read from a file."""
    cfg = copy.deepcopy(VALID)
    (cfg.setdefault(section, {}) if section else cfg).update(values)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg))
    return TrainConfig.from_file(path)


@pytest.mark.parametrize("section, name, value, allowed", [
    ("model", "family", "Llama", '"llama", "gpt"'),
    ("optim", "decay_style", "cosin", '"cosine", "linear", "constant"'),
    (None, "precision", "bf17", '"bf16", "fp32"'),
    ("data", "format", "arrow", '"megatron", "nxd-arrow"'),
])
def test_a_value_outside_its_literal_names_the_field_and_the_choices(tmp_path, section, name, value, allowed):
    field = f"{section}.{name}" if section else name
    with pytest.raises(ValueError) as raised:
        load(tmp_path, section, **{name: value})
    assert str(raised.value) == f'{tmp_path / "train.json"}: {field}="{value}": expected one of {allowed}'


@pytest.mark.parametrize("section, name, value, message", [
    ("optim", "lr", "1e-3", 'optim.lr="1e-3": expected number'),
    (None, "steps", 2.5, "steps=2.5: expected integer"),
    (None, "steps", True, "steps=true: expected integer"),
    ("optim", "lr", False, "optim.lr=false: expected number"),
    ("parallel", "compile", "yes", 'parallel.compile="yes": expected true or false'),
    (None, "device", 0, "device=0: expected string"),
    ("model", "num_kv_heads", "2", 'model.num_kv_heads="2": expected integer or null'),
    ("model", "rope_scaling", [8.0], "model.rope_scaling=[8.0]: expected mapping or null"),
    ("data", "paths", "/data/pattern_text_document", 'data.paths="/data/pattern_text_document": expected [string, ...]'),
    ("data", "weights", ["1"], 'data.weights[0]="1": expected number'),
    ("optim", "betas", [0.9], "optim.betas=[0.9]: expected [number, number]"),
    (None, "optim", "adamw", 'optim="adamw": expected mapping'),
])
def test_a_value_of_the_wrong_type_names_the_field_and_the_type(tmp_path, section, name, value, message):
    with pytest.raises(ValueError) as raised:
        load(tmp_path, section, **{name: value})
    assert str(raised.value) == f'{tmp_path / "train.json"}: {message}'


@pytest.mark.parametrize("values, message", [
    ({"hidden_size": 66}, "model.hidden_size=66 is not divisible by model.num_attention_heads=4"),
    ({"num_kv_heads": 3}, "model.num_kv_heads=3 must divide model.num_attention_heads=4"),
])
def test_heads_that_do_not_fit_the_model_are_named(tmp_path, values, message):
    with pytest.raises(ValueError) as raised:
        load(tmp_path, "model", **values)
    assert str(raised.value) == f'{tmp_path / "train.json"}: {message}'


@pytest.mark.parametrize("model, parallel, message", [
    # GPT-2's fused c_attn: refused here at start-up, no longer when the mesh is applied
    ({"family": "gpt", "num_kv_heads": None}, {"tp": 2}, "parallel.tp=2 needs family=llama"),
    ({"family": "gpt"}, {}, "model.num_kv_heads applies to family=llama only; GPT-2 has no grouped-query "
                            "attention: remove model.num_kv_heads or set it to model.num_attention_heads=4"),
    ({}, {"tp": 3}, "parallel.tp=3 does not divide model.num_attention_heads=4: choose tp in [1, 2, 4]"),
    ({}, {"tp": 4}, "model.num_kv_heads=2 is not divisible by parallel.tp=4: each tensor-parallel rank needs "
                    "whole KV heads; choose tp in [1, 2]"),
])
def test_what_the_trainer_cannot_build_or_split_is_refused_in_the_specs_words(tmp_path, model, parallel, message):
    """The rules of trainer/model_shape.py, which the spec asks as well (tests/test_spec.py)."""
    cfg = copy.deepcopy(VALID)
    cfg["model"].update(model)
    cfg["parallel"] = parallel
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as raised:
        TrainConfig.from_file(path)
    assert str(raised.value).startswith(f"{path}: {message}")


@pytest.mark.parametrize("changes, message", [
    ({"precision": "fp32"}, "float8 with precision='fp32': float8 matmuls run inside bf16 training"),
    ({"parallel": {"float8": True, "tp": 2}}, "float8 with parallel.tp=2: float8 runs with tp=1 only"),
    ({"model": {**VALID["model"], "family": "gpt", "num_kv_heads": None}}, "float8 needs family=llama"),
])
def test_float8_settings_it_cannot_run_are_refused_by_trainer_and_spec(tmp_path, changes, message):
    """One rule (trainer/model_shape.py) for the trainer's config and the spec, so a spec the
    trainer would refuse is refused before anything is queued."""
    from pretrain.presets import load_spec

    cfg = {**copy.deepcopy(VALID), "precision": "bf16", "parallel": {"float8": True}, **changes}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as raised:
        TrainConfig.from_file(path)
    assert message in str(raised.value)
    spec_changes = {"precision": ["training.precision=fp32"], "parallel": ["parallel.tp=2"],
                    "model": ["model.family=gpt", "model.num_kv_heads=null", "model.rope_theta=null"]}[next(iter(changes))]
    with pytest.raises(ValueError) as raised:
        load_spec("tiny-local", ["backend.native.float8=true", "training.precision=bf16", *spec_changes])
    assert message in str(raised.value)


def test_float8_converts_the_blocks_linear_layers_and_leaves_the_output_projection():
    """Which layers torchao would turn into Float8Linear (torchao itself runs on GPUs only)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.train.parallelize import float8_eligible

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
    chosen = [name for name, module in model.named_modules() if float8_eligible(module, name)]
    assert chosen == [f"model.layers.0.{n}" for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                      "mlp.down_proj")]
    assert not float8_eligible(torch.nn.Linear(64, 20), "model.layers.0.odd")  # 20 is no multiple of 16


def test_the_batch_arithmetic_is_one_rule_for_the_spec_and_the_trainer():
    """global batch = micro batch x dp x accumulation, dp = world / (tp x pp x cp): the trainer's
    loop and mesh ask these, and so does the spec, with its own section's names."""
    from trainer.run_layout import data_parallel_size, grad_accumulation

    assert data_parallel_size(16, 8) == 2 and data_parallel_size(512, 32, 8, 2) == 1
    assert grad_accumulation(288, 1, 2) == 144
    with pytest.raises(ValueError, match=r"^world size of this run 6 is not a multiple of parallel.tp x parallel.pp "
                                         r"x parallel.cp = 4 x 1 x 1 = 4: change"):
        data_parallel_size(6, 4, world="of this run ")
    with pytest.raises(ValueError, match=r"^global_batch_size=289 is not divisible by micro_batch_size x dp = 1 x 2: "
                                         r"use a multiple of 2$"):
        grad_accumulation(289, 1, 2)
    with pytest.raises(ValueError, match=r"^training.global_batch_size=289 .* training.micro_batch_size x dp"):
        grad_accumulation(289, 1, 2, section="training.")


def test_a_missing_field_is_named_as_missing(tmp_path):
    cfg = copy.deepcopy(VALID)
    del cfg["optim"]["lr"]
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"train\.json: optim: missing field\(s\) lr$"):
        TrainConfig.from_file(path)


def test_integers_are_numbers_and_lists_are_tuples(tmp_path):
    cfg = load(tmp_path, "optim", lr=1, min_lr=0, betas=[1, 0.95])
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.optim.betas) == (1.0, 0.0, (1.0, 0.95))
    assert type(cfg.optim.lr) is float and type(cfg.optim.betas[0]) is float
    assert load(tmp_path, "model", num_kv_heads=None, rope_scaling={"factor": 8}).model.kv_heads == 4


# trainer.train.main imports its training code (trainer.train.loop) once the config has passed
@pytest.mark.parametrize("program", ["trainer.tokenize", "trainer.convert", "trainer.train.loop"])
def test_node_programs_import_neither_prefect_nor_pydantic(program):
    """What a node needs to run them: no Prefect (they run the same by hand as under the
    pipeline), and no pydantic either (the GPU benchmark's instructions add only three wheels to
    an image's torch and transformers)."""
    code = f"import sys, {program}; print(sorted(m for m in ('prefect', 'pydantic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"{program} imports {out.stdout.strip()}"
