"""How large a run's checkpoints are, and whether its filesystem has room for those it will write.

A run that lasts weeks writes a checkpoint every interval and keeps the newest few. If the
filesystem cannot hold them, every job of the chain fails at its first save, hours in, and the
failure budget is spent on a run that could never have saved. The train task asks first
(:func:`room_refusal`), before its first job is queued.

A checkpoint's size is estimated from the model: its parameters times the bytes each backend
saves for one, model weights and AdamW's two moments. What a backend keeps:

- native: ``backend.native.checkpoint_keep`` complete checkpoints; the next one is written in
  full before the oldest is deleted (trainer/train/checkpoint.py), so keep + 1 are on disk at once;
- torchtitan: ``checkpoint.keep_latest_k`` (``backend.torchtitan.checkpoint_keep``), purged
  after each save likewise; 0 keeps all;
- Megatron-LM deletes none (``--save`` has no retention); NxDT's ``save_top_k: 1`` with
  ``save_last`` keeps the newest as NeMo's checkpoint callback decides. For these the run needs
  room for at least one more.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pretrain.spec import PretrainSpec

# Bytes a checkpoint holds per parameter:
# - native and torchtitan: fp32 weights (FSDP2 keeps them in fp32 and casts to bf16 per
#   matmul) and AdamW's exp_avg and exp_avg_sq, fp32 each: 12. Measured on the native trainer's
#   own checkpoints in the tests (tests/test_train_loop.py).
# - Megatron-LM's distributed optimizer and NxDT's ZeRO-1: bf16 weights (2), fp32 master weights (4)
#   and the two fp32 moments (8): 14.
BYTES_PER_PARAMETER = {"native": 12, "torchtitan": 12, "megatron-lm": 14, "neuron": 14}


def parameters(spec: PretrainSpec) -> int:
    """The model's parameters: each layer's attention and MLP weights, the embedding and the output."""
    m = spec.model
    kv = m.kv_heads * m.head_dim
    attention = m.hidden_size * (m.hidden_size + 2 * kv) + m.hidden_size * m.hidden_size
    mlp = (3 if m.family == "llama" else 2) * m.hidden_size * m.ffn_hidden_size
    return m.num_layers * (attention + mlp) + 2 * m.vocab_size * m.hidden_size


def checkpoint_bytes(spec: PretrainSpec) -> int:
    return parameters(spec) * BYTES_PER_PARAMETER[spec.backend.kind]


def kept(spec: PretrainSpec) -> int | None:
    """How many complete checkpoints the backend keeps; None: all, or as its own callback decides."""
    if spec.backend.kind not in ("native", "torchtitan"):
        return None
    return spec.restarts.checkpoint_keep or None  # torchtitan's 0 keeps all


def _at_once(keep: int | None) -> int:
    """Checkpoints on disk at once: those kept and the next, written in full before the oldest
    is deleted; one more, for a backend that deletes none of its own."""
    return 1 if keep is None else keep + 1


def _bytes_under(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) if directory.is_dir() else 0


def _existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists: the filesystem it will be created on."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _parameters(spec: PretrainSpec) -> str:
    n = parameters(spec)
    return f"{n / 1e9:.2f} B parameters" if n >= 1e9 else f"{n / 1e6:.2f} M parameters"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def room_refusal(spec: PretrainSpec, checkpoints: Path, kept_too: bool = True) -> str | None:
    """Why the filesystem of ``checkpoints`` cannot hold the checkpoints the run will have at once,
    less those already there; None when it can. Without ``kept_too``, whether it can hold one: what
    any run needs, whatever it resumes from (the flow's preflight, before the run's directory is known)."""
    size, keep = checkpoint_bytes(spec), kept(spec) if kept_too else None
    setting = f"backend.{spec.backend.kind}.checkpoint_keep"
    # a backend that keeps all need not be walked: one more is what it needs, whatever is there
    present = 0 if keep is None else _bytes_under(checkpoints)
    at_once = _at_once(keep)
    needed = max(size, at_once * size - present)
    free = shutil.disk_usage(_existing(checkpoints)).free
    if free >= needed:
        return None
    written = ("one more checkpoint" if keep is None else
               f"{at_once} checkpoints at once ({setting}={keep}, and the next written before the oldest is deleted)"
               + (f", less the {_gb(present)} already in {checkpoints}" if present else ""))
    return (f"{checkpoints}: its filesystem has {_gb(free)} free, and the run needs {_gb(needed)}: {written}, of "
            f"about {_gb(size)} each ({_parameters(spec)} x "
            f"{BYTES_PER_PARAMETER[spec.backend.kind]} bytes); free space there, set paths.root to a larger "
            "filesystem" + ("" if keep is None else f", or lower {setting}"))


def room_line(spec: PretrainSpec) -> str:
    """What the run's checkpoints take and what ``paths.root`` has free, as `pretrain plan` prints it."""
    size, keep, root = checkpoint_bytes(spec), kept(spec), Path(spec.paths.root)
    held = (f"{_at_once(keep)} on disk at once (backend.{spec.backend.kind}.checkpoint_keep={keep} and the next): "
            f"{_gb(_at_once(keep) * size)}" if keep else f"backend.kind={spec.backend.kind} deletes none of its own")
    return (f"checkpoint room: about {_gb(size)} a checkpoint ({_parameters(spec)} x "
            f"{BYTES_PER_PARAMETER[spec.backend.kind]} bytes); {held}; {_gb(shutil.disk_usage(_existing(root)).free)} "
            f"free under paths.root={root}")
