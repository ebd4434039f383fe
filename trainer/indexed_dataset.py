"""Megatron indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``), written in bulk.

The bytes are exactly what megatron-core's ``IndexedDatasetBuilder`` writes (NVIDIA/Megatron-LM
``megatron/core/datasets/indexed_dataset.py``): a 34-byte header, int32 sequence lengths, int64 byte pointers, int64
document indices. One sequence per document; an empty document is a document with no
sequence, as in ``preprocess_data.py``.

Memory stays bounded whatever the corpus size: lengths and document ends go to sidecar files
as batches arrive, and the index is assembled from them in chunks at the end. Files carry
``.partial`` names until ``finalize`` renames them, the ``.idx`` last, so an interrupted run
never leaves a pair that looks complete.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34
DTYPE_CODES = {np.dtype(t): code for t, code in (
    (np.uint8, 1), (np.int8, 2), (np.int16, 3), (np.int32, 4), (np.int64, 5),
    (np.float64, 6), (np.float32, 7), (np.uint16, 8))}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
CHUNK = 1 << 22  # entries per chunk when assembling or merging an index


def optimal_dtype(vocab_size: int) -> np.dtype:
    """megatron-core's ``DType.optimal_dtype``: uint16 below 65500 ids, else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def paths(prefix: str | Path) -> tuple[Path, Path]:
    return Path(f"{prefix}.bin"), Path(f"{prefix}.idx")


class IndexReader:
    """The arrays of an ``.idx`` file, memory-mapped."""

    def __init__(self, idx_path: Path):
        with open(idx_path, "rb") as f:
            header = f.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES or header[:9] != MAGIC:
            raise ValueError(f"{idx_path}: not a Megatron .idx file (bad magic)")
        version, code, seq_count, doc_count = struct.unpack("<QBQQ", header[9:])
        if version != VERSION or code not in CODE_DTYPES:
            raise ValueError(f"{idx_path}: unsupported version {version} or dtype code {code}")
        self.dtype = CODE_DTYPES[code]
        self.lengths = np.memmap(idx_path, np.int32, "r", HEADER_BYTES, (seq_count,)) if seq_count else np.zeros(0, np.int32)
        doc_offset = HEADER_BYTES + seq_count * 4 + seq_count * 8
        self.document_indices = np.memmap(idx_path, np.int64, "r", doc_offset, (doc_count,))


class IndexedDatasetWriter:
    def __init__(self, prefix: str | Path, dtype: np.dtype):
        self.bin_path, self.idx_path = paths(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {self.dtype} has no Megatron dtype code")
        self.bin_path.parent.mkdir(parents=True, exist_ok=True)
        self._partial = {name: Path(f"{prefix}.{name}.partial") for name in ("bin", "idx", "lengths", "ends")}
        self._bin = open(self._partial["bin"], "wb")
        self._lengths = open(self._partial["lengths"], "wb")
        self._ends = open(self._partial["ends"], "wb")
        self.sequences = 0
        self.documents = 0
        self.tokens = 0

    def add_documents(self, tokens: np.ndarray, doc_lengths: np.ndarray) -> None:
        """Append documents: ``tokens`` concatenated, ``doc_lengths[i]`` tokens for document i
        (0 for an empty document)."""
        doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        nonempty = doc_lengths > 0
        self._lengths.write(doc_lengths[nonempty].astype(np.int32).tobytes())
        self._ends.write((self.sequences + np.cumsum(nonempty, dtype=np.int64)).tobytes())
        self.sequences += int(nonempty.sum())
        self.documents += len(doc_lengths)
        self.tokens += int(doc_lengths.sum())

    def add_dataset(self, prefix: str | Path) -> None:
        """Append a whole dataset (a shard of the same corpus), as megatron's ``add_index``."""
        bin_path, idx_path = paths(prefix)
        index = IndexReader(idx_path)
        if index.dtype != self.dtype:
            raise ValueError(f"{idx_path}: dtype {index.dtype} differs from the merged dataset's {self.dtype}")
        with open(bin_path, "rb") as src:
            shutil.copyfileobj(src, self._bin, 16 << 20)
        for start in range(0, len(index.lengths), CHUNK):
            self._lengths.write(np.asarray(index.lengths[start:start + CHUNK]).tobytes())
        ends = index.document_indices[1:]
        for start in range(0, len(ends), CHUNK):
            self._ends.write((np.asarray(ends[start:start + CHUNK]) + self.sequences).tobytes())
        self.sequences += len(index.lengths)
        self.documents += len(ends)
        self.tokens += int(index.lengths.sum(dtype=np.int64))

    def finalize(self) -> dict[str, int]:
        for f in (self._bin, self._lengths, self._ends):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        itemsize = self.dtype.itemsize
        with open(self._partial["idx"], "wb") as idx:
            idx.write(MAGIC + struct.pack("<QBQQ", VERSION, DTYPE_CODES[self.dtype], self.sequences,
                                          self.documents + 1))
            with open(self._partial["lengths"], "rb") as src:
                shutil.copyfileobj(src, idx, 16 << 20)
            lengths = np.memmap(self._partial["lengths"], np.int32, "r") if self.sequences else np.zeros(0, np.int32)
            offset = 0
            for start in range(0, self.sequences, CHUNK):
                chunk = np.asarray(lengths[start:start + CHUNK], dtype=np.int64) * itemsize
                pointers = np.cumsum(chunk) - chunk + offset
                offset += int(chunk.sum())
                idx.write(pointers.tobytes())
            del lengths
            idx.write(np.zeros(1, np.int64).tobytes())
            with open(self._partial["ends"], "rb") as src:
                shutil.copyfileobj(src, idx, 16 << 20)
            idx.flush()
            os.fsync(idx.fileno())
        os.replace(self._partial["bin"], self.bin_path)
        os.replace(self._partial["idx"], self.idx_path)  # last: the pair is complete from here on
        self._partial["lengths"].unlink()
        self._partial["ends"].unlink()
        return {"documents": self.documents, "sequences": self.sequences, "tokens": self.tokens}

    def abort(self) -> None:
        """Remove every partial file; nothing of a failed run remains."""
        for f in (self._bin, self._lengths, self._ends):
            f.close()
        for path in self._partial.values():
            path.unlink(missing_ok=True)
