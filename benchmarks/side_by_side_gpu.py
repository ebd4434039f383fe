"""The native trainer, torchtitan and Megatron-LM on one GPU in one run, on the same corpus: each
one's tokens/s, MFU and peak device memory, and the native trainer's ratios to the other two.

    python benchmarks/side_by_side_gpu.py [1b|tiny] [--steps 40] [--only native,torchtitan,megatron-lm]

What runs, one after the other, each in processes of its own:

- **native**: ``python -m trainer train`` with the config the native backend renders from the
  same spec (``backend.kind=native``): a Llama of Llama 3.2 1B's shape (16 layers, hidden 2048, 32
  heads, 8 KV heads, FFN 8192, vocabulary 128256, Llama 3.1's RoPE; the embeddings untied, as the
  native trainer builds Llama: 1.5 B parameters), ``torch.compile`` per block, bf16 autocast, on
  the ``.bin/.idx`` pair the tokenize stage's own command wrote with the same tokenizer;
- **torchtitan**: torchtitan 0.3.0 from the torchtitan backend's rendered launch with its 1B
  flavour (the same shape, embeddings tied: 1.24 B parameters; the same FLOPs a token), compiled,
  reading the same corpus as the fetch stage leaves it and tokenizing it with the same tokenizer
  as it loads;
- **Megatron-LM**: ``pretrain_gpt.py`` (core_v0.16.1) from the megatron-lm backend's rendered
  launch at the nearest GPT: the same layers, widths, heads and KV heads, a GELU MLP of the same
  width (two matrices where SwiGLU has three), the vocabulary padded to 128,256 entries, the
  preset's selective recompute, Megatron's local transformer (no Transformer Engine or apex, no
  compile), on the ``.bin/.idx`` pair of a GPT-2-style BPE trained on the same corpus.

``tiny`` runs torchtitan's debugmodel shape instead, uncompiled: the same path in minutes on any
machine (torchtitan and Megatron-LM need a GPU; where they cannot start, the table says why).

All three at sequence 2048, micro-batches of 8 in a global batch of 16 (two micro-batches a
step), bf16, ``--steps`` steps, medians after step 10. One FLOP count for all:
``trainer.train.metrics.flops_per_token`` (Megatron-LM's and torchtitan's convention), over the
device's dense bf16 peak (``trainer.train.device.PEAK_BF16_FLOPS``); tokens/s are each one's
own (the native trainer's record, torchtitan's ``tps``, Megatron-LM's iteration time). Peak
memory is one measure for all: the device sampler's (NVML's memory in use, the CUDA context and
the caching allocator's reserve included), with each one's own figure beside it where it logs one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import corpus_stages  # noqa: E402
import megatron_lm_gpu  # noqa: E402
import torchtitan_gpu  # noqa: E402
from node_launch import NodeRun, run_node  # noqa: E402

from pretrain.spec import TORCHTITAN_FLAVOURS, PretrainSpec  # noqa: E402
from render import native as native_launch  # noqa: E402
from render.dataset_files import eod_id  # noqa: E402
from render.monitor import monitor_command  # noqa: E402
from trainer.train.device import peak_flops  # noqa: E402
from trainer.train.metrics import model_flops_per_token  # noqa: E402

GLOBAL, WARMUP = 16, 10
RUNS = ("native", "torchtitan", "megatron-lm")


@dataclass
class Result:
    name: str
    run: NodeRun | None
    tokens_key: str
    gflop_per_token: float
    own_memory: str | None = None
    refusal: str | None = None

    def tokens_per_s(self, tokens_per_step: int) -> float | None:
        if self.run is None:
            return None
        if self.tokens_key == "step_time_ms":  # Megatron-LM logs its iteration time, not tokens/s
            ms = self.run.median("step_time_ms", WARMUP)
            return None if ms is None else tokens_per_step * 1000 / ms
        return self.run.median(self.tokens_key, WARMUP)


def gflop_per_token(spec: PretrainSpec, gated_mlp: bool) -> float:
    return model_flops_per_token(spec.model, spec.model.seq_length, gated_mlp) / 1e9


def own_memory(run: NodeRun, what: str) -> str | None:
    figure = run.median("memory_gib", WARMUP)
    return None if figure is None else f"{figure:.1f} GiB ({what})"


def native(spec: PretrainSpec, work: Path, fetched: Path, tokenizer: Path) -> Result:
    """The tokenize stage's command on the fetched corpus, then the config the native backend
    renders for ``spec``, with no checkpoint or export at the end (nothing reads them)."""
    dataset = corpus_stages.tokenized(spec, fetched / corpus_stages.CORPUS, work / "data")
    config = native_launch.train_config(spec, dataset=dataset, run_dir=str(work),
                                        eod_id=eod_id(spec, tokenizer.parent))
    config["checkpoint"].update(final=False, interval=spec.training.steps)
    config["export_hf"] = None
    (work / "train.json").write_text(json.dumps(config))
    print("native: python -m trainer train", flush=True)
    run = run_node([sys.executable, "-m", "trainer", "train", "--config", str(work / "train.json")], work,
                   sampler=monitor_command(spec, str(work)), metrics=Path(config["metrics"]["jsonl_path"]))
    return Result("native", run, "tokens_per_s", gflop_per_token(spec, gated_mlp=True),
                  own_memory(run, "torch's max allocated"))


def torchtitan(spec: PretrainSpec, work: Path, fetched: Path) -> Result:
    if refusal := torchtitan_gpu.torchtitan_refusal():
        return Result("torchtitan", None, "", gflop_per_token(spec, gated_mlp=True), refusal=refusal)
    run = torchtitan_gpu.launch(spec, fetched, work)
    return Result("torchtitan", run, "tokens_per_s_per_device", gflop_per_token(spec, gated_mlp=True),
                  own_memory(run, "torchtitan's max reserved"))


def megatron_lm(spec: PretrainSpec, work: Path, fetched: Path) -> Result:
    """The GPT nearest the spec's Llama: the same layers, widths, heads and KV heads, a GELU MLP
    of the same width; ``--make-vocab-size-divisible-by`` pads the toy BPE's vocabulary to the
    Llama's, so the output layer costs the same. The same fetched corpus, tokenized by the
    tokenize stage's command with a GPT-2-style BPE."""
    gflop = gflop_per_token(spec, gated_mlp=False)  # the Llama's widths with two MLP matrices: the GPT's count
    if refusal := megatron_lm_gpu.checkout_refusal():
        return Result("megatron-lm", None, "", gflop, refusal=refusal)
    work.mkdir()
    m, t = spec.model, spec.training
    gpt = megatron_lm_gpu.spec_for(work, t.steps, *corpus_stages.gpt2_tokenizer(work), shape=[
        f"model.num_layers={m.num_layers}", f"model.hidden_size={m.hidden_size}",
        f"model.num_attention_heads={m.num_attention_heads}", f"model.num_kv_heads={m.kv_heads}",
        f"model.ffn_hidden_size={m.ffn_hidden_size}", f"model.seq_length={m.seq_length}",
        f"model.max_position_embeddings={m.seq_length}", f"training.micro_batch_size={t.micro_batch_size}",
        f"training.global_batch_size={t.global_batch_size}", f"training.checkpoint_interval={t.steps}",
        f"training.eval_interval={t.steps}"], extra_args=["--make-vocab-size-divisible-by", str(m.vocab_size)])
    dataset = megatron_lm_gpu.tokenized(gpt, fetched / corpus_stages.CORPUS, work / "data")
    return Result("megatron-lm", megatron_lm_gpu.launch(gpt, dataset, work / "run"), "step_time_ms", gflop)


def table(results: list[Result], tokens_per_step: int, peak: float | None) -> list[str]:
    rows = ["| run | tokens/s | MFU | GFLOP a token | peak device memory (sampler) | its own memory figure | loss |",
            "|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        if r.run is None:
            rows.append(f"| {r.name} | not run: {r.refusal} | | {r.gflop_per_token:.2f} | | | |")
            continue
        speed = r.tokens_per_s(tokens_per_step)
        mfu = "?" if speed is None or peak is None else f"{100 * speed * r.gflop_per_token * 1e9 / peak:.1f} %"
        memory = r.run.devices.get("device_memory_gib")
        ended = "" if r.run.returncode == 0 else f" (exit {r.run.returncode})"
        rows.append(f"| {r.name}{ended} | {'?' if speed is None else f'{speed:,.0f}'} | {mfu} | {r.gflop_per_token:.2f} | "
                    f"{'?' if memory is None else f'{memory:.1f} GiB'} | {r.own_memory or '-'} | {r.run.loss_line()} |")
    return rows


def ratios(results: list[Result], tokens_per_step: int) -> list[str]:
    speeds = {r.name: (speed, r.gflop_per_token) for r in results if (speed := r.tokens_per_s(tokens_per_step))}
    if "native" not in speeds:
        return []
    ours, our_gflop = speeds["native"]
    return [f"native / {name}: {ours / theirs:.3f}x tokens/s, {ours * our_gflop / (theirs * gflop):.3f}x model FLOPs/s"
            for name, (theirs, gflop) in speeds.items() if name != "native"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", nargs="?", default="1b", choices=sorted(torchtitan_gpu.SHAPES))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--only", default=",".join(RUNS), help=f"a comma-separated subset of {', '.join(RUNS)}")
    args = parser.parse_args()
    chosen = args.only.split(",")
    if unknown := set(chosen) - set(RUNS):
        sys.exit(f"--only {args.only}: {', '.join(sorted(unknown))} unknown; choose from {', '.join(RUNS)}")

    work = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    flavour, _ = torchtitan_gpu.SHAPES[args.shape]
    fetched = corpus_stages.fetched_corpus(work)
    tokenizer = corpus_stages.llama3_tokenizer(work, TORCHTITAN_FLAVOURS[flavour][4])
    same = [f"training.global_batch_size={GLOBAL}", f"training.checkpoint_interval={args.steps}"]
    spec = torchtitan_gpu.spec_for(args.shape, work, args.steps, tokenizer, False, same)
    # the same spec for the native backend, compiled where torchtitan compiles
    native_spec = torchtitan_gpu.spec_for(args.shape, work, args.steps, tokenizer, False, [
        *same, "backend.kind=native", f"backend.native.device={'cuda' if torch.cuda.is_available() else 'cpu'}",
        f"backend.native.compile={str(spec.backend.torchtitan.compile).lower()}"])
    runs = {"native": lambda: native(native_spec, work / "native", fetched, tokenizer),
            "torchtitan": lambda: torchtitan(spec, work / "torchtitan", fetched),
            "megatron-lm": lambda: megatron_lm(spec, work / "megatron-lm", fetched)}
    results = []
    for name in (name for name in RUNS if name in chosen):
        results.append(runs[name]())
        shutil.rmtree(work / name, ignore_errors=True)  # its checkpoints, off /dev/shm before the next

    t = spec.training
    tokens_per_step = t.global_batch_size * spec.model.seq_length
    peak = peak_flops(torch.device("cuda")) if torch.cuda.is_available() else None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    print(f"\n{device}, torch {torch.__version__}: sequence {spec.model.seq_length}, micro-batch {t.micro_batch_size}, "
          f"global batch {t.global_batch_size}, bf16, {t.steps} steps, medians after step {WARMUP}; MFU over "
          f"{'an unknown peak' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}")
    print("\n".join(table(results, tokens_per_step, peak) + [""] + ratios(results, tokens_per_step)))
    if any(r.run is not None and (r.run.returncode != 0 or not r.run.steps_with_loss) for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
