"""torchtitan trains on one GPU, launched as the torchtitan backend renders it, on text laid out
as the fetch stage leaves it; its step lines become the loss curve, tokens/s and MFU.

    python benchmarks/torchtitan_gpu.py tiny [--steps 20]
    python benchmarks/torchtitan_gpu.py 1b [--steps 60] [--float8] [--set KEY=VALUE ...]

Not a timing but the proof that belongs beside the benchmarks on a lent GPU, which the suite
(CPU only) cannot make. What it runs, in order:

1. a corpus of this machine's docstrings (``pretrain.corpus``) written as a fetch output, JSONL
   beside its MANIFEST.json, and a Llama-3-style BPE trained on it (``pretrain.toy_tokenizers``):
   nothing is downloaded;
2. the ``llama3-8b-gpu`` preset on one GPU with the chosen flavour: ``tiny`` is torchtitan's
   debugmodel (6 layers, hidden 256, vocabulary 2048), the backend's first launch; ``1b`` is the
   1B flavour (Llama 3.2 1B's shape, 1.24 B parameters, through trainer/torchtitan_configs.py) at
   the native trainer's benchmark shape (sequence 2048, batch 8), compiled, for MFU;
3. the train task's loader view of the fetch output (``tasks.train_torchtitan.loader_view``) and
   the node command ``render.torchtitan.node_command`` renders, run as a Slurm step would run it,
   with ``NNODES=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1``, from the repository root (where the nodes
   import ``trainer.torchtitan_configs``);
4. the node's log parsed by ``pretrain.log_parsers``, as the train task follows it.

Exits non-zero unless torchtitan ended well and every step's line parsed with a loss. MFU is
torchtitan's own (its FLOP count over the GPU's bf16 peak it looks up by name).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corpus_stages import fetched_corpus, llama3_tokenizer  # noqa: E402
from node_launch import NodeRun, run_node  # noqa: E402

from pretrain.presets import load_spec  # noqa: E402
from pretrain.spec import TORCHTITAN_FLAVOURS, PretrainSpec, flavour_overrides  # noqa: E402
from render.torchtitan import loader_view, node_command  # noqa: E402

WARMUP_STEPS = 5  # compile and the allocator's first steps, left out of the medians
SHAPES = {
    "tiny": ("debugmodel", ["model.seq_length=2048", "training.micro_batch_size=8", "training.global_batch_size=8",
                            "backend.torchtitan.compile=false"]),
    "1b": ("1B", ["model.seq_length=2048", "training.micro_batch_size=8", "training.global_batch_size=8",
                  "backend.torchtitan.compile=true", "backend.torchtitan.activation_checkpointing=none"]),
}


def spec_for(shape: str, work: Path, steps: int, tokenizer: Path, float8: bool, extra: list[str]):
    flavour, settings = SHAPES[shape]
    return load_spec("llama3-8b-gpu", [
        *flavour_overrides(flavour), *settings, "cluster.devices_per_node=1", f"training.train_steps={steps}", "training.warmup_steps=2",
        f"training.checkpoint_interval={max(steps // 2, 1)}", "backend.torchtitan.log_freq=1",
        f"backend.torchtitan.float8={str(float8).lower()}", f"tokenizer.path={tokenizer}", f"paths.root={work}",
        *extra])


# The nodes import trainer.torchtitan_configs from the repository root.
NODE_PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def torchtitan_refusal() -> str | None:
    """Why torchtitan cannot start on this machine, found in seconds before anything is built;
    None where it imports. torchtitan 0.3.0 imports names torch 2.12 added
    (``torch.distributed.fsdp.DataParallelMeshDims``); the lent GPU machines' image had torch 2.11
    (2026-11), and a CUDA build of torch is far more than the device tool carries."""
    done = subprocess.run([sys.executable, "-c", "import torchtitan.train, trainer.torchtitan_configs"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": NODE_PYTHONPATH}, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    import torch

    last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
    return f"torchtitan does not import with this machine's torch {torch.__version__}: {last}"


def launch(spec: PretrainSpec, fetched: Path, run: Path, keep_log: Path | None = None) -> NodeRun:
    """The train task's loader view of ``fetched`` and the rendered node command, run as one node."""
    command = node_command(spec, str(loader_view(fetched, run, spec.data)), run)
    print(f"torchtitan {spec.backend.torchtitan.registry}; launch: {command.argv[-1]}", flush=True)
    return run_node(command.argv, run, env={**command.env, "PYTHONPATH": NODE_PYTHONPATH}, sampler=command.sidecar,
                    keep_log=keep_log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--float8", action="store_true", help="the decoder's Linear layers in float8 (torchao)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another spec override")
    parser.add_argument("--keep-log", type=Path, help="copy the node's log here")
    args = parser.parse_args()
    if refusal := torchtitan_refusal():
        sys.exit(refusal)

    work = Path(tempfile.mkdtemp(prefix=f"torchtitan-{args.shape}-"))
    fetched = fetched_corpus(work)
    tokenizer = llama3_tokenizer(work, TORCHTITAN_FLAVOURS[SHAPES[args.shape][0]][4])
    spec = spec_for(args.shape, work, args.steps, tokenizer, args.float8, args.set)
    run = launch(spec, fetched, work / "run", args.keep_log)
    print(f"torchtitan exit {run.returncode}; step lines with a loss: {len(run.steps_with_loss)} of {args.steps}")
    if run.steps_with_loss:
        def median(key: str) -> float:
            return run.median(key, WARMUP_STEPS) or float("nan")
        print(f"{run.loss_line()}; after step {WARMUP_STEPS}, medians: {median('tokens_per_s_per_device'):,.0f} "
              f"tokens/s, MFU {median('mfu_pct'):.1f} %, {median('memory_gib'):.1f} GiB")
    if run.returncode != 0 or run.steps_with_loss != list(range(1, args.steps + 1)):
        sys.exit(1)


if __name__ == "__main__":
    main()
