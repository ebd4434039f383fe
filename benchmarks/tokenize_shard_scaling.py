"""Shard scaling of the tokenize stage on the local Slurm cluster: the same corpus as one array
task with both CPUs, then as two array tasks with one CPU each (the CPUs split, as two nodes
would each bring their own). Equal wall times mean each shard keeps its per-CPU speed, so N
shards on N nodes scale the tokenize phase close to N-fold.

    eval "$(pretrain stack env)"; .venv/bin/python benchmarks/tokenize_shard_scaling.py \\
        [--corpus /tmp/pretrain-tokenize-bench/corpus-110mb.jsonl] [--tokenizer DIR]

Run benchmarks/tokenize_benchmark.py first: it builds the corpus and the tokenizer used here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from blocks.cluster import SlurmCluster
from jobs.node import Command
from jobs.contract import JobFailed, JobRequest
from jobs.slurm import run_array


def timed_shards(corpus: Path, tokenizer: Path, out: Path, shards: int, cpus: int) -> float:
    requests = [JobRequest(f"bench-shard-{i}", Command([
        sys.executable, "-m", "trainer", "tokenize", "--input", str(corpus), "--tokenizer-type", "gpt2-bpe",
        "--vocab-file", str(tokenizer / "vocab.json"), "--merge-file", str(tokenizer / "merges.txt"),
        "--append-eod", "--workers", str(cpus), "--shard", f"{i}/{shards}",
        "--output-prefix", str(out / f"{shards}-shards-{i}")]), time_limit_min=30, cpus_per_task=cpus)
        for i in range(shards)]
    started = time.monotonic()
    outcomes = run_array(requests, SlurmCluster(executor="slurm"), out / "jobs", poll_s=0.2)
    if any(isinstance(o, JobFailed) for o in outcomes):
        raise SystemExit("\n".join(map(str, outcomes)))
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="/tmp/pretrain-tokenize-bench/corpus-110mb.jsonl")
    parser.add_argument("--tokenizer", default="/tmp/pretrain-tokenize-bench/bpe-50257")
    parser.add_argument("--workdir", default="/tmp/pretrain-tokenize-scaling")
    args = parser.parse_args()
    corpus, out = Path(args.corpus), Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    one = timed_shards(corpus, Path(args.tokenizer), out, shards=1, cpus=2)
    two = timed_shards(corpus, Path(args.tokenizer), out, shards=2, cpus=1)
    mb = corpus.stat().st_size / 1e6
    print(f"corpus {mb:.1f} MB on the local Slurm cluster (2 CPUs), submit to last result:")
    print(f"  1 shard  x 2 CPUs: {one:6.1f} s  {mb / one:6.1f} MB/s")
    print(f"  2 shards x 1 CPU : {two:6.1f} s  {mb / two:6.1f} MB/s")
    print(f"  per-CPU efficiency of 2 shards vs 1: {one / two:.2f} (1.00 = perfect; N nodes -> N x this)")


if __name__ == "__main__":
    main()
