"""Models: Hugging Face Llama and GPT-2 classes built from the spec's architecture, so HF
checkpoints load directly (continual pre-training) and the trained model exports back to HF
safetensors + config.json."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PretrainedConfig

from trainer.train.config import ModelConfig

# config.json keys that must agree with the spec when weights come from a checkpoint.
_LLAMA_KEYS = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
               "num_attention_heads": "num_attention_heads", "num_key_value_heads": "kv_heads",
               "vocab_size": "vocab_size", "max_position_embeddings": "max_position_embeddings"}
_GPT_KEYS = {"n_layer": "num_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads",
             "vocab_size": "vocab_size", "n_inner": "ffn_hidden_size", "n_positions": "max_position_embeddings"}


def hf_config(cfg: ModelConfig) -> PretrainedConfig:
    if cfg.family == "llama":
        return LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_hidden_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.max_position_embeddings,
            rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, tie_word_embeddings=False,
            attention_dropout=0.0)
    # Pre-training runs without dropout, as Megatron's GPT recipes do for large corpora.
    return GPT2Config(vocab_size=cfg.vocab_size, n_embd=cfg.hidden_size, n_layer=cfg.num_layers,
                      n_head=cfg.num_attention_heads, n_inner=cfg.ffn_hidden_size,
                      n_positions=cfg.max_position_embeddings, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def _check_checkpoint_config(cfg: ModelConfig, path: Path) -> None:
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"model.init_from={path}: no config.json there; point it at a Hugging Face "
                                "checkpoint directory")
    found = json.loads(config_file.read_text())
    keys = _LLAMA_KEYS if cfg.family == "llama" else _GPT_KEYS
    mismatched = [f"{key}={found[key]} (spec model.{ours}={getattr(cfg, ours)})"
                  for key, ours in keys.items() if key in found and found[key] is not None
                  and found[key] != getattr(cfg, ours)]
    if cfg.family == "llama":
        mismatched += _rope_mismatches(cfg, found)
    if mismatched:
        raise ValueError(f"{config_file} does not match the spec's model: {'; '.join(mismatched)}; "
                         "make the spec's model section describe this checkpoint")


def _rope_mismatches(cfg: ModelConfig, found: dict) -> list[str]:
    """RoPE as the checkpoint was trained with it: from_pretrained takes the checkpoint's, so a
    spec that says otherwise (Llama 3 against 3.1's scaling, another theta) would be ignored
    silently. transformers 5 writes both under rope_parameters, earlier versions top-level."""
    params = found.get("rope_parameters") or {}
    theta = found.get("rope_theta", params.get("rope_theta"))
    scaling = {k: v for k, v in (found.get("rope_scaling") or params).items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    out = []
    if theta is not None and float(theta) != float(cfg.rope_theta):
        out.append(f"rope_theta={theta} (spec model.rope_theta={cfg.rope_theta})")
    wanted = cfg.rope_scaling or {}
    if wanted.get("rope_type", "default") != kind:
        out.append(f"rope type {kind} (spec model.rope_scaling: {wanted.get('rope_type', 'none')})")
    else:
        out += [f"rope_scaling.{k}={scaling.get(k)} (spec model.rope_scaling.{k}={v})"
                for k, v in wanted.items() if k != "rope_type" and scaling.get(k) != v]
    return out


def build(cfg: ModelConfig, seed: int) -> torch.nn.Module:
    """The full model on the CPU in fp32: initialised from ``seed``, or loaded from ``init_from``.

    Every rank builds the same weights; FSDP then keeps only each rank's shard and moves it to
    the device. Building on the CPU keeps initialisation identical across parallel layouts.
    """
    if cfg.init_from:
        path = Path(cfg.init_from).expanduser()
        _check_checkpoint_config(cfg, path)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf_config(cfg), dtype=torch.float32, attn_implementation="sdpa")


def export(config: PretrainedConfig, full_state: dict[str, torch.Tensor], out: str) -> None:
    """Write HF safetensors + config.json to ``out`` through a temporary directory, so ``out``
    never holds a half-written model. ``config`` is the trained model's own: for continual
    pre-training, the checkpoint's, with the keys the spec does not describe (norm epsilon,
    RoPE base, special token ids) as the weights were trained with them."""
    target = Path(out).expanduser()
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(full_state, assign=True)
    model.save_pretrained(staging, safe_serialization=True)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
