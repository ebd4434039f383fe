"""Every device-specific choice of the trainer, in one place.

The trainer is written against ``torch.accelerator`` and device-type-generic APIs, so CPU, CUDA
and Trainium through TorchNeuron (device ``neuron``, a PrivateUse1 backend that registers its own
process-group backend and ``torch.compile`` backend) run the same code with a different device
string. Nothing outside this module branches on the device type.
"""

from __future__ import annotations

import ctypes
import os
import resource

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import StagingOptions

# Dense bf16 peak per device, for MFU: H100 SXM 989, H200 989, A100 312 TFLOP/s (NVIDIA's
# datasheets quote twice these, "with sparsity"; the dense values are those of the table in
# https://github.com/karpathy/nanochat/issues/60). Matched against the device name; unknown
# devices report no MFU rather than a wrong one. PRETRAIN_PEAK_TFLOPS overrides for any device (e.g. a Trainium NeuronCore).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


class DeviceUnavailable(RuntimeError):
    """The config names a device this node does not have."""


def resolve(name: str) -> torch.device:
    """The device this rank computes on: ``auto`` is the current accelerator, else the CPU."""
    if name == "auto":
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        name = accelerator.type if accelerator is not None else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    found = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if found is None or found.type != name:
        raise DeviceUnavailable(f"device={name!r} is not available on this node (torch.accelerator finds "
                                f"{found or 'none'}); use device=auto or run on a node that has it")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.accelerator.set_device_index(index)
    return torch.device(name, index)


def float8_missing(device: torch.device) -> str | None:
    """Float8 matmuls (``torch._scaled_mm``) need float8 tensor cores, CUDA compute capability 8.9
    or later: None where ``device`` has them, else what it is."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if capability is not None and capability >= (8, 9):
        return None
    if capability is None:
        return f"device {device.type}"
    return f"{torch.cuda.get_device_name(device)} (compute capability {capability[0]}.{capability[1]})"


def check_float8(device: torch.device) -> None:
    if (found := float8_missing(device)) is not None:
        raise DeviceUnavailable(f"float8 training needs an NVIDIA GPU of compute capability 8.9 or later (L40S, H100, "
                                f"H200, B200); this rank has {found}: set backend.native.float8=false or run on such a GPU")


def process_group_backend(device: torch.device) -> str:
    """gloo on CPU; on an accelerator its own backend (nccl on CUDA; out-of-tree devices register
    theirs in the same map) with gloo beside it, as torchtitan does: the trainer agrees on small
    CPU tensors (the step to resume from, whether a checkpoint exists), which nccl alone refuses
    ("No backend type associated with device type cpu")."""
    backend = dist.Backend.default_device_backend_map.get(device.type)
    if backend is None:
        raise RuntimeError(f"no torch.distributed backend is registered for device type {device.type!r}")
    return backend if device.type == "cpu" else f"cpu:gloo,{device.type}:{backend}"


def compile_backend(device: torch.device) -> str:
    return "neuron" if device.type == "neuron" else "inductor"


def compile_counts(device: torch.device) -> dict[str, int | None]:
    """What torch.compile did in this process: graphs Dynamo captured and graph breaks (the same
    for every backend), and how many compiled graphs the backend's cache served or had to build.
    Those are inductor's counters (cpu, cuda); Neuron's compiler keeps its own cache, whose
    counts torch does not see: None, not a 0 that would read as "nothing compiled"."""
    from torch._dynamo.utils import counters

    inductor = compile_backend(device) == "inductor"
    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]) if inductor else None,
            "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"]) if inductor else None}


def fused_optimizer(device: torch.device) -> bool:
    """AdamW as one fused kernel on CUDA, where PyTorch's fused kernel also takes FSDP2's and
    tensor parallel's DTensors; foreach (a few kernels per parameter group) everywhere else, which
    every device type has. The CPU keeps foreach: its results stay those of the bare reference
    loop that benchmarks/train_benchmark.py compares against."""
    return device.type == "cuda"


def checkpoint_staging(device: torch.device) -> StagingOptions:
    """How an asynchronous checkpoint takes its copy of the training state before writing it.

    DCP's default makes a fresh pageable copy on the training thread at every save: on one H100
    that held the 1.5B-parameter GPU benchmark up 13.8 s a checkpoint (its 18 GB of weights and
    AdamW state), 25 steps' worth (benchmarks/train_benchmark.py gpu). Here the copy is made by
    a background thread while the next step's forward and backward run; the trainer waits for
    it only before the optimizer changes the state in place. The host buffers are made once, in
    the background after the first step, and refilled at every save (checkpoint.KeptStager):
    0.37 s of training held up by the first checkpoint on that H100, against 9.8 s when every
    save allocated and pinned them. On CUDA the copy is pinned and runs on a stream of its own
    (torchtitan's "async_with_pinned_mem"). Other accelerators copy on the training thread until
    their stream and pinning support is known.
    """
    cuda = device.type == "cuda"
    return StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                          use_async_staging=device.type in ("cpu", "cuda"), use_non_blocking_copy=cuda)


def compute_dtype(device: torch.device, precision: str) -> torch.dtype:
    """bf16 on accelerators when asked; the CPU trains in fp32 (gloo, and no bf16 speed-up there)."""
    return torch.bfloat16 if precision == "bf16" and device.type != "cpu" else torch.float32


def peak_flops(device: torch.device) -> float | None:
    if override := os.environ.get("PRETRAIN_PEAK_TFLOPS"):
        return float(override) * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
    return None


# glibc mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
# Requests at least this large get a mapping of their own while the model gets its values.
_UNIT_MMAP_THRESHOLD = 256 * 1024


def _glibc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): their allocators keep their defaults
        return None


def return_freed_units() -> bool:
    """While the model gets its values a unit at a time (model.materialize), give each unit's
    full tensors back to the system as they are freed, so that a rank's host memory holds its
    shards and one unit. glibc raises its mmap threshold to the size of every mapped chunk freed
    (its dynamic threshold, up to 32 MiB), so from the second unit on the full tensors came from
    the heap, where the shards kept between them left it fragmented: 2 to 4 layers of a 96-layer
    model stayed resident (tests/test_train_loop.py). A fixed threshold, which turns the dynamic
    one off, maps each large tensor afresh and unmaps it when freed. On the CPU
    :func:`keep_freed_memory` takes over for the steps; on an accelerator it stays, the steps'
    host tensors being few and small (a batch of token ids). Returns whether it applied."""
    libc = _glibc()
    return bool(libc and libc.mallopt(_M_MMAP_THRESHOLD, _UNIT_MMAP_THRESHOLD))


def keep_freed_memory(device: torch.device) -> bool:
    """On the CPU, keep memory that tensors free inside the process for the next step's tensors.

    glibc malloc serves large requests (activations, logits, gradients) with fresh mmap()s and
    gives them back with munmap() when freed, so every step faults all of its activation pages in
    again and the kernel zeroes them: measured on the benchmark Llama (benchmarks/train_benchmark.py),
    ~23k page faults and ~60 ms of system time in a ~420 ms step. Serving every request from the
    heap and never trimming it removes both (the allocator tuning PyTorch's CPU launcher,
    torch.backends.xeon.run_cpu, does with jemalloc/tcmalloc). The process keeps its peak
    memory, which a training process reaches every step anyway. Accelerators have their own
    caching allocators, so only the CPU is tuned; returns whether the tuning applied (glibc only).
    """
    if device.type != "cpu":
        return False
    libc = _glibc()
    return bool(libc and libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def rng_states(device: torch.device) -> dict[str, torch.Tensor]:
    """The generators a step draws from: the CPU's (data order, CPU-side init) and, on an
    accelerator, the device's own (dropout and other random ops run there). Keyed by device type,
    so a checkpoint resumed on another kind of device restores only the CPU's."""
    states = {"cpu": torch.get_rng_state()}
    if device.type != "cpu":
        states[device.type] = torch.get_device_module(device.type).get_rng_state(device)
    return states


def set_rng_states(device: torch.device, states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["cpu"])
    if device.type != "cpu" and device.type in states:
        torch.get_device_module(device.type).set_rng_state(states[device.type], device)


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def max_memory_gib(device: torch.device) -> float:
    """Peak device memory; on the CPU, the process's peak resident set."""
    if device.type == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return torch.accelerator.max_memory_allocated(device) / 2**30
