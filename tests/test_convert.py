"""HF <-> NxDT checkpoint conversion on a small random Llama with GQA (8 heads, 2 KV heads,
tp 4, pp 2, KV multiplier 2), for trn1 and trn2: names and per-rank shapes, the round trip,
and logits computed from the shards the way tensor-parallel layers compute them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from trainer.convert import ConvertError, HFCheckpoint, verify
from trainer.nxdt_layout import NxdtLayout

CONVERT = [sys.executable, "-m", "trainer", "convert"]
TP, PP, MULT = 4, 2, 2


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=4,
                         intermediate_size=96, vocab_size=128, max_position_embeddings=64,
                         tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    directory = tmp_path_factory.mktemp("hf")
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="100KB")  # sharded + index
    assert (directory / "model.safetensors.index.json").exists()
    return model, directory


def convert(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([*CONVERT, *args], capture_output=True, text=True)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def to_nxdt(src: Path, out: Path, backend: str, *extra: str) -> Path:
    convert("hf-to-nxdt", "--input", str(src), "--output", str(out), "--tp", str(TP), "--pp", str(PP),
            "--kv-multiplier", str(MULT), "--hw-backend", backend, *extra)
    return out / "model"


def layout(backend: str, fuse: bool = False) -> NxdtLayout:
    return NxdtLayout(4, 8, 2, 8, tp=TP, pp=PP, kv_multiplier=MULT, hw_backend=backend, fuse_qkv=fuse)


def shards(model_dir: Path) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    return {(t, p): torch.load(model_dir / f"dp_rank_00_tp_rank_{t:02d}_pp_rank_{p:02d}.pt", weights_only=True)
            for t in range(TP) for p in range(PP)}


@pytest.mark.parametrize("backend", ["trn1", "trn2"])
def test_names_and_per_rank_shapes(hf_model, tmp_path, backend):
    _, src = hf_model
    states = shards(to_nxdt(src, tmp_path / "nxdt", backend))
    first, last = states[(0, 0)], states[(0, 1)]
    assert first["model.embed_tokens.weight"].shape == (128 // TP, 64) and "lm_head.weight" not in first
    assert last["lm_head.weight"].shape == (128 // TP, 64) and "model.embed_tokens.weight" not in last
    assert last["model.norm.weight"].shape == (64,)
    assert {int(k.split(".")[2]) for k in first if k.startswith("model.layers.")} == {0, 1}
    attn = "model.layers.3.self_attn"
    assert last[f"{attn}.qkv_proj.weight_q"].shape == (2 * 8, 64)   # 2 Q heads per rank
    assert last[f"{attn}.qkv_proj.weight_k"].shape == (1 * 8, 64)   # 1 KV head after x2 replication
    assert last[f"{attn}.o_proj.weight"].shape == (64, 16)
    assert last["model.layers.3.mlp.gate_up_proj.weight"].shape == (2 * 96 // TP, 64)
    assert last["model.layers.3.mlp.down_proj.weight"].shape == (64, 96 // TP)
    fused = shards(to_nxdt(src, tmp_path / "fused", backend, "--fuse-qkv"))
    assert fused[(1, 1)][f"{attn}.qkv_proj.weight_qkv"].shape == (16 + 8 + 8, 64)


@pytest.mark.parametrize("backend", ["trn1", "trn2"])
def test_kv_replication_pairs_each_ranks_q_heads_with_its_kv_head(backend):
    lay = layout(backend)
    for rank in range(TP):
        (kv,) = lay.kv_heads(rank)
        assert all(head // (8 // 2) == kv for head in lay.q_heads(rank))
    tiled = [lay.kv_heads(r)[0] for r in range(TP)]
    assert tiled == ([0, 1, 0, 1] if backend == "trn1" else [0, 0, 1, 1])  # repeat vs repeat_interleave


@pytest.mark.parametrize("backend, fuse", [("trn1", False), ("trn2", True)])
def test_round_trip_is_the_identity(hf_model, tmp_path, backend, fuse):
    model, src = hf_model
    extra = ["--fuse-qkv"] if fuse else []
    record = json.loads(convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "n"), "--tp", str(TP),
                                "--pp", str(PP), "--kv-multiplier", str(MULT), "--hw-backend", backend,
                                "--verify", *extra).stdout)
    assert record["shards"] == TP * PP and record["verified_tensors"] == len(model.state_dict())
    convert("nxdt-to-hf", "--input", str(tmp_path / "n"), "--config", str(src / "config.json"), "--output",
            str(tmp_path / "back"), "--tp", str(TP), "--pp", str(PP), "--kv-multiplier", str(MULT),
            "--hw-backend", backend, *extra)
    # One file per pipeline stage and the index naming them, as transformers saves a sharded model.
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    back = {k: v for name in set(index["weight_map"].values()) for k, v in load_file(tmp_path / "back" / name).items()}
    original = model.state_dict()
    assert set(back) == set(original)
    for key, tensor in original.items():
        assert torch.equal(back[key], tensor), key
    assert LlamaForCausalLM.from_pretrained(tmp_path / "back").config.num_key_value_heads == 2


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def tensor_parallel_logits(states, lay: NxdtLayout, config: LlamaConfig, ids: torch.Tensor) -> torch.Tensor:
    """The forward pass of NxD's parallel layers, from the shards: column-parallel outputs
    joined, row-parallel outputs summed, each rank's Q heads with its own K/V head."""
    hd, eps, (batch, seq) = lay.head_dim, config.rms_norm_eps, ids.shape
    x = torch.cat([states[(t, 0)]["model.embed_tokens.weight"] for t in range(TP)])[ids]
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(seq)[None])
    causal = torch.full((seq, seq), float("-inf")).triu(1)
    stage = lay.stage_of_layer()
    for layer in range(lay.num_layers):
        p = f"model.layers.{layer}"
        per_rank = [states[(t, stage[layer])] for t in range(TP)]
        h = rms_norm(x, per_rank[0][f"{p}.input_layernorm.weight"], eps)
        attention = 0
        for s in per_rank:
            def heads(w):
                return (h @ w.T).view(batch, seq, -1, hd).transpose(1, 2)
            q, k, v = (heads(s[f"{p}.self_attn.qkv_proj.weight_{n}"]) for n in "qkv")
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k, v = (t.expand(-1, q.shape[1], -1, -1) for t in (k, v))  # one KV head serves the rank's Q heads
            scores = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + causal, dim=-1)
            out = (scores @ v).transpose(1, 2).reshape(batch, seq, -1)
            attention = attention + out @ s[f"{p}.self_attn.o_proj.weight"].T
        x = x + attention
        h = rms_norm(x, per_rank[0][f"{p}.post_attention_layernorm.weight"], eps)
        mlp = 0
        for s in per_rank:
            gate, up = torch.chunk(s[f"{p}.mlp.gate_up_proj.weight"], 2)
            mlp = mlp + (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ s[f"{p}.mlp.down_proj.weight"].T
        x = x + mlp
    last = [states[(t, PP - 1)] for t in range(TP)]
    x = rms_norm(x, last[0]["model.norm.weight"], eps)
    return torch.cat([x @ s["lm_head.weight"].T for s in last], dim=-1)


@pytest.mark.parametrize("backend", ["trn1", "trn2"])
def test_logits_from_the_shards_match_the_hf_model(hf_model, tmp_path, backend):
    model, src = hf_model
    states = shards(to_nxdt(src, tmp_path / "nxdt", backend))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
        ours = tensor_parallel_logits(states, layout(backend), model.config, ids)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)


def test_pipeline_cuts_place_layers_like_the_training_config(hf_model, tmp_path):
    _, src = hf_model
    model_dir = to_nxdt(src, tmp_path / "cut", "trn2", "--pipeline-cuts", "model.layers.0")
    assert {k.split(".")[2] for k in torch.load(model_dir / "dp_rank_00_tp_rank_00_pp_rank_00.pt",
                                                 weights_only=True) if k.startswith("model.layers.")} == {"0"}


def test_bad_inputs_are_named_and_leave_nothing_behind(hf_model, tmp_path):
    model, src = hf_model
    bad_config = tmp_path / "badcfg"
    bad_config.mkdir()
    for f in src.iterdir():
        (bad_config / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad_config / "config.json").read_text())
    (bad_config / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 4}))
    base = ["--tp", str(TP), "--pp", str(PP), "--kv-multiplier", str(MULT), "--hw-backend", "trn1"]
    out = convert("hf-to-nxdt", "--input", str(bad_config), "--output", str(tmp_path / "o1"), *base, check=False)
    assert out.returncode == 2 and "config.json does not match the tensors" in out.stderr

    missing = tmp_path / "missing"
    missing.mkdir()
    for f in src.iterdir():
        (missing / f.name).write_bytes(f.read_bytes())
    victim = sorted(missing.glob("model-0000*.safetensors"))[0]
    victim.unlink()
    out = convert("hf-to-nxdt", "--input", str(missing), "--output", str(tmp_path / "o2"), *base, check=False)
    assert out.returncode == 2 and f"{victim}: safetensors shard listed in the index is missing" in out.stderr

    out = convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o3"), "--tp", "3",
                  "--hw-backend", "trn1", check=False)
    assert out.returncode == 2 and "tp=3 does not divide the 8 attention heads" in out.stderr
    out = convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o4"), "--tp", "4",
                  "--kv-multiplier", "4", "--hw-backend", "trn1", check=False)
    assert out.returncode == 2 and "must equal tp=4" in out.stderr

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("precious")
    out = convert("hf-to-nxdt", "--input", str(src), "--output", str(existing), *base, check=False)
    assert out.returncode == 2 and "--overwrite" in out.stderr
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    assert not list(tmp_path.glob("*.partial"))
    # Asked to overwrite, a conversion that fails keeps the old output whole; one that succeeds
    # replaces it and leaves nothing beside it.
    out = convert("hf-to-nxdt", "--input", str(missing), "--output", str(existing), *base, "--overwrite", check=False)
    assert out.returncode == 2 and [p.name for p in existing.iterdir()] == ["keep.txt"]
    convert("hf-to-nxdt", "--input", str(src), "--output", str(existing), *base, "--overwrite")
    assert sorted(p.name for p in existing.iterdir()) == ["model"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("existing")) == ["existing"]

    model_dir = to_nxdt(src, tmp_path / "good", "trn1")
    shard = model_dir / "dp_rank_00_tp_rank_01_pp_rank_01.pt"
    shard.write_bytes(shard.read_bytes()[:200])
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "good"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back"), *base, check=False)
    assert out.returncode == 2 and f"{shard}: cannot read the shard" in out.stderr
    assert not (tmp_path / "back").exists()


def test_verify_and_the_way_back_check_every_copy_and_every_source_tensor(hf_model, tmp_path):
    model, src = hf_model
    base = ["--tp", str(TP), "--pp", str(PP), "--kv-multiplier", str(MULT), "--hw-backend", "trn2"]
    model_dir = to_nxdt(src, tmp_path / "good", "trn2")
    # trn2 interleaves the replicas: ranks 0 and 1 hold KV head 0. A damaged second copy is named.
    shard = model_dir / "dp_rank_00_tp_rank_01_pp_rank_00.pt"
    state = torch.load(shard, weights_only=True)
    k = state["model.layers.0.self_attn.qkv_proj.weight_k"]
    original = k.clone()
    k[0, 0] += 1.0
    torch.save(state, shard)
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "good"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back"), *base, check=False)
    assert out.returncode == 2 and f"{shard.name}: its copy of KV head 0 in layer 0 differs" in out.stderr
    # --verify reads every written copy back against the source, not just one of them.
    with pytest.raises(ConvertError, match=f"{shard.name}: model.layers.0.self_attn.qkv_proj.weight_k differs"):
        verify(HFCheckpoint(src), model_dir, layout("trn2"))
    state["model.layers.0.self_attn.qkv_proj.weight_k"] = original
    state["model.layers.0.input_layernorm.weight"][3] = 7.0
    torch.save(state, shard)
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "good"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back"), *base, check=False)
    assert out.returncode == 2, out.stderr
    assert f"{shard.name}: model.layers.0.input_layernorm.weight differs from tp rank 0's copy" in out.stderr
    # Flags that do not describe the checkpoint (it holds weight_q/k/v, not a fused QKV): named, no traceback.
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "good"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back"), *base, "--fuse-qkv", check=False)
    assert out.returncode == 2 and "does not match --tp/--pp/--kv-multiplier/--fuse-qkv" in out.stderr
    assert "weight_qkv" in out.stderr and "Traceback" not in out.stderr and not (tmp_path / "back").exists()

    # A source tensor the layout has no place for (a bias) is not silently dropped.
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "config.json").write_text((src / "config.json").read_text())
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(tensors, extra / "model.safetensors", metadata={"format": "pt"})
    out = convert("hf-to-nxdt", "--input", str(extra), "--output", str(tmp_path / "o"), *base, "--verify", check=False)
    assert out.returncode == 2 and "lacks 1 source tensor(s)" in out.stderr and "q_proj.bias" in out.stderr
    assert not (tmp_path / "o").exists()

    # A config.json with fewer layers than the checkpoint holds.
    config = json.loads((src / "config.json").read_text())
    (extra / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    out = convert("hf-to-nxdt", "--input", str(extra), "--output", str(tmp_path / "o"), "--tp", "4", "--pp", "1",
                  "--kv-multiplier", "2", "--hw-backend", "trn2", check=False)
    assert out.returncode == 2 and "num_hidden_layers=2, but the checkpoint holds model.layers.2" in out.stderr
