"""Conversion benchmark: HF -> NxDT (tp 8, pp 2) of a synthetic Llama checkpoint of at least
2 GB, against a plain copy of the same bytes on the same disk, in one run.

    .venv/bin/python benchmarks/convert_benchmark.py [--workdir DIR] [--layers 12]

Prints the conversion's wall time over the copy's (target <= 2) and its peak RSS over
1.5 x the largest output shard plus 300 MB (target <= 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from timing import run_timed

# A Llama shape with GQA, fp32, about 2.7 GB at 12 layers.
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
          "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4,
          "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False, "torch_dtype": "float32"}
FILE_BYTES = 1 << 30  # HF-style shards of about 1 GB, with an index


def build_checkpoint(directory: Path, layers: int) -> int:
    config = {**CONFIG, "num_hidden_layers": layers}
    h, i, kv = config["hidden_size"], config["intermediate_size"], h_kv(config)
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], h)}
    for n in range(layers):
        p = f"model.layers.{n}"
        shapes.update({f"{p}.self_attn.q_proj.weight": (h, h), f"{p}.self_attn.k_proj.weight": (kv, h),
                       f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, h),
                       f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h),
                       f"{p}.mlp.down_proj.weight": (h, i), f"{p}.input_layernorm.weight": (h,),
                       f"{p}.post_attention_layernorm.weight": (h,)})
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (config["vocab_size"], h)})
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    weight_map, batch, batch_bytes, files, total = {}, {}, 0, 0, 0

    def flush() -> None:
        nonlocal batch, batch_bytes, files
        name = f"model-{files + 1:05d}.safetensors"
        save_file(batch, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(batch, name))
        batch, batch_bytes, files = {}, 0, files + 1

    for key, shape in shapes.items():
        batch[key] = torch.randn(shape, generator=generator) * 0.02
        batch_bytes += batch[key].numel() * 4
        total += batch[key].numel() * 4
        if batch_bytes >= FILE_BYTES:
            flush()
    if batch:
        flush()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config))
    return total


def h_kv(config: dict) -> int:
    return config["hidden_size"] // config["num_attention_heads"] * config["num_key_value_heads"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/var/tmp/pretrain-convert-bench")
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    work = Path(args.workdir)
    source = work / f"hf-{args.layers}l"
    if not (source / "config.json").exists():
        print("writing a synthetic Llama checkpoint ...", flush=True)
        build_checkpoint(source, args.layers)
    size = sum(p.stat().st_size for p in source.glob("*.safetensors"))

    copy = work / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    started = time.monotonic()
    for path in source.glob("*.safetensors"):
        shutil.copyfile(path, copy / path.name)
    os.sync()
    copy_s = time.monotonic() - started

    out = work / "nxdt"
    shutil.rmtree(out, ignore_errors=True)
    convert_s, rss_mb = run_timed([sys.executable, "-m", "trainer", "convert", "hf-to-nxdt", "--input", str(source),
                             "--output", str(out), "--tp", "8", "--pp", "2", "--kv-multiplier", "2",
                             "--hw-backend", "trn1"])
    os.sync()
    convert_s = max(convert_s, 1e-9)
    largest = max(p.stat().st_size for p in (out / "model").glob("*.pt")) / 2**20
    print(f"checkpoint: {size / 1e9:.2f} GB in {len(list(source.glob('*.safetensors')))} safetensors files; "
          f"tp 8, pp 2, kv multiplier 2")
    print(f"plain copy of the same bytes: {copy_s:6.1f} s")
    print(f"hf-to-nxdt:                   {convert_s:6.1f} s   ratio {convert_s / copy_s:.2f} (target <= 2)")
    print(f"peak RSS {rss_mb:.0f} MB; largest shard {largest:.0f} MB; RSS / (1.5 x shard + 300 MB) = "
          f"{rss_mb / (1.5 * largest + 300):.2f} (target <= 1)")


if __name__ == "__main__":
    main()
