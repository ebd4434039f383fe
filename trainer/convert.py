"""``python -m trainer convert``: Hugging Face Llama checkpoints to NxD Training's sharded
layout and back.

    python -m trainer convert hf-to-nxdt --input HF_DIR --output OUT --tp 32 --pp 8 \\
        --kv-multiplier 4 --hw-backend trn1 [--fuse-qkv | --no-qkv-linear] [--pipeline-cuts model.layers.18 ...] \\
        [--xser] [--verify]
    python -m trainer convert nxdt-to-hf --input OUT --config HF_DIR/config.json --output HF_OUT \\
        --tp 32 --pp 8 --kv-multiplier 4 --hw-backend trn1 [--fuse-qkv | --no-qkv-linear] [--verify]

``--expect num_hidden_layers=80 hidden_size=8192 ...`` refuses a config.json that differs from
the shape the training configuration was rendered with.

Streaming: tensors are read lazily from the safetensors files, only the rows and columns a
shard needs, and each shard ``model/dp_rank_00_tp_rank_XX_pp_rank_YY.pt`` is written as soon
as it is complete, so memory follows the largest shard, not the model. The output is built
under ``OUT.partial`` and renamed into place; an existing non-empty OUT is refused unless
``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import shutil
import struct
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.serialization.config as serialization_config
from safetensors import safe_open
from safetensors.torch import save_file

from trainer import xser as xser_format
from trainer.model_shape import config_mismatches, with_defaults
from trainer.nxdt_layout import QKV_NAMES, LayoutError, NxdtLayout
from trainer.records import emit

ATTN, MLP = "self_attn", "mlp"


class ConvertError(ValueError):
    """A checkpoint that cannot be converted as asked; the message names the file and the fix."""


# ---------------------------------------------------------------- reading HF checkpoints lazily


# safetensors' dtype names (its header format) for the dtypes a checkpoint's weights come in
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass(frozen=True)
class Rows:
    """Rows of safetensors tensors, concatenated and not yet read: ``(file, offset, bytes)``
    pieces that the writer copies from file to file in the kernel (``copy_file_range``), so
    the row-split weights (most of a shard) never pass through this process's memory."""

    pieces: tuple[tuple[str, int, int], ...]
    shape: tuple[int, ...]
    dtype: torch.dtype

    def numel(self) -> int:
        return math.prod(self.shape)

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        if any(p.shape[1:] != parts[0].shape[1:] or p.dtype != parts[0].dtype for p in parts):
            raise ConvertError(f"cannot join rows of shapes {[p.shape for p in parts]} and dtypes "
                               f"{sorted({str(p.dtype) for p in parts})}")
        return Rows(tuple(piece for p in parts for piece in p.pieces),
                    (sum(p.shape[0] for p in parts), *parts[0].shape[1:]), parts[0].dtype)

    def copy_to(self, out_fd: int, offset: int) -> None:
        sources: dict[str, int] = {}
        try:
            for path, start, count in self.pieces:
                if path not in sources:
                    sources[path] = os.open(path, os.O_RDONLY)
                _copy_range(sources[path], start, out_fd, offset, count)
                offset += count
        finally:
            for fd in sources.values():
                os.close(fd)


def _copy_range(src: int, src_offset: int, dst: int, dst_offset: int, count: int) -> None:
    """``count`` bytes from file to file, in the kernel where the filesystems allow it, else
    through a buffer (some network filesystems refuse copy_file_range)."""
    while count:
        try:
            done = os.copy_file_range(src, dst, count, src_offset, dst_offset)
        except OSError:
            done = os.pwrite(dst, os.pread(src, min(count, 1 << 26), src_offset), dst_offset)
        if done <= 0:
            raise ConvertError(f"could not copy {count} bytes at offset {src_offset}: the source file is short")
        src_offset, dst_offset, count = src_offset + done, dst_offset + done, count - done


def _cat(parts: list, dim: int = 0):
    """torch.cat, and the same for row pieces the writer has not read (see Rows)."""
    if all(isinstance(p, Rows) for p in parts) and dim == 0:
        return Rows.concat(parts)
    return torch.cat(parts, dim=dim)


def _keys(path: Path) -> list[str]:
    with safe_open(str(path), "pt") as f:
        return list(f.keys())


class HFCheckpoint:
    """A config.json plus one or many safetensors files (with model.safetensors.index.json)."""

    def __init__(self, directory: Path):
        self.directory = directory
        try:
            self.config = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConvertError(f"{directory / 'config.json'}: cannot read the model config ({exc})") from None
        index = directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (directory / "model.safetensors").exists():
            weight_map = None
        else:
            raise ConvertError(f"{directory}: no model.safetensors or model.safetensors.index.json")
        files = sorted(set(weight_map.values())) if weight_map else ["model.safetensors"]
        for name in files:
            if not (directory / name).exists():
                raise ConvertError(f"{directory / name}: safetensors shard listed in the index is missing")
        self.where = weight_map or {key: "model.safetensors" for key in _keys(directory / "model.safetensors")}
        self.read: set[str] = set()  # the tensors a conversion has read, to find any it left out
        self._headers: dict[str, tuple[int, dict]] = {}

    def _file(self, key: str) -> str:
        if key not in self.where:
            raise ConvertError(f"{self.directory}: tensor {key} is missing from the checkpoint")
        return str(self.directory / self.where[key])

    def _read(self, key: str, index: tuple) -> torch.Tensor:
        """Open, read the slice, close: the file's pages leave the process with the handle, so
        memory follows the shard being written, not the tensors read so far. The slice is a
        view into the mapped tensor; the copy keeps only its own bytes (torch.save would
        otherwise write the whole tensor's storage)."""
        self.read.add(key)
        with safe_open(self._file(key), "pt") as f:
            return f.get_slice(key)[index].clone(memory_format=torch.contiguous_format)

    def shape(self, key: str) -> list[int]:
        with safe_open(self._file(key), "pt") as f:
            return list(f.get_slice(key).get_shape())

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        return self._read(key, (slice(start, stop),))

    def row_range(self, key: str, start: int, stop: int) -> Rows:
        """Rows ``start:stop`` of ``key`` as where they lie in its file (safetensors stores each
        tensor row-major and contiguous, after an 8-byte length and a JSON header)."""
        self.read.add(key)
        path = self._file(key)
        if path not in self._headers:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                self._headers[path] = (8 + length, json.loads(f.read(length)))
        data_start, header = self._headers[path]
        info = header[key]
        shape, dtype = info["shape"], SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None or not 0 <= start <= stop <= shape[0]:
            raise ConvertError(f"{path}: {key} ({info['dtype']}, {shape}) has no rows {start}:{stop} of a weight")
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        begin = data_start + info["data_offsets"][0] + start * row_bytes
        return Rows(((path, begin, (stop - start) * row_bytes),), (stop - start, *shape[1:]), dtype)

    def cols(self, key: str, start: int, stop: int) -> torch.Tensor:
        return self._read(key, (slice(None), slice(start, stop)))

    def full(self, key: str) -> torch.Tensor:
        return self._read(key, (slice(None),))


def check_expected(config: dict, path: Path, expected: list[tuple[str, int]]) -> None:
    """The NxDT YAML takes the model's shape from the spec, the shards take it from config.json
    (NxD's converter reads the heads, hidden size and layers from ``--config``:
    aws-neuron/neuronx-distributed ``src/neuronx_distributed/scripts/checkpoint_converter.py``): a
    checkpoint of another shape is refused before it is sharded."""
    if wrong := config_mismatches(config, expected):
        raise ConvertError(f"{path} does not describe the model of the spec: {'; '.join(wrong)}. Point "
                           "model.init_from at the checkpoint the spec describes, or fix the spec's model section")


def layout_from(config: dict, args: argparse.Namespace) -> NxdtLayout:
    config = with_defaults(config)
    try:
        cuts = NxdtLayout.cut_indices(args.pipeline_cuts or [], config["num_hidden_layers"])
    except LayoutError as exc:
        raise ConvertError(f"--pipeline-cuts: {exc}") from None
    try:
        return NxdtLayout(
            num_layers=config["num_hidden_layers"], num_heads=config["num_attention_heads"],
            num_kv_heads=config["num_key_value_heads"], head_dim=config["head_dim"],
            tp=args.tp, pp=args.pp, kv_multiplier=args.kv_multiplier, hw_backend=args.hw_backend,
            fuse_qkv=args.fuse_qkv, qkv_linear=args.qkv_linear, pipeline_cuts=cuts)
    except LayoutError as exc:
        raise ConvertError(f"--tp/--pp/--kv-multiplier/--fuse-qkv/--qkv-linear: {exc}") from None


def check_shapes(ckpt: HFCheckpoint, layout: NxdtLayout) -> None:
    """config.json against the tensors, before anything is written."""
    hidden, last = ckpt.config["hidden_size"], layout.num_layers - 1
    expected = {
        "model.layers.0.self_attn.q_proj.weight": [layout.num_heads * layout.head_dim, hidden],
        "model.layers.0.self_attn.k_proj.weight": [layout.num_kv_heads * layout.head_dim, hidden],
        f"model.layers.{last}.mlp.gate_proj.weight": [ckpt.config["intermediate_size"], hidden],
        "model.embed_tokens.weight": [ckpt.config["vocab_size"], hidden],
    }
    for key, shape in expected.items():
        if ckpt.shape(key) != shape:
            raise ConvertError(f"{ckpt.directory / 'config.json'} does not match the tensors: {key} is "
                               f"{ckpt.shape(key)}, the config implies {shape}")
    if any(key.startswith(f"model.layers.{layout.num_layers}.") for key in ckpt.where):
        raise ConvertError(f"{ckpt.directory / 'config.json'} does not match the tensors: num_hidden_layers="
                           f"{layout.num_layers}, but the checkpoint holds model.layers.{layout.num_layers} and more")
    # NxD's parallel layers assert size % tp == 0 and do not pad (``convert_full_state_to_tp`` in
    # aws-neuron/neuronx-distributed src/neuronx_distributed/scripts/checkpoint_converter.py)
    for field in ("vocab_size", "intermediate_size"):
        if ckpt.config[field] % layout.tp:
            raise ConvertError(f"{ckpt.directory / 'config.json'}: {field} {ckpt.config[field]} is not divisible "
                               f"by tp={layout.tp} (NxD does not pad); choose a tp that divides it")


# ---------------------------------------------------------------- HF -> NxDT


def _heads(ckpt: HFCheckpoint, key: str, heads: list[int], head_dim: int, dim: int) -> torch.Tensor:
    read = ckpt.rows if dim == 0 else ckpt.cols
    return _cat([read(key, h * head_dim, (h + 1) * head_dim) for h in heads], dim=dim)


def shard_items(ckpt: HFCheckpoint, layout: NxdtLayout, tp_rank: int, pp_rank: int,
                ) -> Iterator[tuple[str, torch.Tensor]]:
    """One output shard's tensors, one at a time, reading only what the shard holds."""
    cfg, hd = ckpt.config, layout.head_dim
    vocab_rows = cfg["vocab_size"] // layout.tp
    ffn_rows = cfg["intermediate_size"] // layout.tp
    if pp_rank == 0:
        yield "model.embed_tokens.weight", ckpt.rows("model.embed_tokens.weight", tp_rank * vocab_rows,
                                                     (tp_rank + 1) * vocab_rows)
    for layer in layout.layers_of_stage(pp_rank):
        p = f"model.layers.{layer}"
        q = _heads(ckpt, f"{p}.{ATTN}.q_proj.weight", layout.q_heads(tp_rank), hd, 0)
        k = _heads(ckpt, f"{p}.{ATTN}.k_proj.weight", layout.kv_heads(tp_rank), hd, 0)
        v = _heads(ckpt, f"{p}.{ATTN}.v_proj.weight", layout.kv_heads(tp_rank), hd, 0)
        if layout.fuse_qkv:
            (name,) = layout.qkv_names
            yield f"{p}.{ATTN}.{name}", _cat([q, k, v])
        else:
            yield from ((f"{p}.{ATTN}.{name}", t) for name, t in zip(layout.qkv_names, (q, k, v)))
        yield f"{p}.{ATTN}.o_proj.weight", _heads(ckpt, f"{p}.{ATTN}.o_proj.weight", layout.q_heads(tp_rank), hd, 1)
        rows = (tp_rank * ffn_rows, (tp_rank + 1) * ffn_rows)
        yield f"{p}.{MLP}.gate_up_proj.weight", _cat([ckpt.rows(f"{p}.{MLP}.gate_proj.weight", *rows),
                                                      ckpt.rows(f"{p}.{MLP}.up_proj.weight", *rows)])
        yield f"{p}.{MLP}.down_proj.weight", ckpt.cols(f"{p}.{MLP}.down_proj.weight", *rows)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            yield f"{p}.{norm}.weight", ckpt.full(f"{p}.{norm}.weight")
    if pp_rank == layout.pp - 1:
        yield "model.norm.weight", ckpt.full("model.norm.weight")
        head = "lm_head.weight" if "lm_head.weight" in ckpt.where else "model.embed_tokens.weight"  # tied
        yield "lm_head.weight", ckpt.rows(head, tp_rank * vocab_rows, (tp_rank + 1) * vocab_rows)


def shard_name(tp_rank: int, pp_rank: int) -> str:
    return f"dp_rank_00_tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:02d}.pt"


class RowRanges:
    """The checkpoint as the shard writer reads it: row slices as Rows, copied file to file;
    column slices and whole tensors (row-parallel weights, norms) read as tensors."""

    def __init__(self, ckpt: HFCheckpoint):
        self.ckpt, self.config, self.where = ckpt, ckpt.config, ckpt.where
        self.rows, self.cols, self.full = ckpt.row_range, ckpt.cols, ckpt.full


def write_shard(state: dict[str, torch.Tensor | Rows] | torch.Tensor | Rows, path: Path) -> None:
    """What ``torch.save(state, path)`` writes, the bytes of Rows copied in by the kernel;
    ``state`` a dict of tensors, or one tensor (an xser tensor file).

    torch.save lays out the file with room for every tensor and no data (``skip_data``); the
    storages' offsets are then read back (a load onto the meta device) and each tensor's bytes
    written there. No CRC32 of the zip records: torch.load never checks them (PyTorch builds its
    zip reader without CRC checks), --verify compares every tensor instead, and computing it
    would mean reading every byte into this process."""
    single = not isinstance(state, dict)
    items = {"": state} if single else state
    skeleton = {key: torch.empty(value.shape, dtype=value.dtype) for key, value in items.items()}
    with serialization_config.patch(**{"save.compute_crc32": False}), torch.serialization.skip_data():
        torch.save(skeleton[""] if single else skeleton, path)
    laid_out = torch.load(path, map_location="meta", weights_only=True)
    if single:
        laid_out = {"": laid_out}
    fd = os.open(path, os.O_WRONLY)
    try:
        for key, value in items.items():
            offset = laid_out[key].untyped_storage()._checkpoint_offset
            if isinstance(value, Rows):
                value.copy_to(fd, offset)
            else:
                data = memoryview(value.contiguous().view(-1).view(torch.uint8).numpy())
                while data:
                    written = os.pwrite(fd, data, offset)
                    data, offset = data[written:], offset + written
    finally:
        os.close(fd)


def hf_to_nxdt(ckpt: HFCheckpoint, layout: NxdtLayout, staging: Path, xser: bool = False) -> dict:
    """``xser``: each shard as torch_xla's xser layout (the runbooks' ``--save_xser``): a ref
    file and one file per tensor in ``<shard>.tensors/``."""
    model_dir = staging / "model"
    model_dir.mkdir(parents=True)
    shards, params, total = 0, 0, 0
    for pp_rank in range(layout.pp):
        for tp_rank in range(layout.tp):
            state = dict(shard_items(RowRanges(ckpt), layout, tp_rank, pp_rank))
            path = model_dir / shard_name(tp_rank, pp_rank)
            if xser:
                xser_format.tensors_dir(path).mkdir()
                for tid, value in enumerate(state.values()):
                    write_shard(value, xser_format.tensor_file(path, tid))
                xser_format.save_refs(list(state), path)
                total += sum(f.stat().st_size for f in xser_format.tensors_dir(path).iterdir())
            else:
                write_shard(state, Path(f"{path}.tmp"))
                os.replace(f"{path}.tmp", path)
            shards += 1
            params += sum(t.numel() for t in state.values())
            total += path.stat().st_size
            del state
    return {"shards": shards, "parameters_stored": params, "bytes": total, "layout": "xser" if xser else "pt"}


# ---------------------------------------------------------------- NxDT -> HF


def _unreadable(path: Path, exc: Exception) -> ConvertError:
    """A shard that cannot be read, named with the likely fix rather than a traceback."""
    if isinstance(exc, FileNotFoundError):
        if path.exists():  # an xser tensor file: the message names it
            return ConvertError(str(exc))
        return ConvertError(f"{path}: shard missing; check --tp/--pp against the checkpoint")
    # truncated or not a torch file
    return ConvertError(f"{path}: cannot read the shard ({type(exc).__name__}: {exc}); it is truncated or corrupt")


def load_shard(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A shard in either layout (xser when a ``.tensors`` directory lies beside it, as NxD
    decides). ``mmap``: tensors stay in the file's pages until read (verify compares one at a time)."""
    try:
        if xser_format.is_xser(path):
            return xser_format.load(path, mmap=mmap)
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:
        raise _unreadable(path, exc) from None


class LazyShard(Mapping):
    """A shard's tensors, each mapped from the file when asked for, its pages handed back with
    ``release``: --verify keeps one written tensor resident at a time, where torch.load's
    memory-mapped shard keeps every page it compared until the whole shard is done."""

    def __init__(self, path: Path):
        self.path, self._map = path, None
        try:
            if xser_format.is_xser(path):
                self.xser, self.entries = True, xser_format.refs(path)
            else:
                self.xser, self.entries = False, torch.load(path, map_location="meta", weights_only=True)
        except Exception as exc:
            raise _unreadable(path, exc) from None

    def _span(self, entry: torch.Tensor) -> tuple[int, int] | None:
        """Where a tensor's bytes lie in the file; None for a view into a shared storage."""
        storage = entry.untyped_storage()
        if entry.storage_offset() or not entry.is_contiguous() or storage.nbytes() != entry.nbytes:
            return None
        return storage._checkpoint_offset, entry.nbytes

    def __getitem__(self, key: str) -> torch.Tensor:
        entry = self.entries[key]
        try:
            if self.xser:
                return xser_format.tensor(self.path, key, entry)
            if (span := self._span(entry)) is None:
                return load_shard(self.path, mmap=True)[key]  # as torch reads it
            offset, size = span
            if not size:
                return torch.empty(entry.shape, dtype=entry.dtype)
            if self._map is None:
                with open(self.path, "rb") as f:  # copy-on-write: a writable buffer torch takes as is
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            if offset + size > len(self._map):
                raise EOFError("the file ends inside the tensor")
            return torch.frombuffer(self._map, dtype=entry.dtype, count=entry.numel(), offset=offset).reshape(entry.shape)
        except FileNotFoundError as exc:
            raise ConvertError(str(exc)) from None
        except (OSError, EOFError, ValueError) as exc:
            raise ConvertError(f"{self.path}: cannot read {key} ({exc}); the shard is truncated or corrupt") from None

    def release(self, key: str) -> None:
        """Hand ``key``'s pages back (clean file pages: the kernel drops them, nothing is lost)."""
        if self._map is not None and not self.xser and (span := self._span(self.entries[key])) is not None:
            start = span[0] - span[0] % mmap.PAGESIZE
            self._map.madvise(mmap.MADV_DONTNEED, start, span[0] + span[1] - start)

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def nxdt_states(model_dir: Path, layout: NxdtLayout) -> Iterator[tuple[int, list[dict[str, torch.Tensor]]]]:
    """Per pipeline stage, the tp shards of that stage (one stage in memory at a time)."""
    for pp_rank in range(layout.pp):
        yield pp_rank, [load_shard(model_dir / shard_name(t, pp_rank)) for t in range(layout.tp)]


def _replicated(shards: list[dict[str, torch.Tensor]], key: str, pp_rank: int) -> torch.Tensor:
    """A tensor every tp rank holds whole (the norms): every copy must be the same."""
    for rank, shard in enumerate(shards[1:], start=1):
        if not torch.equal(shard[key], shards[0][key]):
            raise ConvertError(f"{shard_name(rank, pp_rank)}: {key} differs from tp rank 0's copy")
    return shards[0][key]


def _qkv(layout: NxdtLayout, shard: dict[str, torch.Tensor], prefix: str) -> tuple[torch.Tensor, ...]:
    """One rank's Q, K and V rows of the layer ``prefix``."""
    tensors = [shard[f"{prefix}.{ATTN}.{name}"] for name in layout.qkv_names]
    if not layout.fuse_qkv:
        return tuple(tensors)
    # Split by the known sizes: q and k/v parts differ in size under GQA.
    q_rows, kv_rows = layout.q_heads_per_rank * layout.head_dim, layout.kv_heads_per_rank * layout.head_dim
    return torch.split(tensors[0], [q_rows, kv_rows, kv_rows])


def _describe_qkv(qkv_linear: bool, fuse_qkv: bool) -> str:
    names = QKV_NAMES[qkv_linear, fuse_qkv]
    common = os.path.commonprefix(names) if len(names) > 1 else ""
    named = common + "/".join(name[len(common):] for name in names)
    return f"self_attn.{named} (qkv_linear: {str(qkv_linear).lower()}, fuse_qkv: {str(fuse_qkv).lower()})"


def _check_qkv_names(layout: NxdtLayout, shard: dict[str, torch.Tensor], prefix: str, name: str) -> None:
    """Shards whose Q/K/V are named as another layout names them: both layouts and the flag that
    fixes it are named (a missing key alone would not say which flag is wrong)."""
    def holds(names: tuple[str, ...]) -> bool:
        return all(f"{prefix}.{ATTN}.{n}" in shard for n in names)

    expected = layout.qkv_linear, layout.fuse_qkv
    found = next((key for key, names in QKV_NAMES.items() if holds(names)), None)
    if holds(layout.qkv_names) or found is None:  # neither: the missing tensor is named when it is read
        return
    given = " ".join(flag for flag, on in (("--fuse-qkv", expected[1]), ("--no-qkv-linear", not expected[0])) if on)
    fixes = []
    if found[0] != expected[0]:
        fixes.append("omit --no-qkv-linear" if found[0] else "pass --no-qkv-linear")
    if found[1] != expected[1]:
        fixes.append("pass --fuse-qkv" if found[1] else "omit --fuse-qkv")
    raise ConvertError(f"{name}: the shards hold {_describe_qkv(*found)}; "
                       f"{given or 'without --fuse-qkv or --no-qkv-linear the converter'} expects "
                       f"{_describe_qkv(*expected)}: {' and '.join(fixes)}")


def _check_kv_placement(layout: NxdtLayout, keys: list[torch.Tensor], layer: int) -> None:
    """Replicated K/V placed as the other backend places them: said so in one line, where the
    per-head check would only find that copies differ. NxD's converter tiles K/V on trn1 and
    trn2 alike (``.repeat`` in ``convert_full_state_to_tp``, aws-neuron/neuronx-distributed
    src/neuronx_distributed/scripts/checkpoint_converter.py, commit fbac349); its trn2 model
    interleaves them (``repeat_interleave`` in ``_initialize_affine_weight``,
    src/neuronx_distributed/modules/qkv_linear.py)."""
    if layout.kv_multiplier == 1:
        return

    def agrees(interleaved: bool) -> bool:
        first: dict[int, torch.Tensor] = {}
        return all(torch.equal(first.setdefault(layout.replicated_kv_head(rank, interleaved), k), k)
                   for rank, k in enumerate(keys))

    interleaved = layout.hw_backend == "trn2"
    if agrees(interleaved) or not agrees(not interleaved):
        return  # as expected, or damaged: the per-head check names the copy
    kv, mult = layout.num_kv_heads, layout.kv_multiplier
    if interleaved:
        raise ConvertError(
            f"model.layers.{layer}: the shards hold K/V tiled (tp rank r holds KV head r % {kv}), as NxD's "
            f"checkpoint_converter.py writes them for trn1 and trn2 alike; on trn2 NxD's model interleaves K/V "
            f"(rank r's query heads are in KV group r // {mult}), so on trn2 these shards pair query heads with the "
            "wrong KV group and are refused: pass --hw-backend trn1 if they were written for trn1, else convert "
            "the HF checkpoint again with --hw-backend trn2")
    raise ConvertError(
        f"model.layers.{layer}: the shards hold K/V interleaved (tp rank r holds KV head r // {mult}), as trn2's model "
        f"places them; --hw-backend trn1 expects them tiled (rank r holds KV head r % {kv}): pass --hw-backend trn2")


def unshard_stage(layout: NxdtLayout, pp_rank: int, shards: list[dict[str, torch.Tensor]],
                  config: dict) -> dict[str, torch.Tensor]:
    hd, out = layout.head_dim, {}
    if layers := layout.layers_of_stage(pp_rank):  # the stage's first layer shows the layout the flags must name
        prefix = f"model.layers.{layers[0]}"
        _check_qkv_names(layout, shards[0], prefix, shard_name(0, pp_rank))
        _check_kv_placement(layout, [_qkv(layout, s, prefix)[1] for s in shards], layers[0])
    if pp_rank == 0:
        out["model.embed_tokens.weight"] = torch.cat([s["model.embed_tokens.weight"] for s in shards])
    for layer in layout.layers_of_stage(pp_rank):
        p = f"model.layers.{layer}"
        o_shard = shards[0][f"{p}.{ATTN}.o_proj.weight"]  # [hidden, heads of the rank]: size and dtype
        q_full = torch.empty(layout.num_heads * hd, o_shard.shape[0], dtype=o_shard.dtype)
        k_full = torch.empty(layout.num_kv_heads * hd, q_full.shape[1], dtype=o_shard.dtype)
        v_full = torch.empty_like(k_full)
        o_full = torch.empty(q_full.shape[1], layout.num_heads * hd, dtype=o_shard.dtype)
        kv_seen: set[int] = set()
        for rank, s in enumerate(shards):
            q, k, v = _qkv(layout, s, p)
            for i, head in enumerate(layout.q_heads(rank)):
                q_full[head * hd:(head + 1) * hd] = q[i * hd:(i + 1) * hd]
                o_full[:, head * hd:(head + 1) * hd] = s[f"{p}.{ATTN}.o_proj.weight"][:, i * hd:(i + 1) * hd]
            for i, head in enumerate(layout.kv_heads(rank)):
                rows = slice(head * hd, (head + 1) * hd)
                if head in kv_seen and not (torch.equal(k_full[rows], k[i * hd:(i + 1) * hd])
                                            and torch.equal(v_full[rows], v[i * hd:(i + 1) * hd])):
                    raise ConvertError(f"{shard_name(rank, pp_rank)}: its copy of KV head {head} in layer {layer} "
                                       "differs from another rank's (replicas must be equal)")
                kv_seen.add(head)
                k_full[rows], v_full[rows] = k[i * hd:(i + 1) * hd], v[i * hd:(i + 1) * hd]
        out.update({f"{p}.{ATTN}.q_proj.weight": q_full, f"{p}.{ATTN}.k_proj.weight": k_full,
                    f"{p}.{ATTN}.v_proj.weight": v_full, f"{p}.{ATTN}.o_proj.weight": o_full})
        gate_up = [torch.chunk(s[f"{p}.{MLP}.gate_up_proj.weight"], 2) for s in shards]
        out[f"{p}.{MLP}.gate_proj.weight"] = torch.cat([g for g, _ in gate_up])
        out[f"{p}.{MLP}.up_proj.weight"] = torch.cat([u for _, u in gate_up])
        out[f"{p}.{MLP}.down_proj.weight"] = torch.cat([s[f"{p}.{MLP}.down_proj.weight"] for s in shards], dim=1)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{p}.{norm}.weight"] = _replicated(shards, f"{p}.{norm}.weight", pp_rank)
    if pp_rank == layout.pp - 1:
        out["model.norm.weight"] = _replicated(shards, "model.norm.weight", pp_rank)
        if not config.get("tie_word_embeddings"):
            out["lm_head.weight"] = torch.cat([s["lm_head.weight"] for s in shards])
    return out


def nxdt_to_hf(model_dir: Path, config_path: Path, layout: NxdtLayout, staging: Path) -> dict:
    """One safetensors file per pipeline stage, written as soon as the stage is reassembled, and
    the index that names them (as sharded HF checkpoints are saved): memory follows one stage."""
    config = json.loads(config_path.read_text())
    staging.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    params, total_bytes = 0, 0
    for pp_rank, shards in nxdt_states(model_dir, layout):
        state = unshard_stage(layout, pp_rank, shards, config)
        del shards
        name = f"model-{pp_rank + 1:05d}-of-{layout.pp:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(staging / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(state, name))
        params += sum(t.numel() for t in state.values())
        total_bytes += sum(t.numel() * t.element_size() for t in state.values())
        del state
    index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.copyfile(config_path, staging / "config.json")
    return {"tensors": len(weight_map), "parameters": params, "files": layout.pp}


def verify(source: HFCheckpoint, model_dir: Path, layout: NxdtLayout) -> dict:
    """Read every shard and compare each of its tensors, every copy of a replicated one included,
    with the slices of the HF checkpoint it must hold; the shards must hold nothing else, and
    together every HF tensor. One shard and one tensor in memory at a time. Both directions use
    it: hf-to-nxdt checks the shards it wrote, nxdt-to-hf the safetensors it wrote."""
    source.read.clear()
    for pp_rank in range(layout.pp):
        for tp_rank in range(layout.tp):
            path = model_dir / shard_name(tp_rank, pp_rank)
            written = LazyShard(path)
            expected: set[str] = set()
            for key, tensor in shard_items(source, layout, tp_rank, pp_rank):
                expected.add(key)
                if key not in written:
                    raise ConvertError(f"verify: {path} lacks {key}")
                mine = written[key]
                if mine.dtype != tensor.dtype:  # torch.equal compares values only
                    raise ConvertError(f"verify: {path}: {key} is {mine.dtype}, the HF checkpoint's is {tensor.dtype}")
                if not torch.equal(mine, tensor):
                    raise ConvertError(f"verify: {path}: {key} differs from the HF checkpoint")
                del mine, tensor
                written.release(key)
            if extra := sorted(set(written) - expected):
                raise ConvertError(f"verify: {path} holds tensors it should not: {', '.join(extra)}")
            del written
    # Older checkpoints carry RoPE's inverse frequencies, a buffer the model recomputes.
    buffers = {key for key in source.where if key.endswith("rotary_emb.inv_freq")}
    if missing := sorted(set(source.where) - source.read - buffers):
        raise ConvertError(f"verify: the output lacks {len(missing)} source tensor(s) the NxDT layout has no place "
                           f"for: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return {"verified_tensors": len(source.read)}


# ---------------------------------------------------------------- command line


def _replace_output(output: Path, staging: Path) -> None:
    """The old output (empty, or --overwrite was given: main checked before any work) is moved
    aside before the new one takes its name, and deleted only then: at every moment one
    complete output is there under its name or beside it."""
    if not output.exists():
        os.replace(staging, output)
        return
    old = output.with_name(output.name + ".replaced")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(output, old)
    os.replace(staging, output)
    shutil.rmtree(old)


def _expectation(text: str) -> tuple[str, int]:
    field, _, value = text.partition("=")
    if not (field and value.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: give FIELD=INTEGER, e.g. num_hidden_layers=80")
    return field, int(value)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("direction", choices=["hf-to-nxdt", "nxdt-to-hf"])
    p.add_argument("--input", required=True, help="HF directory, or the NxDT checkpoint (its model/ inside)")
    p.add_argument("--output", required=True)
    p.add_argument("--config", help="nxdt-to-hf: the HF config.json of the model")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--kv-multiplier", type=int, default=1, help="NxD kv_replicator")
    p.add_argument("--hw-backend", choices=["trn1", "trn2"], required=True)
    p.add_argument("--fuse-qkv", action="store_true", help="qkv_proj.weight_qkv instead of weight_q/k/v")
    p.add_argument("--qkv-linear", action=argparse.BooleanOptionalAction, default=True,
                   help="NxDT's model.qkv_linear: --no-qkv-linear names Q/K/V self_attn.q_proj/k_proj/v_proj.weight, "
                   "split in order and never replicated, as NxDT's Llama builds them without "
                   "GQAQKVColumnParallelLinear")
    p.add_argument("--xser", action="store_true", help="hf-to-nxdt: write torch_xla's xser layout (the runbooks' "
                   "--save_xser); nxdt-to-hf reads either layout, as NxD does")
    p.add_argument("--pipeline-cuts", nargs="*", help="the YAML's pipeline_cuts, e.g. model.layers.18")
    p.add_argument("--verify", action="store_true", help="read the output back and compare it with the input")
    p.add_argument("--expect", nargs="+", type=_expectation, default=[], metavar="FIELD=VALUE",
                   help="config.json values the training configuration assumes (rendered from the spec); "
                   "a checkpoint that differs is refused")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--record", help="also write the JSON record to this file (atomically)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    started = time.monotonic()
    output = Path(args.output)
    staging = output.with_name(output.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        if output.exists() and any(output.iterdir()) and not args.overwrite:
            raise ConvertError(f"{output} exists and is not empty; pass --overwrite to replace it")
        if args.direction == "hf-to-nxdt":
            ckpt = HFCheckpoint(Path(args.input))
            check_expected(ckpt.config, ckpt.directory / "config.json", args.expect)
            layout = layout_from(ckpt.config, args)
            check_shapes(ckpt, layout)
            record = hf_to_nxdt(ckpt, layout, staging, xser=args.xser)
            if args.verify:
                record.update(verify(ckpt, staging / "model", layout))
        else:
            if not args.config:
                raise ConvertError("nxdt-to-hf needs --config (the model's HF config.json)")
            config = json.loads(Path(args.config).read_text())
            check_expected(config, Path(args.config), args.expect)
            layout = layout_from(config, args)
            model_dir = Path(args.input) / "model" if (Path(args.input) / "model").is_dir() else Path(args.input)
            record = nxdt_to_hf(model_dir, Path(args.config), layout, staging)
            if args.verify:  # the written safetensors are an HF checkpoint: the same check, read the other way
                record.update(verify(HFCheckpoint(staging), model_dir, layout))
        _replace_output(output, staging)
    except (KeyError, RuntimeError) as exc:
        # A tensor missing from a shard, or a fused QKV of another size: the flags do not describe
        # this checkpoint (KeyError's message is the key itself).
        shutil.rmtree(staging, ignore_errors=True)
        print(f"error: {args.input} does not match --tp/--pp/--kv-multiplier/--fuse-qkv/--qkv-linear/--pipeline-cuts "
              f"as given ({type(exc).__name__}: {exc}); pass the values the checkpoint was written with",
              file=sys.stderr)
        return 2
    except (ConvertError, OSError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record.update(direction=args.direction, output=str(output), seconds=round(time.monotonic() - started, 3))
    emit(record, args.record)
    return 0
