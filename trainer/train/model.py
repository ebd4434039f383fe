"""Models: Hugging Face Llama and GPT-2 classes built from the spec's architecture, so HF
checkpoints load directly (continual pre-training) and the trained model exports back to HF
safetensors + config.json."""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path

import torch
from safetensors import safe_open
from torch.distributed.tensor import DTensor, distribute_tensor
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, LlamaConfig, PretrainedConfig

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


def decoder_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    if hasattr(model, "model"):  # LlamaForCausalLM
        return model.model.layers
    return model.transformer.h  # GPT2LMHeadModel


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


def build(cfg: ModelConfig) -> torch.nn.Module:
    """The model's modules on the meta device: every shape, no memory and no values.

    Parallelize it (parallelize.py), then :func:`materialize` gives each rank the values of its
    own shards. Built whole on the CPU, the model took a full fp32 copy in every rank's host
    memory before FSDP kept a shard of it: 280 GB a rank for a 70B model.
    """
    if cfg.init_from:
        path = Path(cfg.init_from).expanduser()
        _check_checkpoint_config(cfg, path)
        if not any((path / name).exists() for name in ("model.safetensors", "model.safetensors.index.json")):
            raise FileNotFoundError(f"model.init_from={path}: no model.safetensors or model.safetensors.index.json "
                                    "there; the trainer reads Hugging Face safetensors")
        config = AutoConfig.from_pretrained(path)  # the checkpoint's own: what export writes back
    else:
        config = hf_config(cfg)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")


@torch.no_grad()
def materialize(model: torch.nn.Module, cfg: ModelConfig, seed: int, device: torch.device) -> None:
    """Give the (parallelized) meta model its values on ``device``: loaded from ``init_from``,
    else initialised from ``seed``.

    One unit at a time (a decoder block, or a module outside the blocks: an embedding, the final
    norm, the output layer), every rank makes the unit's full tensors on the CPU, drawing from
    one generator seeded once, in the model's module order, by Hugging Face's own rules
    (``_init_weights``), or reading them from the checkpoint, and keeps its own piece of each.
    The values thus depend on the seed alone, whatever the data- and tensor-parallel layout, and
    host memory holds under one unit beyond the rank's shards, each unit's tensors unmapped as
    they are freed (device.return_freed_units; tests/test_train_loop.py measures it). The price is that every rank draws (or reads) every value, as the whole-model build did;
    drawing only a shard's values on the device's generator would tie them to the layout and the
    device.
    """
    model.to_empty(device=device)
    # to_empty gives each module tensors of its own, untying GPT-2's output layer from its
    # embedding wherever FSDP did not take them (a world of one): tie them again.
    model.tie_weights()
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)  # the same modules, unsplit
    saved = set(twin.state_dict())  # RoPE's buffers are computed, never saved
    read = _checkpoint_reader(Path(cfg.init_from).expanduser(), twin.base_model_prefix) if cfg.init_from else None
    placed: set[int] = set()  # tied weights (GPT-2's output layer is its embedding) take their first unit's values
    torch.manual_seed(seed)
    for prefix, meta_unit in _units(twin):
        # A copy, dropped whole with its values at the end of the iteration: emptying the twin's
        # unit in place instead left its new (meta) tensors' small allocations in the holes the
        # freed values left, and the heap grew by a tenth of every layer.
        unit = copy.deepcopy(meta_unit).to_empty(device="cpu")
        tensors = [(name, tensor) for name, tensor in [*unit.named_parameters(prefix), *unit.named_buffers(prefix)]
                   if id(targets[name]) not in placed]
        if read:
            for name, tensor in tensors:
                if name in saved:
                    tensor.copy_(read(name))
                    tensor._is_hf_initialized = True  # HF's init functions leave such tensors alone
        unit.apply(twin._init_weights)  # children first, then the block, as HF applies it
        for name, tensor in tensors:
            _keep_shard(targets[name], tensor)
            placed.add(id(targets[name]))


def _units(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """Each decoder block whole (HF initialises a block's modules together: GPT-2 scales its
    residual projections from the block's attention and MLP), and each module outside the
    blocks that holds tensors of its own, in module order."""
    blocks = {id(block) for block in decoder_blocks(model)}
    inside = {id(module) for block in decoder_blocks(model) for module in block.modules()}
    for name, module in model.named_modules():
        holds = any(True for _ in chain(module.parameters(recurse=False), module.buffers(recurse=False)))
        if id(module) in blocks or (id(module) not in inside and holds):
            yield name, module


def _keep_shard(target: torch.Tensor, full: torch.Tensor) -> None:
    if isinstance(target, DTensor):
        # Every rank holds the same full tensor, so each keeps its own piece without
        # communication (src_data_rank=None); torch splits it as the placements say.
        full = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
        target = target.to_local()
    target.copy_(full)


def _checkpoint_reader(path: Path, prefix: str) -> Callable[[str], torch.Tensor]:
    """``name`` -> the tensor the checkpoint's safetensors hold under it, read alone. GPT-2's
    Hub checkpoints name their tensors without the model's ``transformer.`` prefix."""
    index = path / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.exists() else None

    def read(name: str) -> torch.Tensor:
        for key in (name, name.removeprefix(f"{prefix}.")):
            file = weight_map.get(key) if weight_map is not None else "model.safetensors"
            if file is None:
                continue
            with safe_open(path / file, framework="pt") as f:
                if key in f.keys():
                    return f.get_tensor(key)
        raise ValueError(f"model.init_from={path}: its safetensors hold no {name}; point it at a checkpoint "
                         "of this model")

    return read


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
