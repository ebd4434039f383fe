"""``python -m trainer train --config FILE``: run under torchrun on every node, or alone.

Exit status: 0 finished, 2 bad config or bad input (data, init_from), 3 stopped on a signal after saving a checkpoint
(resumable: run the same command again), 1 failed.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from trainer import records
from trainer.train.config import TrainConfig
from trainer.train.loop import EXIT_STOPPED, Trainer


def compile_counts() -> dict[str, int]:
    """Graphs torch.compile built in this process and how many came from its cache, so the
    precompile warm-up and the training run can be compared (0 new graphs when warm)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
            "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"])}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer train")
    parser.add_argument("--config", required=True, help="the trainer config (JSON) rendered from the spec")
    parser.add_argument("--record", help="write the final record (JSON) here when the run ends")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig.from_file(args.config)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        trainer = Trainer(cfg)
    except (ValueError, FileNotFoundError) as exc:  # inputs the config points at: data, init_from
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result = trainer.train()
    finally:
        trainer.close()
    if cfg.parallel.compile and args.record and os.environ.get("LOCAL_RANK", "0") == "0":
        # Compile caches are per node: each node's first rank reports what it compiled.
        host = socket.gethostname()
        records.emit({"node": host, **compile_counts()}, f"{args.record}.compile-{host}.json")
    if trainer.rank == 0:
        records.emit(result, args.record)
    return EXIT_STOPPED if result["status"] == "stopped" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
