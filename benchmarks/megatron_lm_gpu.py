"""Megatron-LM's ``pretrain_gpt.py`` trains on one GPU, launched as the megatron-lm backend
renders it, on data the tokenize stage wrote; its log becomes the loss curve.

    python benchmarks/megatron_lm_gpu.py [--steps 60] [--keep-log FILE]

Not a timing but the proof that belongs beside the benchmarks on a lent GPU, which the suite
(CPU only) cannot make. What it runs, in order:

1. a corpus of this machine's docstrings (``pretrain.corpus``) and a GPT-2-style BPE trained on
   it (``pretrain.toy_tokenizers``): nothing is downloaded;
2. the tokenize stage's own command (``render.tokenize_command``) writing the Megatron
   ``.bin/.idx`` pair, with the tokenizer's files beside it, where the tokenize stage keeps them;
3. the ``gpt3-7.5b-gpu`` preset shrunk to a GPT of GPT-2 small's shape (12 layers, hidden 768,
   sequence 1024) on one GPU, iterations instead of samples, validation every 20 steps; its
   node command (``render.megatron_lm.node_command``) run as a Slurm step would run it, with
   ``NNODES=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1``;
4. the node's log parsed by ``pretrain.log_parsers``, as the train task follows it.

Exits non-zero unless Megatron-LM ended well and every iteration's line parsed with a loss. The
rendered launch runs ``/workspace/Megatron-LM/pretrain_gpt.py``, where the runbooks' image has
its checkout: put Megatron-LM at the preset's release there (``backend.megatron_lm.version``, tag
core_v0.16.1).
Without Transformer Engine and apex (a plain CUDA PyTorch) it needs ``--transformer-impl local``
and none of their fused kernels (gradient accumulation, masked softmax), which ``backend.megatron_lm.extra_args`` adds.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pretrain.corpus import corpus_texts, write_jsonl  # noqa: E402
from pretrain.log_parsers import parse_log  # noqa: E402
from pretrain.presets import load_spec  # noqa: E402
from pretrain.toy_tokenizers import gpt2_style  # noqa: E402
from render.dataset_files import tokenizer_paths  # noqa: E402
from render.megatron_lm import PRETRAIN_GPT, node_command  # noqa: E402
from render.tokenize_command import tokenize_command  # noqa: E402
from trainer.tokenize import output_prefix  # noqa: E402

CORPUS_BYTES = 8_000_000
NO_TE_OR_APEX = ["--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-persist-layer-norm"]


def megatron_version(checkout: Path) -> str:
    info = (checkout / "megatron/core/package_info.py").read_text()
    return ".".join(re.search(rf"^{part} = (\d+)", info, re.M).group(1) for part in ("MAJOR", "MINOR", "PATCH"))


def spec_for(work: Path, steps: int, vocab: Path, merges: Path):
    return load_spec("gpt3-7.5b-gpu", [
        "model.size=null", "model.num_layers=12", "model.hidden_size=768", "model.num_attention_heads=12",
        "model.ffn_hidden_size=3072", "model.seq_length=1024", "model.max_position_embeddings=1024",
        "parallel.tp=1", "parallel.sequence_parallel=false",
        "training.train_samples=null", f"training.train_steps={steps}", "training.warmup_steps=10",
        "training.micro_batch_size=8", "training.global_batch_size=16", "training.lr=6.0e-4",
        "training.min_lr=6.0e-5", "training.eval_interval=20", "training.eval_iters=5",
        f"training.checkpoint_interval={steps // 2}",
        "cluster.nodes=1", "cluster.devices_per_node=1",
        "backend.megatron_lm.container_image=null", "backend.megatron_lm.container_mounts=[]",
        "backend.megatron_lm.lr_decay_samples=null", "backend.megatron_lm.lr_warmup_samples=null",
        "backend.megatron_lm.recompute_activations=false",
        f"backend.megatron_lm.extra_args=[{', '.join(NO_TE_OR_APEX)}]",
        f"tokenizer.vocab_file={vocab}", f"tokenizer.merges_file={merges}", f"paths.root={work}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--keep-log", type=Path, help="copy the node's log here")
    args = parser.parse_args()
    checkout = Path(PRETRAIN_GPT).parent
    version = load_spec("gpt3-7.5b-gpu").backend.megatron_lm.version
    if not (checkout / "pretrain_gpt.py").exists():
        sys.exit(f"{PRETRAIN_GPT} is missing: put a Megatron-LM checkout (tag core_v{version}) at {checkout}")
    if (found := megatron_version(checkout)) != version:
        sys.exit(f"{checkout} is Megatron-LM {found}; the launch is rendered for {version}")

    work = Path(tempfile.mkdtemp(prefix="megatron-lm-gpu-"))
    corpus = work / "corpus.jsonl"
    documents = write_jsonl(corpus, CORPUS_BYTES, include_site_packages=True)
    vocab, merges = gpt2_style(work / "tokenizer", corpus_texts(CORPUS_BYTES))
    spec = spec_for(work, args.steps, vocab, merges)
    data = work / "data"
    data.mkdir()
    prefix = str(data / "corpus")
    subprocess.run(tokenize_command(spec, [str(corpus)], prefix, {k: str(v) for k, v in tokenizer_paths(spec, work / "tokenizer").items()},
                                    python=sys.executable), cwd=ROOT, check=True)
    dataset = output_prefix(prefix, "text")
    for file in (vocab, merges):  # beside the dataset, where the launch names them
        shutil.copy(file, data / file.name)
    print(f"corpus: {documents} documents, {corpus.stat().st_size / 1e6:.1f} MB; dataset {dataset}", flush=True)

    run = work / "run"
    run.mkdir()
    command = node_command(spec, dataset, run)
    env = {**os.environ, **command.env, "NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    print("launch:", command.argv[-1], flush=True)
    returncode = subprocess.run(command.argv, env=env, cwd=run).returncode
    log = (run / "node-0.log").read_text(errors="replace")
    if args.keep_log:
        shutil.copy(run / "node-0.log", args.keep_log)

    points = parse_log(log).points
    with_loss = sorted(step for step, point in points.items() if "loss" in point)
    validated = ", ".join(f"{step}: {p['val_loss']:.3f}" for step, p in sorted(points.items()) if "val_loss" in p)
    print(f"Megatron-LM {version} exit {returncode}; iteration lines with a loss: {len(with_loss)} of "
          f"{args.steps}; validation loss by iteration: {validated or 'none'}")
    step_ms = [points[s]["step_time_ms"] for s in with_loss[5:] if "step_time_ms" in points[s]]
    if step_ms:
        first, last = points[with_loss[0]]["loss"], points[with_loss[-1]]["loss"]
        print(f"lm loss {first:.3f} (iteration {with_loss[0]}) -> {last:.3f} (iteration {with_loss[-1]}); "
              f"median {statistics.median(step_ms):.1f} ms an iteration after the first 5")
    if returncode != 0 or with_loss != list(range(1, args.steps + 1)):
        sys.exit(1)


if __name__ == "__main__":
    main()
