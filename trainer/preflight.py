"""``python -m trainer preflight``: what a backend needs on a compute node, checked in seconds.

    python -m trainer preflight --backend neuron --devices 32 --examples-dir ~/neuronx-distributed-training/examples
    python -m trainer preflight --backend megatron-lm --devices 8 --megatron-path /workspace/Megatron-LM
    python -m trainer preflight --backend native --devices 8 --device cuda
    python -m trainer preflight --backend torchtitan --devices 8 --device cuda --module llama3 --float8

Run as a one-node job on the partition training will use, under the cluster's setup lines (its
module loads and venv), before a many-node job is queued. Each check names what it found and, when
it fails, how to fix it. The record (stdout's last line, and ``--record``) lists every check; the
exit status is 1 when one failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from trainer.records import emit, node_name


def check(name: str, ok: bool, found: str, fix: str = "") -> dict:
    return {"check": name, "ok": ok, "found": found, "fix": "" if ok else fix}


def tool(name: str, fix: str, run: bool = False) -> dict:
    """``name`` on PATH; with ``run``, it also runs and exits 0 (its first line of output is what was found)."""
    path = shutil.which(name)
    if path is None:
        return check(name, False, "not on PATH", fix)
    if not run:
        return check(name, True, path)
    try:
        out = subprocess.run([path], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return check(name, False, f"{path} did not run: {exc}", fix)
    first = (out.stdout.strip() or out.stderr.strip()).splitlines()[:1]
    return check(name, out.returncode == 0, f"{path}: " + (first[0] if first else f"exit {out.returncode}"), fix)


def path_check(name: str, path: Path, fix: str) -> dict:
    return check(name, path.exists(), str(path) + ("" if path.exists() else " does not exist"), fix)


def neuron_checks(args: argparse.Namespace) -> list[dict]:
    """What NxDT's train.sh runs: the driver and tools, the compiler wrapper from the venv, the examples."""
    examples = Path(args.examples_dir).expanduser()
    return [
        # neuron-ls lists the node's devices and fails without the driver
        tool("neuron-ls", "install the Neuron driver and tools (aws-neuronx-dkms, aws-neuronx-tools) on the nodes, "
             "or use a partition of trn1/trn2 nodes (the cluster block's partition)", run=True),
        tool("neuron_parallel_compile", "activate the Neuron venv (torch-neuronx, neuronx-cc) in the cluster block's "
             "setup lines, e.g. 'source ~/aws_neuron_venv_pytorch/bin/activate'"),
        path_check("NxDT examples", examples / "training_orchestrator.py",
                   "clone aws-neuron/neuronx-distributed-training where the nodes see it and set "
                   "backend.neuron.examples_dir to its examples/ directory"),
    ]


def megatron_checks(args: argparse.Namespace) -> list[dict]:
    """What the runbooks' launch needs where it runs (inside the container when there is one)."""
    fix = "use a partition of GPU nodes with the NVIDIA driver (the cluster block's partition)"
    if shutil.which("nvidia-smi") is None:
        gpus = check("nvidia-smi", False, "not on PATH", fix)
    else:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=60)
        count = sum(line.startswith("GPU ") for line in out.stdout.splitlines())
        gpus = check("nvidia-smi", out.returncode == 0 and count >= args.devices, f"{count} GPU(s) visible to the job",
                     fix if out.returncode else f"cluster.devices_per_node={args.devices}: lower it, or use nodes "
                     "with that many GPUs")
    if args.megatron_path is None:  # the image stage builds it into the image, after this probe
        return [gpus]
    return [gpus, path_check("Megatron-LM", Path(args.megatron_path) / "pretrain_gpt.py",
                             "use an image with Megatron-LM at that path (backend.megatron_lm.container_image)")]


def native_checks(args: argparse.Namespace) -> list[dict]:
    """torch, and the device the trainer will resolve (trainer/train/device.py, the one rule for it)."""
    try:
        import torch

        from trainer.train.device import DeviceUnavailable, float8_missing, resolve
    except ImportError as exc:
        return [check("torch", False, str(exc), "install this project (with torch) in the Python the nodes run")]
    found = [check("torch", True, f"{torch.__version__} ({sys.executable})")]
    try:
        device = resolve(args.device)
    except DeviceUnavailable as exc:
        return found + [check(f"device {args.device}", False, str(exc),
                              f"set backend.{args.backend}.device, or use a partition whose nodes have it")]
    count = torch.accelerator.device_count() if device.type != "cpu" else args.devices
    found.append(check(f"device {args.device}", count >= args.devices, f"{device.type}: {count} device(s)",
                       f"cluster.devices_per_node={args.devices}: lower it, or use nodes with that many"))
    if args.float8:
        missing = float8_missing(device)
        found.append(check("float8", missing is None, missing or torch.cuda.get_device_name(device),
                           f"set backend.{args.backend}.float8=false, or use a partition whose GPUs have float8 "
                           "tensor cores (compute capability 8.9 or later: L40S, H100, H200, B200)"))
    return found


def importable(name: str, fix: str) -> dict:
    """Whether the nodes' Python finds the module ``name`` (not imported: torchtitan's import takes seconds)."""
    try:
        found = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a parent package is missing
        found = None
    return check(f"python module {name}", found is not None, found.origin if found else "not found", fix)


def torchtitan_checks(args: argparse.Namespace) -> list[dict]:
    """The device, as for the native trainer, and what ``python -m torchtitan.train`` imports: torchtitan,
    the config module ``--module`` names, and torchao for float8."""
    fix = "install torchtitan (pip install torchtitan==0.3.0) in the Python the nodes run"
    checks = [*native_checks(args), importable("torchtitan", fix)]
    if args.module != "llama3":  # a short name of torchtitan's own models is found inside it
        checks.append(importable(args.module, "install the package that provides it where the nodes run "
                                 "(for device=neuron, AWS's torchtitan-neuron), or set backend.torchtitan.module"))
    if args.float8:
        checks.append(importable("torchao", "install torchao (this project's float8 extra: pip install torchao==0.18.0) "
                                 "where the nodes run, or set backend.torchtitan.float8=false"))
    return checks


CHECKS = {"neuron": neuron_checks, "megatron-lm": megatron_checks, "native": native_checks,
          "torchtitan": torchtitan_checks}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer preflight", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", required=True, choices=sorted(CHECKS))
    p.add_argument("--devices", type=int, required=True, help="devices (ranks) per node the job will use")
    p.add_argument("--examples-dir", help="neuron: NxDT's examples/ directory")
    p.add_argument("--megatron-path", help="megatron-lm: the Megatron-LM checkout (left out where the image "
                   "stage builds it into the training image)")
    p.add_argument("--device", default="auto", help="native, torchtitan: the ranks' device (auto, cpu, cuda, neuron)")
    p.add_argument("--module", default="llama3", help="torchtitan: the config module its --module names")
    p.add_argument("--float8", action="store_true", help="native, torchtitan: the run trains in float8 (torchao)")
    p.add_argument("--record", help="also write the record to this file")
    args = p.parse_args(argv)
    if args.backend == "neuron" and args.examples_dir is None:
        p.error("--backend neuron needs --examples-dir")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    checks = CHECKS[args.backend](args)
    emit({"node": node_name(), "backend": args.backend, "ok": all(c["ok"] for c in checks), "checks": checks}, args.record)
    return 0 if all(c["ok"] for c in checks) else 1
