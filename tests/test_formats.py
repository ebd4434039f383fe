"""The writers' bytes are pinned to their format versions (trainer/formats.py).

A stage's cache key holds its writer's format version instead of the git commit. That is only
safe while every change to a writer's bytes comes with a bumped version: these golden hashes of
tiny outputs fail when the bytes change under an unchanged version. The inputs are checked in
(tests/assets/formats/: a six-line corpus and tokenizers trained on it) or built from arithmetic,
so nothing but the writers (and the tokenizer libraries they call) moves the hashes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainer import formats

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

ASSETS = Path(__file__).parent / "assets" / "formats"

# (output, format version) -> sha256 over the output's files. Bumping a version: add its row.
GOLDEN = {
    ("tokenize megatron", 1): "d1cad461dcb54cd9d9f5ec52ce2477e3d7f14923238ba9e3f50afdc57ef010f7",
    ("tokenize nxd-arrow", 1): "7dab85b07577b71cf3dc9028811a2a1ea6503470abae9b74b9700aeb999009f8",
    ("convert torch.save", 1): "c889d0d5ef8a966eaca74858a32e1ded4e71c570b65709742182cdd5a7941833",
    ("convert xser", 1): "640e9359c900de5be45a998265ca602f6acfdb6aadc217b3215bdb14c03cbff5",
}


def tree_sha256(directory: Path, pattern: str = "*") -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob(pattern) if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def assert_golden(output: str, version: int, sha: str, constant: str) -> None:
    expected = GOLDEN.get((output, version))
    assert expected == sha, (
        f"the {output} writer's bytes changed (sha256 {sha}) under trainer/formats.py {constant} = {version}: "
        f"if the change is meant, bump {constant} to {version + 1} and add ({output!r}, {version + 1}) to GOLDEN; "
        "otherwise outputs keyed by the old version would be handed on as if they were the new bytes")


def run(*argv: str) -> None:
    out = subprocess.run([sys.executable, "-m", "trainer", *argv], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_tokenize_megatron_bytes_are_pinned_to_their_version(tmp_path):
    run("tokenize", "--input", str(ASSETS / "corpus.jsonl"), "--output-prefix", str(tmp_path / "golden"),
        "--tokenizer-type", "gpt2-bpe", "--vocab-file", str(ASSETS / "vocab.json"),
        "--merge-file", str(ASSETS / "merges.txt"), "--append-eod", "--keep-empty")
    assert_golden("tokenize megatron", formats.TOKENIZE, tree_sha256(tmp_path, "golden_*"), "TOKENIZE")


def test_tokenize_nxd_arrow_rows_are_pinned_to_their_version(tmp_path):
    """The Arrow files carry a random fingerprint of their own (datasets' state.json); the rows
    are what the writer decides."""
    from datasets import load_from_disk

    run("tokenize", "--input", str(ASSETS / "corpus.jsonl"), "--output-prefix", str(tmp_path / "golden"),
        "--tokenizer-type", "hf", "--tokenizer-model", str(ASSETS / "hf"), "--format", "nxd-arrow",
        "--seq-length", "16", "--keep-empty")
    (directory,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    rows = load_from_disk(str(directory)).to_dict()
    sha = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    assert_golden("tokenize nxd-arrow", formats.TOKENIZE, sha, "TOKENIZE")


def tiny_llama(directory: Path) -> Path:
    """A 2-layer Llama checkpoint whose weights are arithmetic, not a random draw."""
    hidden, heads, kv_heads, ffn, vocab, layers = 32, 4, 2, 48, 64, 2
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                   p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                   p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                   p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                   p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
                   p + "mlp.down_proj.weight": (hidden, ffn),
                   p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)}
    tensors = {}
    for n, (name, shape) in enumerate(sorted(shapes.items())):
        count = torch.Size(shape).numel()
        tensors[name] = (torch.arange(count, dtype=torch.float32).reshape(shape) * 0.001 + n).contiguous()
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
        "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "float32"}))
    return directory


@pytest.mark.parametrize("layout", ["torch.save", "xser"])
def test_convert_shards_are_pinned_to_their_version(layout, tmp_path):
    source = tiny_llama(tmp_path / "hf")
    run("convert", "hf-to-nxdt", "--input", str(source), "--output", str(tmp_path / "out"), "--tp", "2", "--pp", "2",
        "--kv-multiplier", "1", "--hw-backend", "trn1", *(["--xser"] if layout == "xser" else []))
    assert_golden(f"convert {layout}", formats.CONVERT, tree_sha256(tmp_path / "out"), "CONVERT")
