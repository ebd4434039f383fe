"""The runbooks' node counts on this machine (issue 37): the `pretrain` flow at 8, 16 or 32 nodes
of the local Slurm cluster, losing nodes mid-training.

    PYTHONPATH=. .venv/bin/python benchmarks/runbook_nodes.py [--nodes 16] [--lose 1] [--steps 20]
        [--checkpoint-interval 3] [--stack-dir /tmp/stack16] [--base-port 8417]

Runs as root (the stack's daemons and network namespaces). It starts the Slurm cluster and the
Prefect server of a stack of its own (`pretrain stack up --only slurm --only prefect --nodes N`:
one slurmd per network namespace) on ``--base-port`` under ``--stack-dir``, apart from the main
stack and the suite's, and runs the `pretrain` flow on the tiny-local preset there, as the
runbooks run on N Trainium nodes:
one CPU rank per node, the fetch and tokenize of a local corpus (this machine's Python
docstrings), precompile's torch.compile warm-up on the N nodes, then training. While it trains,
``--lose`` nodes are lost one after another: each is struck once the run has saved a checkpoint
two intervals past the last one it resumed from, its slurmd SIGKILLed as a crashed host's goes
silent. Slurm marks the node down, the job ends NODE_FAIL, and the resubmission goes on without
it (``cluster.min_nodes`` is N less the nodes lost), resumed from the newest checkpoint.

The global batch is a micro-batch of 1 times the least common multiple of every node count the
run may go through, so that each count divides it (the spec's rule); the model is cut to 2 layers
and sequences of 32 tokens so that N ranks share the machine's CPUs. Each node lost multiplies
that batch: at 16 nodes, 240 samples losing one node (15 and 16 divide it), 1,680 losing two.

It prints the flow's wall time, each attempt of the train task (job, nodes, outcome, seconds, the
step reached) and the goodput: the step time that went into the result over the wall time
(pretrain/goodput.py, the chaos soak's arithmetic). ``--lose 0`` is the uninterrupted run to set
it against. The stack is stopped at the end unless ``--keep-stack``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the repository, and the tests' fault helpers

from deployments import stack  # noqa: E402  (the repository on the path first)
from flows.pretrain import pretrain  # noqa: E402
from jobs.nodes import expand_nodes  # noqa: E402
from jobs.slurm import query_slurm_state, queue_state  # noqa: E402
from pretrain.corpus import corpus_texts, write_jsonl  # noqa: E402
from pretrain.goodput import goodput, useful_seconds  # noqa: E402
from pretrain.metrics_records import metrics_records, step_records  # noqa: E402
from pretrain.toy_tokenizers import llama3_style  # noqa: E402
from prefect.settings import temporary_settings  # noqa: E402
from slurm_faults import Fault  # noqa: E402
from trainer.train.checkpoint import complete_steps  # noqa: E402

NAME = "runbook-nodes"  # the spec's name: the training jobs are runbook-nodes-train
JOB = f"{NAME}-train"
# The flow reports to the stack's Prefect server (its UI shows the run), not to the temporary one
# a plain flow call starts: that one missed its 20 s start-up wait here while the ranks kept both
# CPUs busy.
COMPONENTS = ("slurm", "prefect")


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def hostlist(nodes: str) -> str:
    """``node1,node2,node3`` as Slurm writes it short: ``node[1-3]``."""
    out = subprocess.run(["scontrol", "show", "hostlist", nodes], capture_output=True, text=True)
    return out.stdout.strip() or nodes


class NodeLosses(threading.Thread):
    """Loses ``count`` nodes of the training job, one at a time: each once the run has saved a
    checkpoint two intervals past the newest it had when the previous loss ended its job."""

    def __init__(self, stack_dir: Path, root: Path, count: int, interval: int):
        super().__init__(daemon=True)
        self.stack_dir, self.root, self.count, self.interval = stack_dir, root, count, interval
        self.lost: list[dict] = []
        self.error: BaseException | None = None

    def lose_node(self, job_id: str, run_dir: Path) -> int:
        """SIGKILL the slurmd of the job's last node; wait until Slurm has ended the job (its ranks
        train on until Slurm marks the node down). The newest complete checkpoint then."""
        node = expand_nodes(query_slurm_state(job_id).nodes)[-1]
        os.kill(stack.status(self.stack_dir)["slurm"][f"slurmd@{node}"], signal.SIGKILL)
        struck = time.monotonic()
        log(f"node lost: {node}'s slurmd SIGKILLed under job {job_id}")
        while queue_state(job_id) is not None:
            time.sleep(0.5)
        self.lost.append({"node": node, "job": job_id, "job_ended_after_s": time.monotonic() - struck})
        return max(complete_steps(run_dir / "checkpoints"), default=0)

    def run(self) -> None:
        newest = 0
        try:
            for _ in range(self.count):
                checkpoint = newest + 2 * self.interval
                fault = Fault(JOB, self.root, self.lose_node, after_step=checkpoint + 1, checkpoint=checkpoint,
                              timeout_s=3600)
                fault.start()
                fault.join()
                fault.check()
                newest = fault.result
        except BaseException as exc:  # reported after the flow run
            self.error = exc


def prepare(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """The stack, the corpus and the tokenizer: paths.root and the spec's overrides."""
    directory = Path(args.stack_dir)
    root = directory / "root"
    shutil.rmtree(root / "train", ignore_errors=True)  # an earlier run's, which the faults would read
    root.mkdir(parents=True, exist_ok=True)
    stack.up(directory, COMPONENTS, base_port=args.base_port, nodes=args.nodes)
    # the flow's Slurm commands; one thread per rank comes from cluster.cpus_per_task=1 (render/native.py)
    os.environ["SLURM_CONF"] = stack.environment(directory)["SLURM_CONF"]
    corpus, tokenizer = directory / "corpus.jsonl", directory / "tokenizer"
    if not corpus.exists():
        write_jsonl(corpus)
    if not (tokenizer / "tokenizer.json").exists():
        llama3_style(tokenizer, corpus_texts())
    fewest = args.nodes - args.lose
    overrides = [f"name={NAME}", f"paths.root={root}", f"tokenizer.path={tokenizer}", f"data.sources=[{{uri: {corpus}}}]",
                 "cluster.executor=slurm", f"cluster.nodes={args.nodes}", f"cluster.min_nodes={fewest}",
                 "cluster.devices_per_node=1", "cluster.cpus_per_task=1", "model.num_layers=2", "model.seq_length=32",
                 "training.micro_batch_size=1",
                 f"training.global_batch_size={math.lcm(*range(fewest, args.nodes + 1))}",
                 f"training.train_steps={args.steps}", f"training.checkpoint_interval={args.checkpoint_interval}",
                 "training.eval_iters=0", "backend.native.export_hf=false",
                 # N ranks importing torch and loading the compiled graphs on two CPUs take minutes
                 # to their first step (4.5 at 16 nodes), near tiny-local's 5-minute hang timeout
                 "backend.native.hang_timeout_min=15"]
    return root, overrides


def report(outputs: dict, started: float, ended: float, losses: NodeLosses) -> str:
    trained = outputs["train"]
    final = step_records(metrics_records(Path(trained["run_dir"]) / "metrics.jsonl"))
    run = {"state": "Completed", "final": final}
    lines = ["| attempt | job | nodes | outcome | seconds | step reached |", "|---|---|---|---|---|---|"]
    for number, a in enumerate(trained["attempts"], 1):
        nodes = a["nodes"].split(",") if a["nodes"] else []
        outcome = a["outcome"] if len(a["outcome"]) < 90 else a["outcome"][:87] + "..."
        lines.append(f"| {number} | {a['job']} | {len(nodes)}: {hostlist(a['nodes'])} | {outcome} | "
                     f"{a['seconds']:.1f} | {a['step']} |")
    lost = ", ".join(f"{x['node']} (job {x['job']} ended {x['job_ended_after_s']:.0f} s later)" for x in losses.lost)
    lines += ["", "| what | measured |", "|---|---|",
              f"| wall time, the flow | {(ended - started) / 60:.1f} min |",
              f"| precompile's nodes | {len(outputs['precompile']['nodes'])} |",
              f"| nodes lost | {len(losses.lost)}: {lost or '-'} |",
              f"| steps in the result | {len({r['step'] for r in final})} |",
              f"| useful step time | {useful_seconds(run) / 60:.1f} min |",
              f"| **goodput** | **{goodput([run], started, ended):.0%}** |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16, help="Slurm nodes, and the nodes the run trains on (default 16)")
    parser.add_argument("--lose", type=int, default=1, help="nodes lost mid-training, one after another (default 1)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--checkpoint-interval", type=int, default=3, help="steps between checkpoints (default 3)")
    parser.add_argument("--stack-dir", default="/tmp/stack16", help="the stack's directory (default /tmp/stack16)")
    parser.add_argument("--base-port", type=int, default=8417, help="the stack's first port (default 8417)")
    parser.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: the stack's daemons and network namespaces need it")
    if not 0 <= args.lose < args.nodes:
        parser.error(f"--lose {args.lose}: between 0 and {args.nodes - 1}")
    if args.steps <= 2 * args.checkpoint_interval * (args.lose + 1):
        parser.error(f"--steps {args.steps}: a loss strikes every two checkpoint intervals or more; train more than "
                     f"{2 * args.checkpoint_interval * (args.lose + 1)} steps")

    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))  # unwinds: the stack goes down
    try:
        log(f"stack on base port {args.base_port} with {args.nodes} nodes, under {args.stack_dir}")
        root, overrides = prepare(args)
        losses = NodeLosses(Path(args.stack_dir), root, args.lose, args.checkpoint_interval)
        losses.start()
        log(f"the pretrain flow on {args.nodes} nodes, losing {args.lose}: {' '.join(overrides)}")
        started = time.time()
        with temporary_settings(stack.api_settings(args.stack_dir)):
            state = pretrain("tiny-local", overrides, return_state=True)
        ended = time.time()
        if not state.is_completed():
            raise SystemExit(f"the flow run ended {state.name}: {state.message}")
        losses.join(timeout=10)
        if losses.error is not None:
            log(f"the node losses stopped short: {losses.error!r}")
        print()
        print(report(state.result(), started, ended, losses))
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"\nthe machine's load average at the end (1, 5, 15 min): {load} on {os.cpu_count()} CPUs")
        return 0
    finally:
        if not args.keep_stack:
            stack.down(args.stack_dir, COMPONENTS)


if __name__ == "__main__":
    sys.exit(main())
