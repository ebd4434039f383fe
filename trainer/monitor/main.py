"""``python -m trainer monitor --dir DIR [--tensorboard DIR] [--interval S]``: sample this node's
devices until SIGTERM or until the process that started it is gone.

Each node writes its own file, ``DIR/<node>.jsonl`` (Slurm's name for the node, which
``--exclude`` takes): the ranks' metrics stream has one writer (rank 0), a resumed run rewrites
it, and appends from many nodes to one file on a network filesystem are not atomic. The records
carry ``"kind": "device"``, so a reader of the metrics stream given them passes over them.
TensorBoard gets one run per node (``<tensorboard>/devices-<node>``), tagged
``devices/<device>/<name>(<unit>)``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from trainer.records import node_name, open_appending

# Record fields as TensorBoard tags with their units.
TAGS = {"util_pct": "util(%)", "memory_gib": "memory(GiB)", "power_w": "power(W)", "temperature_c": "temperature(C)",
        "sm_clock_mhz": "sm_clock(MHz)", "read_mb_s": "read(MB/s)", "write_mb_s": "write(MB/s)",
        "host_memory_gib": "host_memory(GiB)", "errors": "errors"}


def open_source(interval_s: float, watched: int) -> Any:
    """NVML where the node has NVIDIA devices, neuron-monitor where it has Neuron devices, else /proc."""
    if glob.glob("/dev/nvidia[0-9]*"):
        from trainer.monitor.nvml import NvmlSource

        return NvmlSource()
    if glob.glob("/dev/neuron[0-9]*") and shutil.which("neuron-monitor"):
        from trainer.monitor.neuron import NeuronSource

        return NeuronSource(interval_s)
    from trainer.monitor.procfs import CpuSource

    return CpuSource(watched)


class TensorBoard:
    """Scalars through tensorboard's own event writer: torch's SummaryWriter would make the sampler
    import torch (seconds of start-up and hundreds of MB on every node) for a few numbers."""

    def __init__(self, logdir: str):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.event, self.summary = Event, Summary
        self.writer = EventFileWriter(logdir)

    def add(self, records: list[dict], step: int, walltime: float) -> None:
        values = [self.summary.Value(tag=f"devices/{r['device']}/{tag}", simple_value=float(r[name]))
                  for r in records for name, tag in TAGS.items() if r.get(name) is not None]
        self.writer.add_event(self.event(wall_time=walltime, step=step, summary=self.summary(value=values)))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer monitor")
    parser.add_argument("--dir", required=True, help="write <dir>/<node>.jsonl")
    parser.add_argument("--tensorboard", help="TensorBoard directory; this node writes devices-<node> in it")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error(f"--interval={args.interval}: must be positive")
    # Slurm signals every process of the step ahead of its time limit (USR1/USR2 end a process
    # by default); the sampler goes on through the checkpoint the ranks write then.
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    parent = os.getppid()
    node = node_name()
    path = Path(args.dir) / f"{node}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    source = open_source(args.interval, parent)
    board = TensorBoard(str(Path(args.tensorboard) / f"devices-{node}")) if args.tensorboard else None
    step = 0
    try:
        with open_appending(path) as out:
            # the last sample is taken after SIGTERM, so a short run still has one
            while True:
                deadline = time.monotonic() + args.interval
                while not stopping and time.monotonic() < deadline and os.getppid() == parent:
                    time.sleep(min(0.5, args.interval))
                now = time.time()
                records = source.sample(args.interval)
                out.write("".join(json.dumps({"kind": "device", "node": node, "time": now, **r}) + "\n"
                                  for r in records))
                out.flush()
                if board is not None:
                    board.add(records, step, now)
                step += 1
                if stopping or os.getppid() != parent:
                    return 0
    finally:
        if hasattr(source, "close"):  # the accelerator sources hold a library or a process
            source.close()
        if board is not None:
            board.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
