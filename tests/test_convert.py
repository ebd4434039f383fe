"""HF <-> NxDT checkpoint conversion on a small random Llama with GQA (8 heads, 2 KV heads,
tp 4, pp 2, KV multiplier 2; without qkv_linear, which replicates no KV head, tp 2), for trn1
and trn2: names and per-rank shapes, the round trip, logits computed from the shards the way
tensor-parallel layers compute them, and shards as NxD's own converter writes them. Llama-3 70B's
head placement, per-rank shapes and pipeline stages are pinned to NxD's layout for its 70B
config.json (in aws-neuron/neuronx-distributed: the converter's split and Q reorder,
``convert_full_state_to_tp`` in src/neuronx_distributed/scripts/checkpoint_converter.py; trn2's
K/V as src/neuronx_distributed/modules/qkv_linear.py lays them out; the config is
examples/training/llama/tp_pp_llama_hf_pretrain/70B_config_llama3/config.json)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import trainer.convert as converter
from pretrain.presets import load_spec
from trainer.convert import ConvertError, HFCheckpoint, shard_items, verify
from render.convert_command import convert_command
from render.nxdt import nxdt_config
from trainer.nxdt_layout import LayoutError, NxdtLayout

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

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


def convert(*args: str, check: bool = True, command: bool = False) -> subprocess.CompletedProcess:
    """``python -m trainer convert ARGS``: its status, stdout and stderr. Run as the command only
    where ``command`` says so; otherwise its ``main`` runs in this process, which has torch
    imported already (each command spends seconds importing it again, 32 times in this module)."""
    if command:
        out = subprocess.run([*CONVERT, *args], capture_output=True, text=True)
    else:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = converter.main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                status = exc.code
        out = subprocess.CompletedProcess([*CONVERT, *args], status, stdout.getvalue(), stderr.getvalue())
    if check:
        assert out.returncode == 0, out.stderr
    return out


def to_nxdt(src: Path, out: Path, backend: str, *extra: str) -> Path:
    convert("hf-to-nxdt", "--input", str(src), "--output", str(out), "--tp", str(TP), "--pp", str(PP),
            "--kv-multiplier", str(MULT), "--hw-backend", backend, *extra)
    return out / "model"


def layout(backend: str, fuse: bool = False, qkv_linear: bool = True) -> NxdtLayout:
    """The fixture's layout; without qkv_linear NxDT replicates no KV head, so tp 2 gives each
    rank one of the 2 KV heads."""
    tp, mult = (TP, MULT) if qkv_linear else (2, 1)
    return NxdtLayout(4, 8, 2, 8, tp=tp, pp=PP, kv_multiplier=mult, hw_backend=backend, fuse_qkv=fuse,
                      qkv_linear=qkv_linear)


def flags(lay: NxdtLayout) -> list[str]:
    return ["--tp", str(lay.tp), "--pp", str(lay.pp), "--kv-multiplier", str(lay.kv_multiplier), "--hw-backend",
            lay.hw_backend, *["--fuse-qkv"] * lay.fuse_qkv, *["--no-qkv-linear"] * (not lay.qkv_linear)]


def shards(model_dir: Path, tp: int = TP, pp: int = PP) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    return {(t, p): torch.load(model_dir / f"dp_rank_00_tp_rank_{t:02d}_pp_rank_{p:02d}.pt", weights_only=True)
            for t in range(tp) for p in range(pp)}


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


@pytest.mark.parametrize("backend, fuse, dtype", [("trn1", False, torch.float32), ("trn2", True, torch.float32),
                                                  ("trn1", True, torch.bfloat16)])
def test_round_trip_is_the_identity(hf_model, tmp_path, backend, fuse, dtype):
    model, src = hf_model
    if dtype != torch.float32:  # checkpoints come in bf16: the way back must not widen them
        model = LlamaForCausalLM(model.config).to(dtype)
        model.save_pretrained(tmp_path / "src", safe_serialization=True)
        src = tmp_path / "src"
    extra = ["--fuse-qkv"] if fuse else []
    # the command itself, as the convert stage's job runs it
    record = json.loads(convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "n"), "--tp", str(TP),
                                "--pp", str(PP), "--kv-multiplier", str(MULT), "--hw-backend", backend,
                                "--verify", *extra, command=True).stdout)
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
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    assert LlamaForCausalLM.from_pretrained(tmp_path / "back").config.num_key_value_heads == 2


def test_xser_layout_holds_the_same_tensors_and_converts_back(hf_model, tmp_path):
    """--xser writes torch_xla's layout (the runbooks' --save_xser; NxD training saves the same):
    a ref file naming torch_xla's TensorReference, one torch.save'd tensor per file; the way back
    reads it (a trained checkpoint comes in it) and names a tensor file that is missing."""
    model, src = hf_model
    plain = shards(to_nxdt(src, tmp_path / "plain", "trn2", "--fuse-qkv"))
    model_dir = to_nxdt(src, tmp_path / "xser", "trn2", "--fuse-qkv", "--xser", "--verify")
    shard = model_dir / "dp_rank_00_tp_rank_02_pp_rank_01.pt"
    with zipfile.ZipFile(shard) as z:
        pickled = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"ctorch_xla.utils.serialization\nTensorReference\n" in pickled  # what NxD's xser.load resolves
    files = sorted(Path(f"{shard}.tensors").iterdir(), key=lambda f: int(f.stem.split("_")[1]))
    tensors = [torch.load(f, weights_only=True) for f in files]
    assert len(tensors) == len(plain[(2, 1)])
    assert all(torch.equal(a, b) for a, b in zip(tensors, plain[(2, 1)].values()))
    flags = ["--tp", str(TP), "--pp", str(PP), "--kv-multiplier", str(MULT), "--hw-backend", "trn2", "--fuse-qkv"]
    convert("nxdt-to-hf", "--input", str(tmp_path / "xser"), "--config", str(src / "config.json"), "--output",
            str(tmp_path / "back"), *flags, "--verify")
    back = LlamaForCausalLM.from_pretrained(tmp_path / "back").state_dict()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    files[3].unlink()
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "xser"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back2"), *flags, check=False)
    assert out.returncode == 2 and f"{files[3]}: tensor 3 (" in out.stderr and "is missing" in out.stderr
    assert not (tmp_path / "back2").exists()


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_shards_hold_what_torch_save_would_with_or_without_kernel_copies(hf_model, tmp_path, monkeypatch,
                                                                         kernel_copy):
    """The writer copies row slices file to file (copy_file_range) into the layout torch.save
    gives the shard; where a filesystem refuses that, it copies through a buffer. Either way the
    shard loads as the tensors shard_items reads, in the same order, and is as large as
    torch.save's own file of them."""
    if not kernel_copy:
        def refused(*args):
            raise OSError(18, "Invalid cross-device link")
        monkeypatch.setattr(converter.os, "copy_file_range", refused)
    ckpt = HFCheckpoint(hf_model[1])
    lay = layout("trn1", fuse=True)
    converter.hf_to_nxdt(ckpt, lay, tmp_path / "out")
    for (tp_rank, pp_rank), written in shards(tmp_path / "out" / "model").items():
        expected = dict(shard_items(ckpt, lay, tp_rank, pp_rank))
        assert list(written) == list(expected)
        assert all(torch.equal(written[k], expected[k]) for k in expected)
        # torch.save names the archive's records after the file (the shard's temporary name)
        name = converter.shard_name(tp_rank, pp_rank)
        (reference := tmp_path / "reference" / f"{name}.tmp").parent.mkdir(exist_ok=True)
        torch.save(expected, reference)
        assert (tmp_path / "out" / "model" / name).stat().st_size == reference.stat().st_size


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def tensor_parallel_logits(states, lay: NxdtLayout, config: LlamaConfig, ids: torch.Tensor) -> torch.Tensor:
    """The forward pass of NxD's parallel layers, from the shards: column-parallel outputs
    joined, row-parallel outputs summed, each rank's Q heads with its own K/V heads (in order,
    as repeat_kv pairs them)."""
    hd, eps, (batch, seq), tp = lay.head_dim, config.rms_norm_eps, ids.shape, lay.tp
    qkv = ("qkv_proj.weight_q", "qkv_proj.weight_k", "qkv_proj.weight_v") if lay.qkv_linear else (
        "q_proj.weight", "k_proj.weight", "v_proj.weight")
    x = torch.cat([states[(t, 0)]["model.embed_tokens.weight"] for t in range(tp)])[ids]
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(seq)[None])
    causal = torch.full((seq, seq), float("-inf")).triu(1)
    stage = lay.stage_of_layer()
    for layer in range(lay.num_layers):
        p = f"model.layers.{layer}"
        per_rank = [states[(t, stage[layer])] for t in range(tp)]
        h = rms_norm(x, per_rank[0][f"{p}.input_layernorm.weight"], eps)
        attention = 0
        for s in per_rank:
            def heads(w):
                return (h @ w.T).view(batch, seq, -1, hd).transpose(1, 2)
            q, k, v = (heads(s[f"{p}.self_attn.{name}"]) for name in qkv)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
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
    last = [states[(t, lay.pp - 1)] for t in range(tp)]
    x = rms_norm(x, last[0]["model.norm.weight"], eps)
    return torch.cat([x @ s["lm_head.weight"].T for s in last], dim=-1)


IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("backend, qkv_linear", [("trn1", True), ("trn2", True), ("trn1", False)])
def test_logits_from_the_shards_match_the_hf_model(hf_model, tmp_path, backend, qkv_linear):
    model, src = hf_model
    lay = layout(backend, qkv_linear=qkv_linear)
    convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "nxdt"), *flags(lay))
    states = shards(tmp_path / "nxdt" / "model", lay.tp)
    with torch.no_grad():
        expected = model(IDS).logits
        ours = tensor_parallel_logits(states, lay, model.config, IDS)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------ NxD's own converter's shards


def nxd_converter_shards(state: dict[str, torch.Tensor], lay: NxdtLayout, out: Path) -> Path:
    """The shards NxD's ``checkpoint_converter.py --convert_from_full_state`` writes for the HF
    ``state``, built here from whole-tensor operations as its ``convert_full_state_to_tp`` and
    ``get_hf_to_nxd_model_keys`` lay them out (aws-neuron/neuronx-distributed
    src/neuronx_distributed/scripts/checkpoint_converter.py, commit fbac349), independently of
    the converter's per-head index arithmetic: every weight split in tp contiguous slices, except
    with qkv_linear, where K/V are tiled ``kv_multiplier`` times (``.repeat``) on trn1 and trn2
    alike, and on trn1 the blocks of Q heads (and o_proj's columns) are reordered so that rank r
    holds block ``(r % kv) * (tp // kv) + r // kv``."""
    tp, kv, mult = lay.tp, lay.num_kv_heads, lay.kv_multiplier
    if lay.qkv_linear:
        names = ("qkv_proj.weight_q", "qkv_proj.weight_k", "qkv_proj.weight_v")
    else:
        names = ("q_proj.weight", "k_proj.weight", "v_proj.weight")

    def q_blocks(w: torch.Tensor) -> list[torch.Tensor]:
        if lay.qkv_linear and lay.hw_backend == "trn1":
            return list(w.reshape(kv, tp // kv, -1, w.shape[-1]).transpose(0, 1).reshape(tp, -1, w.shape[-1]))
        return list(w.chunk(tp))

    per_stage = lay.num_layers // lay.pp  # the fixture's layers divide evenly: create_partitions' split
    (out / "model").mkdir(parents=True)
    for r in range(tp):
        for stage in range(lay.pp):
            shard: dict[str, torch.Tensor] = {}
            if stage == 0:
                shard["model.embed_tokens.weight"] = state["model.embed_tokens.weight"].chunk(tp)[r]
            for layer in range(stage * per_stage, (stage + 1) * per_stage):
                p = f"model.layers.{layer}"
                hf = {x: state[f"{p}.self_attn.{x}_proj.weight"] for x in "qkvo"}
                q = q_blocks(hf["q"])[r]
                k, v = ((hf[x].repeat(mult, 1) if lay.qkv_linear else hf[x]).chunk(tp)[r] for x in "kv")
                if lay.fuse_qkv:
                    shard[f"{p}.self_attn.qkv_proj.weight_qkv"] = torch.cat([q, k, v])
                else:
                    shard.update({f"{p}.self_attn.{name}": t for name, t in zip(names, (q, k, v))})
                shard[f"{p}.self_attn.o_proj.weight"] = q_blocks(hf["o"].T)[r].T.contiguous()
                shard[f"{p}.mlp.gate_up_proj.weight"] = torch.cat(
                    [state[f"{p}.mlp.{x}_proj.weight"].chunk(tp)[r] for x in ("gate", "up")])
                shard[f"{p}.mlp.down_proj.weight"] = state[f"{p}.mlp.down_proj.weight"].chunk(tp, dim=1)[r]
                for norm in ("input_layernorm", "post_attention_layernorm"):
                    shard[f"{p}.{norm}.weight"] = state[f"{p}.{norm}.weight"]
            if stage == lay.pp - 1:
                shard["model.norm.weight"] = state["model.norm.weight"]
                shard["lm_head.weight"] = state["lm_head.weight"].chunk(tp)[r]
            torch.save({k: t.clone() for k, t in shard.items()},
                       out / "model" / f"dp_rank_00_tp_rank_{r:02d}_pp_rank_{stage:02d}.pt")
    return out


@pytest.mark.parametrize("backend, qkv_linear, fuse", [
    ("trn1", True, False), ("trn1", True, True), ("trn1", False, False), ("trn2", False, False)])
def test_shards_as_nxds_converter_writes_them_both_ways(hf_model, tmp_path, backend, qkv_linear, fuse):
    """hf-to-nxdt writes what NxD's converter writes for trn1 (and for trn2 where it replicates no
    KV head), key for key and value for value; nxdt-to-hf gives those shards back as the HF model."""
    model, src = hf_model
    lay = layout(backend, fuse=fuse, qkv_linear=qkv_linear)
    theirs = shards(nxd_converter_shards(model.state_dict(), lay, tmp_path / "nxd") / "model", lay.tp)
    convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "ours"), *flags(lay), "--verify")
    ours = shards(tmp_path / "ours" / "model", lay.tp)
    for where, state in theirs.items():
        assert sorted(ours[where]) == sorted(state), where
        assert all(torch.equal(ours[where][key], tensor) for key, tensor in state.items()), where
    record = json.loads(convert("nxdt-to-hf", "--input", str(tmp_path / "nxd"), "--config", str(src / "config.json"),
                                "--output", str(tmp_path / "back"), *flags(lay), "--verify").stdout)
    assert record["verified_tensors"] == len(model.state_dict())
    back = LlamaForCausalLM.from_pretrained(tmp_path / "back").state_dict()
    assert all(torch.equal(back[key], tensor) for key, tensor in model.state_dict().items())


def test_trn2_shards_from_nxds_converter_are_refused_in_one_line(hf_model, tmp_path):
    """NxD's converter tiles replicated K/V on trn2, where NxD's model interleaves them: most ranks'
    query heads would attend with another group's KV head (the logits show it), so the way back
    names that placement in one line instead of reassembling a model from it."""
    model, src = hf_model
    lay = layout("trn2")
    theirs = nxd_converter_shards(model.state_dict(), lay, tmp_path / "nxd")
    with torch.no_grad():
        wrong = tensor_parallel_logits(shards(theirs / "model"), lay, model.config, IDS)
        assert not torch.allclose(wrong, model(IDS).logits, atol=1e-3)
    out = convert("nxdt-to-hf", "--input", str(theirs), "--config", str(src / "config.json"), "--output",
                  str(tmp_path / "back"), *flags(lay), check=False)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert ("model.layers.0: the shards hold K/V tiled (tp rank r holds KV head r % 2), as NxD's "
            "checkpoint_converter.py writes them for trn1 and trn2 alike") in out.stderr
    assert "pair query heads with the wrong KV group" in out.stderr and "--hw-backend trn1" in out.stderr
    assert not (tmp_path / "back").exists()

    # The other way round: trn2's interleaved K/V read as trn1's are named too, with the fix.
    convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "trn2"), *flags(lay))
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "trn2"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back"), *flags(layout("trn1")), check=False)
    assert out.returncode == 2 and ("the shards hold K/V interleaved (tp rank r holds KV head r // 2), as trn2's "
                                    "model places them; --hw-backend trn1 expects them tiled") in out.stderr
    assert "pass --hw-backend trn2" in out.stderr


@pytest.mark.parametrize("written, given, message", [
    (dict(), dict(qkv_linear=False),
     "the shards hold self_attn.qkv_proj.weight_q/k/v (qkv_linear: true, fuse_qkv: false); --no-qkv-linear expects "
     "self_attn.q_proj.weight/k_proj.weight/v_proj.weight (qkv_linear: false, fuse_qkv: false): omit --no-qkv-linear"),
    (dict(qkv_linear=False), dict(),
     "the shards hold self_attn.q_proj.weight/k_proj.weight/v_proj.weight (qkv_linear: false, fuse_qkv: false); "
     "without --fuse-qkv or --no-qkv-linear the converter expects self_attn.qkv_proj.weight_q/k/v "
     "(qkv_linear: true, fuse_qkv: false): pass --no-qkv-linear"),
    (dict(fuse=True), dict(qkv_linear=False),
     "the shards hold self_attn.qkv_proj.weight_qkv (qkv_linear: true, fuse_qkv: true); --no-qkv-linear expects "
     "self_attn.q_proj.weight/k_proj.weight/v_proj.weight (qkv_linear: false, fuse_qkv: false): omit "
     "--no-qkv-linear and pass --fuse-qkv"),
    (dict(), dict(fuse=True),
     "the shards hold self_attn.qkv_proj.weight_q/k/v (qkv_linear: true, fuse_qkv: false); --fuse-qkv expects "
     "self_attn.qkv_proj.weight_qkv (qkv_linear: true, fuse_qkv: true): omit --fuse-qkv"),
])
def test_shards_in_another_qkv_layout_are_named_with_the_flag_that_fixes_it(hf_model, tmp_path, written, given,
                                                                           message):
    _, src = hf_model
    # tp 2 without replication: every layout of the fixture is valid at these sizes
    write, read = (NxdtLayout(4, 8, 2, 8, tp=2, pp=PP, hw_backend="trn1", **{
        "fuse_qkv": kw.get("fuse", False), "qkv_linear": kw.get("qkv_linear", True)}) for kw in (written, given))
    convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "n"), *flags(write))
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "n"), "--config", str(src / "config.json"), "--output",
                  str(tmp_path / "back"), *flags(read), check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "KeyError" not in out.stderr, out.stderr
    assert f"error: dp_rank_00_tp_rank_00_pp_rank_00.pt: {message}\n" == out.stderr
    assert not (tmp_path / "back").exists()


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
    assert out.returncode == 2 and "parallel.tp=3 does not divide model.num_attention_heads=8" in out.stderr
    out = convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o4"), "--tp", "4",
                  "--kv-multiplier", "4", "--hw-backend", "trn1", check=False)
    # the converter's own rule, not NxD's
    assert out.returncode == 2 and "must equal parallel.tp=4; set parallel.kv_replicator=2" in out.stderr
    out = convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o4"), "--tp", "4",
                  "--kv-multiplier", "3", "--hw-backend", "trn1", check=False)
    assert out.returncode == 2 and "parallel.kv_replicator=3 must divide parallel.tp=4 (NxD's" in out.stderr

    odd_ffn = tmp_path / "odd-ffn"  # 98 MLP rows over tp 4: NxD asserts divisibility, it does not pad
    LlamaForCausalLM(LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2,
                                 intermediate_size=98, vocab_size=128)).save_pretrained(odd_ffn)
    out = convert("hf-to-nxdt", "--input", str(odd_ffn), "--output", str(tmp_path / "o5"), *base, check=False)
    assert out.returncode == 2 and "intermediate_size 98 is not divisible by tp=4" in out.stderr
    assert not (tmp_path / "o5").exists()

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
    torch.save(state, shard)
    # Flags that do not describe the checkpoint (one pipeline stage where it has two): named, no traceback.
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "good"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back"), *base, "--pp", "1", check=False)
    assert out.returncode == 2 and "does not match --tp/--pp/--kv-multiplier/--fuse-qkv/--qkv-linear" in out.stderr
    assert "model.layers.2" in out.stderr and "Traceback" not in out.stderr and not (tmp_path / "back").exists()
    state["model.layers.0.input_layernorm.weight"][3] = 7.0
    torch.save(state, shard)
    out = convert("nxdt-to-hf", "--input", str(tmp_path / "good"), "--config", str(src / "config.json"),
                  "--output", str(tmp_path / "back"), *base, check=False)
    assert out.returncode == 2, out.stderr
    assert f"{shard.name}: model.layers.0.input_layernorm.weight differs from tp rank 0's copy" in out.stderr

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

    # Equal values in another dtype are not the source either (torch.equal alone would pass them).
    model_dir = to_nxdt(src, tmp_path / "widened", "trn2")
    state = torch.load(model_dir / shard.name, weights_only=True)
    state["model.layers.1.mlp.down_proj.weight"] = state["model.layers.1.mlp.down_proj.weight"].double()
    torch.save(state, model_dir / shard.name)
    with pytest.raises(ConvertError, match="down_proj.weight is torch.float64, the HF checkpoint's is torch.float32"):
        verify(HFCheckpoint(src), model_dir, layout("trn2"))


# ------------------------------------------------------------------ NxD's rules and the converter's own


@pytest.mark.parametrize("kv_heads, head_dim, tp, mult, message", [
    # NxD's GQAQKVColumnParallelLinear (aws-neuron/neuronx-distributed
    # src/neuronx_distributed/modules/qkv_linear.py): tp % kv_size_multiplier == 0 ...
    (2, 8, 4, 3, r"parallel.kv_replicator=3 must divide parallel.tp=4 \(NxD's"),
    # ... and (kv_heads * head_dim * kv_size_multiplier) % tp == 0, which whole KV heads per rank
    # imply: 1 x 2 x 2 = 4 rows over 8 ranks fail both.
    (1, 2, 8, 2, r"model.num_kv_heads=1 x parallel.kv_replicator=2 is not divisible by parallel.tp=8: "
                 r"set parallel.kv_replicator to one of \[8\]"),
    # NxD would split 2 x 8 x 1 = 16 rows over 8 ranks, half a KV head each; the converter moves whole heads.
    (2, 8, 8, 1, r"model.num_kv_heads=2 x parallel.kv_replicator=1 is not divisible by parallel.tp=8: "
                 r"set parallel.kv_replicator to one of \[4, 8\]"),
    (2, 8, 4, 4, r"the converter \(model.init_from\) gives each rank one replicated KV head, so "
                 r"model.num_kv_heads=2 x kv_replicator must equal parallel.tp=4; set parallel.kv_replicator=2"),
])
def test_kv_multiplier_rules_name_whose_rule_is_broken(kv_heads, head_dim, tp, mult, message):
    with pytest.raises(LayoutError, match=message):
        NxdtLayout(4, 8, kv_heads, head_dim, tp=tp, kv_multiplier=mult)


@pytest.mark.parametrize("extra, message", [
    (["--tp", "2", "--fuse-qkv"], "model.fuse_qkv=true needs model.qkv_linear=true"),
    (["--tp", "4", "--kv-multiplier", "2"], "parallel.kv_replicator=2 needs model.qkv_linear=true"),
])
def test_without_qkv_linear_what_nxdt_cannot_build_is_refused_before_reading(hf_model, tmp_path, capsys, extra,
                                                                              message):
    _, src = hf_model
    args = ["hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o"), "--hw-backend", "trn1",
            "--no-qkv-linear", *extra]
    assert converter.main(args) == 2
    assert f"error: --tp/--pp/--kv-multiplier/--fuse-qkv/--qkv-linear: {message}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ config.json against the spec


def fixture_spec(src: Path, *overrides: str):
    """A spec describing the fixture's model, the way the flow renders the convert command."""
    return load_spec("tiny-local", [
        "backend.kind=neuron", "backend.neuron={instance_type: trn1}", f"parallel.tp={TP}", f"parallel.pp={PP}",
        f"parallel.kv_replicator={MULT}", "cluster.devices_per_node=8", "model.hidden_size=64",
        "model.ffn_hidden_size=96", "model.num_attention_heads=8", "model.num_kv_heads=2", "model.vocab_size=128",
        "model.seq_length=64", "model.max_position_embeddings=64", f"model.init_from={src}",
        # NxDT's Llama configs validate on nothing, and train in the precision of precision_type
        "training.eval_iters=0", "training.precision=mixed_precision", *overrides])


def test_the_rendered_command_refuses_a_checkpoint_the_spec_does_not_describe(hf_model, tmp_path):
    model, src = hf_model
    argv = convert_command(fixture_spec(src), str(src), str(tmp_path / "ok"))
    assert argv[argv.index("--expect") + 1:] == [
        "num_hidden_layers=4", "hidden_size=64", "intermediate_size=96", "num_attention_heads=8",
        "num_key_value_heads=2", "head_dim=8", "vocab_size=128"]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verified_tensors"] == len(model.state_dict())

    # The YAML would build 2 layers with a wider MLP; the checkpoint has 4 and 96.
    wrong = fixture_spec(src, "model.num_layers=2", "model.ffn_hidden_size=128")
    done = subprocess.run(convert_command(wrong, str(src), str(tmp_path / "wrong")), capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (f"{src / 'config.json'} does not describe the model of the spec: num_hidden_layers is 4, the spec says 2; "
            "intermediate_size is 96, the spec says 128. Point model.init_from at the checkpoint the spec describes, "
            "or fix the spec's model section") in done.stderr
    assert not (tmp_path / "wrong").exists()


@pytest.mark.parametrize("overrides, names", [
    ((), ["qkv_proj.weight_qkv"]),
    (("model.qkv_linear=false", "model.fuse_qkv=false", "parallel.tp=2", "parallel.kv_replicator=1"),
     ["k_proj.weight", "q_proj.weight", "v_proj.weight"]),
])
def test_the_yaml_and_the_shards_take_the_attention_layout_from_one_spec(hf_model, tmp_path, overrides, names):
    """model.qkv_linear and model.fuse_qkv render the NxDT YAML's values and the converter's key
    layout alike: the shards hold the Q/K/V tensors the model the YAML configures loads."""
    _, src = hf_model
    spec = fixture_spec(src, *overrides)
    yaml_model = nxdt_config(spec, "/data", init_checkpoint=str(tmp_path / "out"))["model"]
    assert (yaml_model["qkv_linear"], yaml_model["fuse_qkv"]) == (spec.model.qkv_linear, spec.model.fuse_qkv)
    done = subprocess.run(convert_command(spec, str(src), str(tmp_path / "out")), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    shard = torch.load(tmp_path / "out" / "model" / "dp_rank_00_tp_rank_01_pp_rank_00.pt", weights_only=True)
    assert sorted(k.removeprefix("model.layers.0.self_attn.") for k in shard
                  if k.startswith("model.layers.0.self_attn.") and "o_proj" not in k) == names


def test_expectations_apply_to_the_way_back_and_must_be_well_formed(hf_model, tmp_path, capsys):
    _, src = hf_model
    to_nxdt(src, tmp_path / "n", "trn1")
    back = ["nxdt-to-hf", "--input", str(tmp_path / "n"), "--config", str(src / "config.json"), "--output",
            str(tmp_path / "back"), "--tp", str(TP), "--pp", str(PP), "--kv-multiplier", str(MULT),
            "--hw-backend", "trn1"]
    # A config.json without num_key_value_heads means as many KV heads as heads (Hugging Face's default).
    assert converter.main([*back, "--expect", "num_key_value_heads=8", "rope_layers=3"]) == 2
    err = capsys.readouterr().err
    assert "num_key_value_heads is 2, the spec says 8; rope_layers is absent, the spec says 3" in err
    with pytest.raises(SystemExit) as exit_:
        converter.main([*back, "--expect", "num_hidden_layers"])
    assert exit_.value.code == 2 and "'num_hidden_layers': give FIELD=INTEGER" in capsys.readouterr().err


# ------------------------------------------------------------------ pipeline cuts


@pytest.mark.parametrize("pp, cuts, message", [
    (2, ["layers.1"], "'layers.1' is not a layer name of the form model.layers.N"),
    (2, ["model.layers.01"], "'model.layers.01' is not a layer name"),  # NxDT would find no such module
    (3, ["model.layers.2", "model.layers.1"], "model.layers.1 does not come after model.layers.2"),
    (3, ["model.layers.1", "model.layers.1"], "model.layers.1 does not come after model.layers.1"),
    (2, ["model.layers.4"], "model.layers.4 is beyond the last layer, model.layers.3"),
])
def test_bad_pipeline_cuts_are_refused_by_name(hf_model, tmp_path, capsys, pp, cuts, message):
    _, src = hf_model
    args = ["hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o"), "--tp", str(TP), "--pp", str(pp),
            "--kv-multiplier", str(MULT), "--hw-backend", "trn2", "--pipeline-cuts", *cuts]
    assert converter.main(args) == 2
    assert f"error: --pipeline-cuts: {message}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_malformed_cut_exits_2_without_a_traceback(hf_model, tmp_path):
    _, src = hf_model
    out = convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o"), "--tp", str(TP), "--pp", "2",
                  "--kv-multiplier", str(MULT), "--hw-backend", "trn1", "--pipeline-cuts", "model.layers.x",
                  check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "--pipeline-cuts: 'model.layers.x' is not a layer name" in out.stderr


def test_without_cuts_the_remainder_goes_to_the_last_stages_as_in_nxd(hf_model, tmp_path):
    # NxD create_partitions (aws-neuron/neuronx-distributed src/neuronx_distributed/pipeline/partition.py):
    # L//P layers each, the remainder to the last stages.
    assert [len(NxdtLayout(10, 8, 2, 8, tp=2, pp=4).layers_of_stage(s)) for s in range(4)] == [2, 2, 3, 3]
    _, src = hf_model
    record = json.loads(convert("hf-to-nxdt", "--input", str(src), "--output", str(tmp_path / "o"), "--tp", str(TP),
                                "--pp", "3", "--kv-multiplier", str(MULT), "--hw-backend", "trn1", "--verify").stdout)
    assert record["verified_tensors"] > 0
    shards = [torch.load(tmp_path / "o" / "model" / f"dp_rank_00_tp_rank_00_pp_rank_{pp:02d}.pt", weights_only=True)
              for pp in range(3)]
    assert [{int(k.split(".")[2]) for k in s if k.startswith("model.layers.")} for s in shards] == [{0}, {1}, {2, 3}]


# ------------------------------------------------------------------ nxdt-to-hf --verify


def test_nxdt_to_hf_verify_reads_the_written_safetensors_back(hf_model, tmp_path, monkeypatch, capsys):
    model, src = hf_model
    to_nxdt(src, tmp_path / "n", "trn1")
    back = ["nxdt-to-hf", "--input", str(tmp_path / "n"), "--config", str(src / "config.json"), "--tp", str(TP),
            "--pp", str(PP), "--kv-multiplier", str(MULT), "--hw-backend", "trn1"]
    record = json.loads(convert(*back, "--output", str(tmp_path / "back"), "--verify").stdout)
    assert record["verified_tensors"] == len(model.state_dict())

    # A reassembly that puts Q heads in the wrong rows: written as is, unless --verify reads it back.
    unshard = converter.unshard_stage

    def heads_reversed(*args, **kwargs):
        state = unshard(*args, **kwargs)
        if (key := "model.layers.0.self_attn.q_proj.weight") in state:
            state[key] = state[key].flip(0)
        return state

    monkeypatch.setattr(converter, "unshard_stage", heads_reversed)
    assert converter.main([*back, "--output", str(tmp_path / "unchecked")]) == 0
    assert converter.main([*back, "--output", str(tmp_path / "checked"), "--verify"]) == 2
    shard = tmp_path / "n" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.pt"
    assert (f"verify: {shard}: model.layers.0.self_attn.qkv_proj.weight_q differs from the HF checkpoint"
            in capsys.readouterr().err)
    assert not (tmp_path / "checked").exists()


# ------------------------------------------------------------------ Llama-3 70B, NxD's converter's layout


class Llama3_70B:
    """Llama-3-70B's config.json (aws-neuron/neuronx-distributed
    examples/training/llama/tp_pp_llama_hf_pretrain/70B_config_llama3/config.json) with meta
    tensors: the converter's own slicing runs and gives every per-rank shape, and no byte is read or allocated."""

    config = {"hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256, "num_attention_heads": 64,
              "num_key_value_heads": 8, "num_hidden_layers": 80}
    where = {"lm_head.weight": "meta"}  # not tied

    def rows(self, key, start, stop):   # every row-split Llama weight has `hidden` columns
        return torch.empty(stop - start, 8192, device="meta")

    def cols(self, key, start, stop):   # and every column-split one `hidden` rows
        return torch.empty(8192, stop - start, device="meta")

    def full(self, key):                # the norms
        return torch.empty(8192, device="meta")


def llama3_70b(backend: str, pp: int, cuts: tuple[int, ...] = (), fuse: bool = False) -> NxdtLayout:
    return NxdtLayout(80, 64, 8, 128, tp=32, pp=pp, kv_multiplier=4, hw_backend=backend, fuse_qkv=fuse,
                      pipeline_cuts=cuts)


def per_rank_shapes(lay: NxdtLayout, tp_rank: int, pp_rank: int) -> dict[str, list[int]]:
    """Shapes of one shard, every layer's under model.layers.N (they must all agree)."""
    shapes: dict[str, list[int]] = {}
    for key, tensor in shard_items(Llama3_70B(), lay, tp_rank, pp_rank):
        name = ".".join("N" if part.isdigit() else part for part in key.split("."))
        assert shapes.setdefault(name, list(tensor.shape)) == list(tensor.shape), key
    return shapes


@pytest.mark.parametrize("backend, pp", [("trn1", 8), ("trn2", 4)])
def test_llama3_70b_per_rank_shapes_are_the_references(backend, pp):
    # Llama-3-70B per-rank shapes at tp=32, kv multiplier 4, as NxD's convert_full_state_to_tp splits
    # them (each split dimension / 32, K/V after x4 replication): the same on both.
    attn, mlp, vocab = "model.layers.N.self_attn", "model.layers.N.mlp", [4008, 8192]
    layer = {f"{attn}.o_proj.weight": [8192, 256], f"{mlp}.gate_up_proj.weight": [1792, 8192],
             f"{mlp}.down_proj.weight": [8192, 896], "model.layers.N.input_layernorm.weight": [8192],
             "model.layers.N.post_attention_layernorm.weight": [8192]}
    unfused = {f"{attn}.qkv_proj.weight_q": [256, 8192], f"{attn}.qkv_proj.weight_k": [128, 8192],
               f"{attn}.qkv_proj.weight_v": [128, 8192]}
    for rank in (0, 13, 31):
        first, last = (per_rank_shapes(llama3_70b(backend, pp), rank, s) for s in (0, pp - 1))
        assert first == {"model.embed_tokens.weight": vocab, **unfused, **layer}
        assert last == {**unfused, **layer, "model.norm.weight": [8192], "lm_head.weight": vocab}
        fused = per_rank_shapes(llama3_70b(backend, pp, fuse=True), rank, 1)
        assert fused == {f"{attn}.qkv_proj.weight_qkv": [512, 8192], **layer}   # 256 + 128 + 128


def test_llama3_70b_head_placement_is_the_references():
    trn1, trn2 = llama3_70b("trn1", 8), llama3_70b("trn2", 4)
    for r in range(32):
        # trn1 (NxD's converter's Q reorder): Q heads {8(r%8)+2(r//8), +1}, K/V head r%8 (NxD's tiling).
        assert trn1.q_heads(r) == [8 * (r % 8) + 2 * (r // 8), 8 * (r % 8) + 2 * (r // 8) + 1]
        assert trn1.kv_heads(r) == [r % 8]
        # trn2: Q heads {2r, 2r+1}, group r//4. The K/V head is r//4, the repeat_interleave NxD's
        # model uses on trn2, not the r%8 NxD's converter writes (the §1.6 pitfall).
        assert trn2.q_heads(r) == [2 * r, 2 * r + 1] and trn2.kv_heads(r) == [r // 4]
        for lay in (trn1, trn2):  # HF GQA: Q head h attends with KV head h//8
            assert all(h // 8 == lay.kv_heads(r)[0] for h in lay.q_heads(r))


def test_llama3_70b_pipeline_placement_is_the_references():
    def sizes_and_cuts(lay):
        stages = [lay.layers_of_stage(s) for s in range(lay.pp)]
        return [len(s) for s in stages], [s[-1] for s in stages[:-1]]

    # trn1, pp 8: 10 layers each, cuts at model.layers.9, 19, ..., 69 (NxDT's auto partition too).
    assert sizes_and_cuts(llama3_70b("trn1", 8)) == ([10] * 8, [9, 19, 29, 39, 49, 59, 69])
    # trn2, pp 4: what NxD's converter writes without cuts, and what the trn2 yaml's cuts ask for.
    assert sizes_and_cuts(llama3_70b("trn2", 4)) == ([20] * 4, [19, 39, 59])
    yaml_cuts = NxdtLayout.cut_indices(["model.layers.18", "model.layers.39", "model.layers.60"], 80)
    assert sizes_and_cuts(llama3_70b("trn2", 4, yaml_cuts)) == ([19, 21, 21, 19], [18, 39, 60])
