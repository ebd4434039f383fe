"""The ``trainer preflight`` command line of the preflight's probe job: the checks of the spec's
backend, with the paths and device counts the run's own launch will use."""

from __future__ import annotations

import sys
from pathlib import Path

from pretrain.spec import PretrainSpec
from render.megatron_lm import PRETRAIN_GPT


def preflight_command(spec: PretrainSpec, record: str) -> list[str]:
    backend = spec.backend
    argv = [sys.executable, "-m", "trainer", "preflight", "--backend", backend.kind,
            "--devices", str(spec.cluster.devices_per_node), "--record", record]
    if backend.kind == "neuron":
        return argv + ["--examples-dir", backend.neuron.examples_dir]
    if backend.kind == "megatron-lm":
        # An image the image stage builds does not exist yet when the probe runs; Megatron-LM is
        # in it by construction (render/image.py).
        return argv if backend.megatron_lm.image else argv + ["--megatron-path", str(Path(PRETRAIN_GPT).parent)]
    if backend.kind == "torchtitan":
        titan = backend.torchtitan
        return argv + ["--device", titan.device, "--module", titan.registry[0]] + (["--float8"] if titan.float8 else [])
    return argv + ["--device", backend.native.device] + (["--float8"] if backend.native.float8 else [])
