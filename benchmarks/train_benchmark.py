"""Native trainer benchmarks, each a ratio measured in one run on this machine.

    .venv/bin/python benchmarks/train_benchmark.py overhead [--steps 110] [--repeats 3] [--intervals 50,10]
    .venv/bin/python benchmarks/train_benchmark.py tiny-local
    python benchmarks/train_benchmark.py gpu [--steps 30] [--micro-batch 8] [--global-batch 16]
                                             [--checkpoint-interval 10] [--smoke]
    python benchmarks/train_benchmark.py float8 [--steps 200] [--micro-batch 8] [--global-batch 16] [--layers N] [--smoke]
    python benchmarks/train_benchmark.py profile [--steps 20] [--micro-batch 8] [--global-batch 16] [--smoke]
    python benchmarks/train_benchmark.py resume [--steps 40]

overhead: wall time per step of ``python -m trainer train`` (data loading from a Megatron
dataset, metrics to JSONL + TensorBoard, async checkpoints) over a bare forward/backward/AdamW
loop on the same model and the same batch shape (target <= 1.05), once per checkpoint interval
(default: every 50 steps, and every 10 as a stress case). Each runs in a process of its own,
single-threaded, with the CPU allocator set up as the trainer sets it up
(``device.keep_freed_memory``); the bare loop also runs with glibc's default malloc, to show what
that setting is worth. The first 10 steps are warm-up.

tiny-local: ``pretrain demo`` (fetch, tokenize, precompile, train on the local Slurm cluster,
2 data-parallel CPU processes); prints its wall time (target <= 10 min) and the final train
loss over the first (target < 0.6).

gpu: ``python -m trainer train`` on one accelerator with a Llama of Llama 3.2 1B's shape (16
layers, hidden 2048, 32 heads, 8 KV heads, FFN 8192, vocab 128256; 1.5 B parameters, the
embeddings untied) at sequence 2048 in bf16 with torch.compile, micro-batches of 8 (the 80 GB of
an H100 hold them without activation checkpointing), no evaluation, async checkpoints after
steps 10 and 20 and the final one (~18 GB each: ``TMPDIR=/dev/shm`` keeps them off a slow disk);
prints the trainer's own tokens/s, MFU (from the device's dense bf16 peak) and step time, medians
after warm-up (target MFU >= 45 % on one H100); then a bare loop of the same shape on the same
device, and the trainer's overhead ratio over it (target <= 1.05) without and with the
checkpoints. Needs the trainer's dependencies beside a CUDA PyTorch (megatron-core for the dataset). ``--smoke`` runs the same path with the small overhead
model on whatever device there is, to check the command.

float8: the gpu benchmark's model, or ``--layers N`` of Llama 3 8B's layers, trained from the same
seed on the same tokenized text in bf16, then with float8 linear layers (torchao, tensorwise
dynamic scales); prints each one's tokens/s, peak memory and loss, and the speed-up (target >= 1.3x,
the final loss within 1 %). Needs a GPU of compute capability 8.9+.

profile: where the gpu benchmark's bare step spends its time, with the loss eager and compiled:
the device kernels of 3 profiled steps by kind (matrix products, attention, fused Triton kernels,
the loss, the optimizer, copies) and the longest ones, as shares of the step; the step time and
MFU of each, and the compiled loss's speed-up. ``--smoke`` runs it with the small model anywhere
(on the CPU both runs' loss is eager: the trainer compiles it on GPUs only).

resume: not a timing but the check that belongs beside it on a lent accelerator, which the suite
(CPU only) cannot make: the small model trains ``--steps`` steps on the default device, once in
fp32 and once in bf16, then again from its mid-run checkpoint (model, optimizer, scheduler, data
position and the CPU's and the device's random generators); prints the largest difference of a
resumed step's loss from the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARMUP = 10
MODEL = {"family": "llama", "num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 344, "num_attention_heads": 4,
         "num_kv_heads": 2, "vocab_size": 4096, "max_position_embeddings": 128}
SEQ, MICRO, GLOBAL = 128, 4, 16


LLAMA_1B = {"family": "llama", "num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192,
            "num_attention_heads": 32, "num_kv_heads": 8, "vocab_size": 128256, "max_position_embeddings": 2048,
            "rope_theta": 500000.0}


# Llama 3 8B's layer (the float8 benchmark repeats it as often as one GPU holds).
LLAMA_8B_LAYER = {"hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32, "num_kv_heads": 8}


def synthetic_dataset(prefix: Path, vocab_size: int = 4096, documents: int = 2000, max_length: int = 512) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16 if vocab_size < 2**16 else np.int32)
    for _ in range(documents):
        document = torch.from_numpy(rng.integers(1, vocab_size, size=int(rng.integers(64, max_length))))
        builder.add_document(document, [len(document)])
    builder.finalize(f"{prefix}.idx")


# What a bare loop runs: the CPU overhead benchmark's small model in fp32, or the GPU benchmark's
# model in bf16 with torch.compile on the default device, so each trainer run has its baseline.
CPU_SHAPE = {"model": MODEL, "seq": SEQ, "micro": MICRO, "global_batch": GLOBAL, "device": "cpu",
             "precision": "fp32", "compile": False}


def bare_loop(steps: int, shape: dict, glibc_defaults: bool = False, profile_steps: int = 0) -> float:
    """Seconds per step after warm-up: the model, AdamW and a fixed batch, nothing else. The
    trainer's own building blocks (model, per-block compile, loss, optimizer, device choices), so
    the difference to a trainer run is what the trainer adds: data loading, metrics, checkpoints
    and the per-step agreement between ranks. ``shape["compile_loss"]`` (default: as the blocks)
    compiles the loss or not; ``profile_steps``: the last steps run under torch.profiler, and
    where their time went is printed."""
    from trainer.run_layout import grad_accumulation
    from trainer.train import device as devices
    from trainer.train.config import ModelConfig, OptimConfig
    from trainer.train.loss import loss_function
    from trainer.train.model import build, materialize
    from trainer.train.optimizer import build_optimizer
    from trainer.train.parallelize import apply_compile

    device = devices.resolve(shape["device"])
    if not glibc_defaults:
        devices.keep_freed_memory(device)
    model_cfg = ModelConfig(**shape["model"])
    model = build(model_cfg)
    if shape["compile"]:
        apply_compile(model, device)
    materialize(model, model_cfg, seed=1234, device=device)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3), fused=devices.fused_optimizer(device))
    dtype = devices.compute_dtype(device, shape["precision"])
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    tokens = torch.randint(0, shape["model"]["vocab_size"], (shape["micro"], shape["seq"]), device=device)
    mask = torch.ones(tokens.shape, device=device)
    accumulation = grad_accumulation(shape["global_batch"], shape["micro"], 1)  # one rank
    token_loss = loss_function(device, shape.get("compile_loss", shape["compile"]))

    def loss() -> torch.Tensor:
        # A function, as the trainer's: the logits die on return, before the backward pass (on
        # the GPU benchmark's model they are 4 GB, which the H100 does not have to spare).
        with autocast:
            logits = model(input_ids=tokens, use_cache=False).logits
        return token_loss(logits, tokens, mask)

    stamps = []
    with contextlib.ExitStack() as profiling:
        for step in range(steps):
            if profile_steps and step == steps - profile_steps:
                profiler = profiling.enter_context(torch.profiler.profile(activities=profiled_activities()))
            for _ in range(accumulation):
                (loss() / accumulation).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            devices.synchronize(device)  # the trainer waits for each step's loss; so does the baseline
            stamps.append(time.perf_counter())
    if profile_steps:
        print("\n".join(where_time_goes(profiler, profile_steps, (stamps[-1] - stamps[-profile_steps - 1]) / profile_steps)))
    timed = steps - profile_steps  # the profiler's own cost stays out of the timing
    return (stamps[timed - 1] - stamps[WARMUP - 1]) / (timed - WARMUP)


# Kinds of device kernel by name, first match wins: attention first (the memory-efficient kernels
# are CUTLASS-built: "fmha_cutlassF..."), then cuBLAS/CUTLASS matrix products, inductor's fused
# Triton kernels (norms, RoPE, SwiGLU, the compiled loss), the eager loss, the optimizer and the
# gradient norm (multi-tensor kernels), and the rest of eager PyTorch (copies, casts, fills).
KERNEL_KINDS = [("attention", ("flash", "fmha", "sdpa", "attention")),
                ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "wgmma", "cublas")),
                ("fused (Triton)", ("triton",)),
                ("loss, eager", ("softmax", "nll_loss", "cross_entropy", "logsumexp")),
                ("optimizer, gradient norm", ("adam", "multi_tensor", "foreach")),
                ("eager elementwise, copies", ("copy", "memcpy", "memset", "fill", "cast", "elementwise"))]


def profiled_activities() -> list:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(mark in lowered for mark in marks)), "other")


def where_time_goes(profiler, steps: int, step_s: float, top: int = 15) -> list[str]:
    """The profiled steps' device kernels by kind and the longest ones, per step and as shares of
    the step's wall time; what no kernel covers is time the device waited (launches, syncs).
    Without a GPU, the CPU operators'  own time instead."""
    from torch.autograd import DeviceType

    on_device = torch.cuda.is_available()
    events = [e for e in profiler.key_averages()
              if (e.device_type == DeviceType.CUDA) == on_device and (e.self_device_time_total if on_device else e.self_cpu_time_total) > 0]
    own = {e.key: (e.self_device_time_total if on_device else e.self_cpu_time_total) / 1e6 / steps for e in events}
    calls = {e.key: e.count / steps for e in events}
    busy = sum(own.values())
    where = "device kernels" if on_device else "CPU operators (self time)"
    lines = [f"profiled {steps} steps: {step_s * 1000:.1f} ms a step; {where} {busy * 1000:.1f} ms a step "
             f"({100 * busy / step_s:.1f} % of it)", "", "| kind | ms a step | share of the step |", "|---|---:|---:|"]
    kinds: dict[str, float] = {}
    for name, seconds in own.items():
        kind = kernel_kind(name) if on_device else "operators"
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    for kind, seconds in sorted(kinds.items(), key=lambda item: -item[1]):
        lines.append(f"| {kind} | {seconds * 1000:.1f} | {100 * seconds / step_s:.1f} % |")
    lines.append(f"| no kernel running | {max(step_s - busy, 0) * 1000:.1f} | {100 * max(step_s - busy, 0) / step_s:.1f} % |")
    lines += ["", "| kernel | kind | calls a step | ms a step | share |", "|---|---|---:|---:|---:|"]
    for name, seconds in sorted(own.items(), key=lambda item: -item[1])[:top]:
        kind = kernel_kind(name) if on_device else "operator"
        lines.append(f"| `{name[:90]}` | {kind} | {calls[name]:.0f} | {seconds * 1000:.2f} | {100 * seconds / step_s:.1f} % |")
    return lines


def bare_run(steps: int, shape: dict, glibc_defaults: bool = False, profile_steps: int = 0) -> float:
    """A bare loop in a process of its own, as each trainer run has; what it prints before its
    seconds a step (a profile) is passed on."""
    command = ([sys.executable, __file__, "bare", "--steps", str(steps), "--shape", json.dumps(shape),
                "--profile-steps", str(profile_steps)] + (["--glibc-defaults"] if glibc_defaults else []))
    *printed, seconds = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
    if printed:
        print("\n".join(printed), flush=True)
    return float(seconds)


def trainer_config(work: Path, model: dict, *, steps: int, micro: int, global_batch: int, seq: int,
                   checkpoint_interval: int, keep: int = 2, data: str | None = None, **extra) -> Path:
    """A benchmark-mode trainer config, written to ``work/train.json``, over the Megatron dataset
    ``data`` (a prefix) or else a synthetic one."""
    from trainer.run_layout import checkpoint_dir

    if data is None:
        data = str(work / "data_text_document")
        synthetic_dataset(Path(data), model["vocab_size"], documents=max(2000, steps * global_batch * seq // 256),
                          max_length=max(512, seq))
    config = {"model": model, "data": {"paths": [data], "split": "100,0,0", "cache_dir": str(work / "cache")},
              "optim": {"lr": 1e-3},
              "checkpoint": {"dir": str(checkpoint_dir(work)), "interval": checkpoint_interval, "keep": keep},
              "metrics": {"jsonl_path": str(work / "metrics.jsonl"), "tensorboard_dir": str(work / "tb"),
                          "log_interval": 10},
              "steps": steps, "micro_batch_size": micro, "global_batch_size": global_batch, "seq_length": seq,
              "benchmark": True, **extra}
    (work / "train.json").write_text(json.dumps(config))
    return work / "train.json"


def run_trainer(config: Path) -> dict[int, dict]:
    """``python -m trainer train`` in a process of its own; its per-step metrics records by step."""
    subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(config)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    records = (json.loads(line) for line in (config.parent / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r for r in records if "event" not in r and "time" in r}


def trainer_run(work: Path, steps: int, checkpoint_interval: int) -> float:
    config = trainer_config(work, MODEL, steps=steps, micro=MICRO, global_batch=GLOBAL, seq=SEQ,
                            checkpoint_interval=checkpoint_interval, precision="fp32")
    times = {step: record["time"] for step, record in run_trainer(config).items()}
    return (times[steps] - times[WARMUP]) / (steps - WARMUP)


def overhead(steps: int, repeats: int, intervals: list[int]) -> None:
    """Trainer runs (one per checkpoint interval) and the bare loops alternate, ``repeats`` times
    each, so that a slow spell of a noisy machine hits all; the ratios are of the medians."""
    threads = torch.get_num_threads()
    trainer_s: dict[int, list[float]] = {interval: [] for interval in intervals}
    bare_s, default_malloc_s = [], []
    for _ in range(repeats):
        for interval in intervals:
            with tempfile.TemporaryDirectory() as tmp:
                trainer_s[interval].append(trainer_run(Path(tmp), steps, interval))
        bare_s.append(bare_run(steps, CPU_SHAPE))
        default_malloc_s.append(bare_run(steps, CPU_SHAPE, glibc_defaults=True))
    bare = statistics.median(bare_s)
    print(f"model: Llama {MODEL['num_layers']} layers, hidden {MODEL['hidden_size']}, seq {SEQ}, "
          f"global batch {GLOBAL} ({GLOBAL // MICRO} micro-batches), {threads} threads, {steps} steps, "
          f"{repeats} alternating runs each")
    print(f"bare forward/backward/AdamW loop: {bare * 1000:.1f} ms/step (runs: {_runs(bare_s)})")
    for interval, runs in trainer_s.items():
        median = statistics.median(runs)
        print(f"python -m trainer train, async checkpoint every {interval} steps: {median * 1000:.1f} ms/step "
              f"(runs: {_runs(runs)}); overhead ratio {median / bare:.3f} (target <= 1.05)")
    default = statistics.median(default_malloc_s)
    print(f"bare loop with glibc's default malloc: {default * 1000:.1f} ms/step (runs: {_runs(default_malloc_s)}); "
          f"{default / bare:.3f}x the step time with keep_freed_memory")


def _runs(seconds: list[float]) -> str:
    return ", ".join(f"{s * 1000:.1f}" for s in seconds)


def tiny_local() -> None:
    started = time.monotonic()
    subprocess.run([str(ROOT / ".venv/bin/pretrain"), "demo"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    root = Path(os.environ.get("PRETRAIN_ROOT", "~/.pretrain/data")).expanduser()
    run = max((root / "train").glob("train-*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
    losses = {}
    for line in run.read_text().splitlines():
        record = json.loads(line)
        if "loss" in record and "event" not in record:
            losses[record["step"]] = record["loss"]
    first, last = losses[min(losses)], losses[max(losses)]
    print(f"pretrain demo (fetch, tokenize, precompile, train {max(losses)} steps): {wall / 60:.1f} min (target <= 10)")
    print(f"train loss {first:.3f} -> {last:.3f}: final/initial = {last / first:.3f} (target < 0.6); "
          f"median of the last 10 steps {statistics.median(losses[s] for s in sorted(losses)[-10:]):.3f}")


def gpu(steps: int, micro: int, global_batch: int, checkpoint_interval: int, smoke: bool) -> None:
    """The trainer's throughput and MFU on one accelerator, medians of the steps after warm-up;
    then a bare loop of the same shape on the same device, for the trainer's overhead there:
    once over the steps without a checkpoint, once over all timed steps, which include what the
    asynchronous checkpoints every ``checkpoint_interval`` steps held training up (a checkpoint
    taken before the previous one is written and sealed waits for it). One checkpoint is kept, so
    that two of the 1.5B model's (~18 GB each) fit a GPU machine's /dev/shm."""
    model, seq = (MODEL, SEQ) if smoke else (LLAMA_1B, 2048)
    with tempfile.TemporaryDirectory() as tmp:
        config = trainer_config(Path(tmp), model, steps=steps, micro=micro, global_batch=global_batch, seq=seq,
                                checkpoint_interval=checkpoint_interval, keep=1, precision="bf16",
                                parallel={"compile": True})
        records = run_trainer(config)
    timed = [r for step, r in sorted(records.items()) if step > WARMUP]
    # A step's wall time runs from the previous step's record to its own: everything the loop did
    # in between (metrics, the checkpoint taken after the previous step) counts.
    between = {step: records[step]["time"] - records[step - 1]["time"] for step in records if step > WARMUP}
    after_checkpoint = {step for step in between if (step - 1) % checkpoint_interval == 0}
    steady = statistics.mean(t for step, t in between.items() if step not in after_checkpoint)
    overall = statistics.mean(between.values())

    def median(key: str) -> float | None:
        values = [r[key] for r in timed if r.get(key) is not None]
        return statistics.median(values) if values else None

    accelerator = torch.accelerator.is_available()
    print(f"device: {device_name()}; model: {model['num_layers']} layers, hidden {model['hidden_size']}, "
          f"vocab {model['vocab_size']}, seq {seq}, micro-batch {micro}, global batch {global_batch}, "
          f"{'bf16' if accelerator else 'fp32 (bf16 only on accelerators)'}, "
          f"torch.compile; {len(timed)} timed steps after {WARMUP} warm-up")
    mfu = median("mfu_pct")
    print(f"tokens/s {median('tokens_per_s'):.0f}; step time {median('step_time_ms'):.1f} ms; "
          f"MFU {'unknown (no peak for this device; set PRETRAIN_PEAK_TFLOPS)' if mfu is None else f'{mfu:.1f} %'} "
          f"(target >= 45 % on one H100); peak memory {median('memory_gib'):.1f} GiB")
    bare_s = bare_run(steps, {"model": model, "seq": seq, "micro": micro, "global_batch": global_batch,
                              "device": "auto", "precision": "bf16", "compile": True})
    print(f"bare forward/backward/AdamW loop of the same shape on the same device: {bare_s * 1000:.1f} ms/step")
    print(f"python -m trainer train, steps without a checkpoint: {steady * 1000:.1f} ms/step; overhead ratio "
          f"{steady / bare_s:.3f} (target <= 1.05)")
    if after_checkpoint:
        stalls = ", ".join(f"{between[step] - steady:.2f} s (step {step - 1})" for step in sorted(after_checkpoint))
        print(f"python -m trainer train, all timed steps with an async checkpoint every {checkpoint_interval} steps: "
              f"{overall * 1000:.1f} ms/step; overhead ratio {overall / bare_s:.3f}; the checkpoints held training "
              f"up {stalls}")


def float8(steps: int, micro: int, global_batch: int, smoke: bool, layers: int | None) -> None:
    """A model trained twice from the same seed on the same data, in bf16 and with float8 linear
    layers (torchao): tokens/s, medians after warm-up, and how far apart the two loss curves end
    (mean over the last 20 steps; one step's loss is noisy). The gpu benchmark's 1B shape, or with
    ``layers``, that many of Llama 3 8B's layers (hidden 4096, FFN 14336), where float8's matrix
    products are wide enough to pay for its casts. The data is the tokenize stage's output of this
    machine's docstrings (``corpus_stages``), so the losses fall as on text, not to a uniform
    synthetic corpus's ln(vocabulary)."""
    from corpus_stages import CORPUS, fetched_corpus, llama3_tokenizer, tokenized

    from pretrain.presets import load_spec

    model, seq = (MODEL, SEQ) if smoke else (LLAMA_1B, 2048)
    if layers:
        model = {**model, **LLAMA_8B_LAYER, "num_layers": layers}
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = fetched_corpus(Path(tmp)) / CORPUS
        tokenizer = llama3_tokenizer(Path(tmp), model["vocab_size"])
        data = tokenized(load_spec("llama3-8b-gpu", [f"tokenizer.path={tokenizer}"]), corpus, Path(tmp) / "data")
        for name, float8_on in (("bf16", False), ("float8", True)):
            work = Path(tmp) / name
            work.mkdir()
            config = trainer_config(work, model, steps=steps, micro=micro, global_batch=global_batch, seq=seq,
                                    checkpoint_interval=steps, data=data, precision="bf16",
                                    parallel={"compile": True, "float8": float8_on},
                                    checkpoint={"dir": str(work / "ckpt"), "interval": steps, "final": False})
            runs[name] = run_trainer(config)
    speed = {name: statistics.median(r["tokens_per_s"] for step, r in records.items() if step > WARMUP)
             for name, records in runs.items()}
    memory = {name: max(r["memory_gib"] for r in records.values()) for name, records in runs.items()}
    tail = {name: statistics.mean(r["loss"] for step, r in records.items() if step > steps - 20)
            for name, records in runs.items()}
    first = {name: records[1]["loss"] for name, records in runs.items()}
    print(f"device: {device_name()}; model: {model['num_layers']} layers, hidden {model['hidden_size']}, FFN "
          f"{model['ffn_hidden_size']}, vocab {model['vocab_size']}, seq {seq}, micro-batch {micro}, global batch "
          f"{global_batch}, torch.compile; {steps} steps each")
    for name in runs:
        print(f"{name}: tokens/s {speed[name]:.0f}; peak memory {memory[name]:.1f} GiB; loss {first[name]:.3f} -> "
              f"{tail[name]:.3f} (mean of the last 20 steps)")
    gap = tail["float8"] / tail["bf16"] - 1
    print(f"float8 over bf16: {speed['float8'] / speed['bf16']:.3f}x tokens/s (target >= 1.3); final loss "
          f"{100 * gap:+.2f} % of bf16's (target within 1 %)")


def profile(steps: int, micro: int, global_batch: int, smoke: bool) -> None:
    """Where the gpu benchmark's step spends its time: its bare loop with the blocks compiled, the
    loss eager and then compiled, each in a process of its own, the last 3 steps profiled; each
    one's step time over the steps before them, and MFU from it."""
    from trainer.train.config import ModelConfig
    from trainer.train.device import peak_flops, resolve
    from trainer.train.metrics import model_flops_per_token

    profiled = 3
    if steps <= WARMUP + profiled:
        sys.exit(f"profile --steps {steps}: {WARMUP} of warm-up and {profiled} profiled leave no step to time; "
                 f"use --steps {WARMUP + profiled + 1} or more")
    model, seq = (MODEL, SEQ) if smoke else (LLAMA_1B, 2048)
    shape = {"model": model, "seq": seq, "micro": micro, "global_batch": global_batch, "device": "auto",
             "precision": "bf16", "compile": True}
    per_token = model_flops_per_token(ModelConfig(**model), seq)
    peak = peak_flops(resolve("auto"))
    print(f"device: {device_name()}; model: {model['num_layers']} layers, hidden {model['hidden_size']}, vocab "
          f"{model['vocab_size']}, seq {seq}, micro-batch {micro}, global batch {global_batch}, blocks compiled; "
          f"{steps} steps, {WARMUP} of warm-up")
    seconds = {}
    for compiled in (False, True):
        print(f"\n### the loss {'compiled' if compiled else 'eager'}\n", flush=True)
        seconds[compiled] = bare_run(steps, {**shape, "compile_loss": compiled}, profile_steps=profiled)
        tokens_per_s = global_batch * seq / seconds[compiled]
        mfu = "unknown (no peak for this device)" if peak is None else f"{100 * tokens_per_s * per_token / peak:.1f} %"
        print(f"\nbare loop, loss {'compiled' if compiled else 'eager'}: {seconds[compiled] * 1000:.1f} ms a step, "
              f"{tokens_per_s:,.0f} tokens/s, MFU {mfu}")
    print(f"\nthe loss compiled over eager: {seconds[False] / seconds[True]:.3f}x steps a second")


def resume(steps: int) -> None:
    """Steps after the mid-run checkpoint, trained straight through and again after a resume."""
    from trainer.run_layout import checkpoint_dir
    from trainer.train.checkpoint import step_dir

    at = steps // 2
    for precision in ("fp32", "bf16"):
        with tempfile.TemporaryDirectory() as tmp:
            config = trainer_config(Path(tmp), MODEL, steps=steps, micro=MICRO, global_batch=GLOBAL, seq=SEQ,
                                    checkpoint_interval=at, precision=precision)
            straight = {step: r["loss"] for step, r in run_trainer(config).items()}
            shutil.rmtree(step_dir(checkpoint_dir(tmp), steps))  # the final one: the rerun starts at ``at``
            resumed = {step: r["loss"] for step, r in run_trainer(config).items()}
        after = range(at + 1, steps + 1)
        assert sorted(resumed) == sorted(straight) == list(range(1, steps + 1)), sorted(resumed)
        worst = max(abs(resumed[s] - straight[s]) for s in after)
        print(f"resume on {device_name()}, {precision}: steps {at + 1}-{steps} from the step-{at} checkpoint; "
              f"largest loss difference from the uninterrupted run {worst:.2e} (losses "
              f"{straight[at + 1]:.3f} -> {straight[steps]:.3f}){'; identical' if worst == 0 else ''}")


def device_name() -> str:
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else getattr(accelerator, "type", "cpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["overhead", "tiny-local", "gpu", "float8", "profile", "resume", "bare"],
                        help="bare: one bare loop, for overhead")
    parser.add_argument("--steps", type=int, help="default: 110 for overhead and bare, 30 for gpu, 40 for resume")
    parser.add_argument("--repeats", type=int, default=3, help="overhead: alternating runs of each")
    parser.add_argument("--intervals", default="50,10", help="overhead: checkpoint intervals to measure, in steps")
    parser.add_argument("--glibc-defaults", action="store_true", help="bare: leave malloc as glibc sets it up")
    parser.add_argument("--profile-steps", type=int, default=0, help="bare: profile the last this many steps")
    parser.add_argument("--shape", type=json.loads, default=CPU_SHAPE,
                        help="bare: model, seq, micro, global_batch, device, precision and compile, as JSON")
    parser.add_argument("--micro-batch", type=int, default=8, help="gpu: sequences per micro-batch")
    parser.add_argument("--global-batch", type=int, default=16, help="gpu: sequences per step")
    parser.add_argument("--checkpoint-interval", type=int, default=10,
                        help="gpu: steps between async checkpoints (10: two in the default 20 timed steps)")
    parser.add_argument("--layers", type=int, help="float8: this many of Llama 3 8B's layers instead of the 1B shape")
    parser.add_argument("--smoke", action="store_true", help="gpu: the small model, to check the command anywhere")
    args = parser.parse_args()
    steps = args.steps or {"gpu": 30, "float8": 200, "profile": 20, "resume": 40}.get(args.which, 110)
    if args.which == "bare":
        print(bare_loop(steps, args.shape, args.glibc_defaults, args.profile_steps))
    elif args.which == "overhead":
        overhead(steps, args.repeats, [int(i) for i in args.intervals.split(",")])
    elif args.which == "gpu":
        gpu(steps, args.micro_batch, args.global_batch, args.checkpoint_interval, args.smoke)
    elif args.which == "float8":
        float8(steps, args.micro_batch, args.global_batch, args.smoke, args.layers)
    elif args.which == "profile":
        profile(steps, args.micro_batch, args.global_batch, args.smoke)
    elif args.which == "resume":
        resume(steps)
    else:
        tiny_local()


if __name__ == "__main__":
    main()
