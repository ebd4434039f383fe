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
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import corpus_stages  # noqa: E402
from node_launch import NodeRun, run_node  # noqa: E402

from pretrain.presets import load_spec  # noqa: E402
from pretrain.spec import PretrainSpec  # noqa: E402
from render.megatron_lm import PRETRAIN_GPT, node_command  # noqa: E402

WARMUP_ITERATIONS = 5
NO_TE_OR_APEX = ["--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-persist-layer-norm"]
# GPT-2 small's shape, micro-batches of 8 in a global batch of 16, no activation recompute.
GPT2_SMALL = ["model.num_layers=12", "model.hidden_size=768", "model.num_attention_heads=12",
              "model.ffn_hidden_size=3072", "model.seq_length=1024", "model.max_position_embeddings=1024",
              "training.micro_batch_size=8", "training.global_batch_size=16",
              "backend.megatron_lm.recompute_activations=false"]


def megatron_version(checkout: Path) -> str:
    info = (checkout / "megatron/core/package_info.py").read_text()
    return ".".join(re.search(rf"^{part} = (\d+)", info, re.M).group(1) for part in ("MAJOR", "MINOR", "PATCH"))


def checkout_refusal() -> str | None:
    """Why the rendered launch cannot run here: no Megatron-LM where it runs it, or another release."""
    checkout = Path(PRETRAIN_GPT).parent
    version = load_spec("gpt3-7.5b-gpu").backend.megatron_lm.version
    if not (checkout / "pretrain_gpt.py").exists():
        return f"{PRETRAIN_GPT} is missing: put a Megatron-LM checkout (tag core_v{version}) at {checkout}"
    if (found := megatron_version(checkout)) != version:
        return f"{checkout} is Megatron-LM {found}; the launch is rendered for {version}"
    return None


def spec_for(work: Path, steps: int, vocab: Path, merges: Path, shape: list[str] = GPT2_SMALL,
             extra_args: list[str] = ()) -> PretrainSpec:
    """``gpt3-7.5b-gpu`` on one GPU at ``shape``: iterations instead of samples, validation every 20,
    checkpoints half-way and at the end."""
    return load_spec("gpt3-7.5b-gpu", [
        "model.size=null", "parallel.tp=1", "parallel.sequence_parallel=false",
        "training.train_samples=null", f"training.train_steps={steps}", "training.warmup_steps=10",
        "training.lr=6.0e-4", "training.min_lr=6.0e-5", "training.eval_interval=20", "training.eval_iters=5",
        f"training.checkpoint_interval={steps // 2}",
        "cluster.nodes=1", "cluster.devices_per_node=1",
        "backend.megatron_lm.container_image=null", "backend.megatron_lm.container_mounts=[]",
        "backend.megatron_lm.lr_decay_samples=null", "backend.megatron_lm.lr_warmup_samples=null",
        f"backend.megatron_lm.extra_args=[{', '.join(repr(arg) for arg in [*NO_TE_OR_APEX, *extra_args])}]",
        f"tokenizer.vocab_file={vocab}", f"tokenizer.merges_file={merges}", f"paths.root={work}", *shape])


def tokenized(spec: PretrainSpec, corpus: Path, data: Path) -> str:
    """The tokenize stage's output, the tokenizer's files beside it, where the tokenize stage keeps
    them and the launch names them."""
    dataset = corpus_stages.tokenized(spec, corpus, data)
    for file in (spec.tokenizer.vocab_file, spec.tokenizer.merges_file):
        shutil.copy(file, data / Path(file).name)
    return dataset


def launch(spec: PretrainSpec, dataset: str, run: Path, keep_log: Path | None = None) -> NodeRun:
    run.mkdir(parents=True)
    command = node_command(spec, dataset, run)
    print("launch:", command.argv[-1], flush=True)
    return run_node(command.argv, run, env=command.env, cwd=run, sampler=command.sidecar, keep_log=keep_log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--keep-log", type=Path, help="copy the node's log here")
    args = parser.parse_args()
    if refusal := checkout_refusal():
        sys.exit(refusal)

    work = Path(tempfile.mkdtemp(prefix="megatron-lm-gpu-"))
    corpus = corpus_stages.fetched_corpus(work) / corpus_stages.CORPUS
    spec = spec_for(work, args.steps, *corpus_stages.gpt2_tokenizer(work))
    dataset = tokenized(spec, corpus, work / "data")
    run = launch(spec, dataset, work / "run", args.keep_log)

    points = run.points
    validated = ", ".join(f"{step}: {p['val_loss']:.3f}" for step, p in sorted(points.items()) if "val_loss" in p)
    print(f"Megatron-LM {spec.backend.megatron_lm.version} exit {run.returncode}; iteration lines with a loss: "
          f"{len(run.steps_with_loss)} of {args.steps}; validation loss by iteration: {validated or 'none'}")
    if (step_ms := run.median("step_time_ms", WARMUP_ITERATIONS)) is not None:
        print(f"{run.loss_line()}; median {step_ms:.1f} ms an iteration after the first {WARMUP_ITERATIONS}")
    if run.returncode != 0 or run.steps_with_loss != list(range(1, args.steps + 1)):
        sys.exit(1)


if __name__ == "__main__":
    main()
