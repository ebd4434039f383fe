"""The device sampler's overhead on training steps: step time with ``python -m trainer monitor``
running beside the loop against step time without it, measured in the same run.

    PYTHONPATH=. python benchmarks/monitor_overhead.py [--interval 1] [--blocks 8] [--steps 40]

The loop trains a small MLP (forward, backward, AdamW) with torch using every core, as a rank
does. Blocks with and without the sampler alternate (off, on, on, off, ...), so drift in the
machine's speed falls on both alike; the figure is the ratio of the median step times. The
sampler runs at ``--interval`` (1 s: five times the default rate, so its cost shows) and watches
this process, as it watches the job's ranks. It picks its source as on a node: NVML where NVIDIA
devices exist (then the loop still runs on the CPU: the sampler's cost is host CPU time), else /proc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--blocks", type=int, default=8, help="blocks per arm")
    parser.add_argument("--steps", type=int, default=40, help="steps per block")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    optimizer = torch.optim.AdamW(model.parameters())
    batch = torch.randn(256, 1024)

    def step() -> float:
        start = time.perf_counter()
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for _ in range(10):  # warm-up: allocator, optimizer state
        step()
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as out:
        for block in range(2 * args.blocks):
            sampling = block % 4 in (1, 2)
            sampler = None
            if sampling:
                sampler = subprocess.Popen([sys.executable, "-m", "trainer", "monitor", "--dir", out,
                                            "--interval", str(args.interval)])
                time.sleep(3)  # past its start-up (imports), which a run pays once, not per step
            times[sampling] += [step() for _ in range(args.steps)]
            if sampler is not None:
                sampler.terminate()
                sampler.wait()
        samples = sum(1 for name in os.listdir(out) for _ in open(os.path.join(out, name)))
    base, with_sampler = statistics.median(times[False]), statistics.median(times[True])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; "
          f"{len(times[False])} steps per arm; sampler every {args.interval:g} s ({samples} samples taken)")
    print(f"median step: {base * 1000:.2f} ms without the sampler, {with_sampler * 1000:.2f} ms with it")
    print(f"ratio (with / without): {with_sampler / base:.4f}  overhead: {100 * (with_sampler / base - 1):+.2f} %")


if __name__ == "__main__":
    main()
