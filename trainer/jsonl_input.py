"""JSONL input for the tokenize node program: files, compression, byte-range shards, and bad
records reported as ``file:line: reason``.

A shard is a contiguous range of the input's bytes (all files in sorted order, as one stream):
a line belongs to the shard that holds its first byte, and a compressed file, which cannot be
split, to the shard that holds its start. Concatenating the shards in order gives back the
whole input, which is what makes sharded + merged outputs identical to an unsharded run.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import lzma
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import orjson
import zstandard

OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
COMPRESSED = (*OPENERS, ".zst")


class BadRecord(ValueError):
    """A record that cannot be tokenized; the message is ``file:line: reason``."""


@dataclass(frozen=True)
class Record:
    path: Path
    line: int | None  # 1-based; None when a shard starts inside a file and it was not counted
    offset: int  # byte offset of the line in its (uncompressed) file
    raw: bytes

    def where(self) -> str:
        line = self.line if self.line is not None else _line_number(self.path, self.offset)
        return f"{self.path}:{line}"


def _line_number(path: Path, offset: int) -> int:
    """Counted only for an error message, so the hot path never counts lines."""
    count = 0
    with open(path, "rb") as f:
        while offset > 0:
            chunk = f.read(min(offset, 16 << 20))
            count += chunk.count(b"\n")
            offset -= len(chunk)
    return count + 1


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files, directories (their *.jsonl* files) and globs, in sorted order."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and ".jsonl" in p.name)
        elif any(c in item for c in "*?["):
            files += sorted(Path(p) for p in glob.glob(str(path)))
        elif path.exists():
            files.append(path)
        else:
            raise BadRecord(f"{path}: no such input file")
    if not files:
        raise BadRecord(f"no input files in {' '.join(inputs)}")
    return files


def parse_shard(spec: str) -> tuple[int, int]:
    index, _, count = spec.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"--shard {spec!r}: write it as i/N, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec!r}: i must be in 0..N-1")
    return i, n


def _zstd_lines(path: Path) -> Iterator[bytes]:
    """Lines of a .zst file, frame after frame. A file that ends inside a frame is an error;
    zstandard's stream reader would end quietly there."""
    pending, in_frame = b"", False
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            while chunk:
                in_frame = True
                data, chunk = decompressor.decompress(chunk), b""
                if decompressor.eof:
                    in_frame, chunk = False, decompressor.unused_data
                    decompressor = zstandard.ZstdDecompressor().decompressobj()
                *lines, pending = (pending + data).split(b"\n")
                yield from (line + b"\n" for line in lines)
    if in_frame:
        raise EOFError("the file ends inside a zstd frame")
    if pending:
        yield pending


def _lines_in_range(path: Path, start: int, end: int) -> Iterator[tuple[int | None, int, bytes]]:
    """(line number or None, offset, line) of the lines whose first byte lies in [start, end)."""
    with open(path, "rb", buffering=1 << 20) as f:
        line_no: int | None = 1
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line in progress belongs to the previous shard
            line_no = None
        offset = f.tell()
        while offset < end:
            line = f.readline()
            if not line:
                return
            yield line_no, offset, line
            offset += len(line)
            line_no = line_no + 1 if line_no is not None else None


def records(files: list[Path], shard: tuple[int, int] = (0, 1)) -> Iterator[Record]:
    index, count = shard
    sizes = [p.stat().st_size for p in files]
    total = sum(sizes)
    lo, hi = total * index // count, total * (index + 1) // count
    base = 0
    for path, size in zip(files, sizes):
        start, end = max(lo - base, 0), min(hi - base, size)
        if path.suffix in COMPRESSED:
            if lo <= base < hi:
                yield from _compressed_records(path)
        elif start < end:
            for line_no, offset, raw in _lines_in_range(path, start, end):
                yield Record(path, line_no, offset, raw)
        base += size


def _compressed_records(path: Path) -> Iterator[Record]:
    offset = 0
    try:
        with closing(_zstd_lines(path) if path.suffix == ".zst" else OPENERS[path.suffix](path, "rb")) as lines:
            for line_no, raw in enumerate(lines, 1):
                yield Record(path, line_no, offset, raw)
                offset += len(raw)
    except (EOFError, OSError, lzma.LZMAError, zstandard.ZstdError) as exc:
        raise BadRecord(f"{path}: truncated or corrupt compressed data after {offset} bytes ({exc})") from None


def text_of(record: Record, key: str) -> str:
    """The text under ``key``, or BadRecord naming the line and the reason."""
    try:
        data = orjson.loads(record.raw)
    except orjson.JSONDecodeError as exc:
        try:
            record.raw.decode("utf-8")
        except UnicodeDecodeError as utf:
            raise BadRecord(f"{record.where()}: invalid UTF-8 at byte {utf.start} of the line") from None
        raise BadRecord(f"{record.where()}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or key not in data:
        raise BadRecord(f"{record.where()}: no {key!r} key (use --json-keys to name the text field)")
    text = data[key]
    if not isinstance(text, str):
        raise BadRecord(f"{record.where()}: {key!r} is a {type(text).__name__}, not a string")
    return text
