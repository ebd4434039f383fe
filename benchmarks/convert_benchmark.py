"""Conversion benchmark: HF -> NxDT (tp 8, pp 2) of a synthetic Llama checkpoint of at least
2 GB, against a plain copy of the same bytes on the same disk, in one run.

    .venv/bin/python benchmarks/convert_benchmark.py [--workdir DIR] [--layers 12] [--rounds 3]

Prints the conversion's wall time over the copy's (target <= 2) and its peak RSS over
1.5 x the largest output shard plus 300 MB (target <= 1), and the same for the flow's command
(with --verify), and both against a copy through user space (read, write), which is what any
program that transforms the bytes pays for writing them. Every timing ends when the data is on disk (sync) and starts with nothing left
to write back; copy and conversions alternate for ``--rounds`` rounds and the medians are
compared, because a cloud disk's write speed drifts over a few GB of writes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(args.workdir)
    source = work / f"hf-{args.layers}l"
    if not (source / "config.json").exists():
        print("writing a synthetic Llama checkpoint ...", flush=True)
        build_checkpoint(source, args.layers)
    size = sum(p.stat().st_size for p in source.glob("*.safetensors"))

    def timed(work_fn) -> float:
        os.sync()  # what earlier steps wrote is not this step's to write back
        started = time.monotonic()
        work_fn()
        os.sync()
        return time.monotonic() - started

    def copy() -> None:
        target = work / "copy"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for path in source.glob("*.safetensors"):
            shutil.copyfile(path, target / path.name)

    def copy_through_user_space() -> None:
        """The same bytes read into a buffer and written out, as any program that transforms
        them must (cp's copy_file_range moves them inside the kernel)."""
        target = work / "copy"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for path in source.glob("*.safetensors"):
            with open(path, "rb") as src, open(target / path.name, "wb") as dst:
                while chunk := src.read(8 << 20):
                    dst.write(chunk)

    out, rss = work / "nxdt", {}

    def convert(*extra: str):
        def run() -> None:
            shutil.rmtree(out, ignore_errors=True)
            _, rss[extra] = run_timed([sys.executable, "-m", "trainer", "convert", "hf-to-nxdt", "--input",
                                       str(source), "--output", str(out), "--tp", "8", "--pp", "2",
                                       "--kv-multiplier", "2", "--hw-backend", "trn1", *extra])
        return run

    times: dict[str, list[float]] = {"copy": [], "read+write": [], "convert": [], "verify": []}
    for _ in range(args.rounds):
        times["copy"].append(timed(copy))
        times["read+write"].append(timed(copy_through_user_space))
        times["convert"].append(timed(convert()))
        times["verify"].append(timed(convert("--verify")))
    copy_s, user_s, convert_s, verify_s = (statistics.median(times[k])
                                           for k in ("copy", "read+write", "convert", "verify"))
    largest = max(p.stat().st_size for p in (out / "model").glob("*.pt")) / 2**20
    allowance = 1.5 * largest + 300
    print(f"checkpoint: {size / 1e9:.2f} GB in {len(list(source.glob('*.safetensors')))} safetensors files; "
          f"tp 8, pp 2, kv multiplier 2; medians of {args.rounds} rounds "
          f"({', '.join(f'{k} ' + '/'.join(f'{t:.1f}' for t in v) for k, v in times.items())} s)")
    print(f"plain copy of the same bytes: {copy_s:6.1f} s")
    print(f"the same, read and written:   {user_s:6.1f} s")
    print(f"hf-to-nxdt:                   {convert_s:6.1f} s   ratio {convert_s / copy_s:.2f} (target <= 2); "
          f"{convert_s / user_s:.2f} of the read+write copy")
    print(f"hf-to-nxdt --verify:          {verify_s:6.1f} s   ratio {verify_s / copy_s:.2f} (the flow's command); "
          f"{verify_s / user_s:.2f} of the read+write copy")
    print(f"peak RSS {rss[()]:.0f} MB ({rss[('--verify',)]:.0f} MB with --verify); largest shard {largest:.0f} MB; "
          f"RSS / (1.5 x shard + 300 MB) = {rss[()] / allowance:.2f} ({rss[('--verify',)] / allowance:.2f}) "
          "(target <= 1)")


if __name__ == "__main__":
    main()
