"""torch_xla's xser layout, which NxD Training saves checkpoints in (``save_xser: True``) and the
runbooks' converter writes with ``--save_xser`` (pytorch/xla ``torch_xla/utils/serialization.py``;
aws-neuron/neuronx-distributed ``src/neuronx_distributed/trainer/checkpoint.py``):

    dp_rank_00_tp_rank_00_pp_rank_00.pt                  the state with each tensor replaced by a
                                                         torch_xla.utils.serialization.TensorReference(tid)
    dp_rank_00_tp_rank_00_pp_rank_00.pt.tensors/tensor_<tid>.pt   each tensor, torch.save'd alone

Neither reading nor writing needs torch_xla: the reference is a class with one slot, ``tid``,
and the pickle names it by its module path, which is all a loader on Trainium resolves.
"""

from __future__ import annotations

import pickle
import types
from pathlib import Path

import torch

CLASS_PATH = "torch_xla.utils.serialization.TensorReference"


class TensorReference:
    """Stands for torch_xla's class of the same name in the pickles of this module (same slot,
    same pickled state), so that a ref file reads and writes without torch_xla installed."""

    __slots__ = ("tid",)

    def __init__(self, tid: int):
        self.tid = tid

    def __setstate__(self, state) -> None:
        # A class with __slots__ pickles its state as (None, {"tid": ...}).
        self.tid = (state[1] if isinstance(state, tuple) else state)["tid"]


class _Pickler(pickle._Pickler):  # the pure-Python pickler: its save_global can be overridden
    def save_global(self, obj, name=None):
        if obj is TensorReference:
            module, _, qualname = CLASS_PATH.rpartition(".")
            self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


_PICKLE_MODULE = types.ModuleType("xser_pickle")
_PICKLE_MODULE.Pickler = _Pickler


def tensors_dir(path: Path) -> Path:
    return Path(f"{path}.tensors")


def tensor_file(path: Path, tid: int) -> Path:
    return tensors_dir(path) / f"tensor_{tid}.pt"


def is_xser(path: Path) -> bool:
    """As NxD decides it: a ``.tensors`` directory beside the file."""
    return tensors_dir(path).is_dir()


def save_refs(keys: list[str], path: Path) -> None:
    """The ref file of a flat state whose tensor ``i`` (in ``keys`` order) is ``tensor_<i>.pt``."""
    torch.save({key: TensorReference(tid) for tid, key in enumerate(keys)}, path, pickle_module=_PICKLE_MODULE)


def refs(path: Path) -> dict[str, TensorReference | torch.Tensor]:
    """The ref file of a flat state: a reference per tensor (or a tensor xser left in the file,
    a CPU tensor as the runbooks' converter leaves them). ValueError for another shape."""
    with torch.serialization.safe_globals([(TensorReference, CLASS_PATH)]):
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"holds a {type(state).__name__}, not a state dict")
    return state


def tensor(path: Path, key: str, ref: TensorReference | torch.Tensor, mmap: bool = False) -> torch.Tensor:
    """``key``'s tensor; FileNotFoundError naming its tensor file if that is missing."""
    if not isinstance(ref, TensorReference):
        return ref
    file = tensor_file(path, ref.tid)
    if not file.exists():
        raise FileNotFoundError(f"{file}: tensor {ref.tid} ({key}) of the xser checkpoint is missing")
    return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)


def load(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A flat xser state: the ref file, each reference replaced by its tensor file."""
    return {key: tensor(path, key, ref, mmap) for key, ref in refs(path).items()}
