"""``python -m trainer tokenize``: JSONL to Megatron indexed datasets, the replacement for
Megatron-LM's ``tools/preprocess_data.py``.

    python -m trainer tokenize --input DATA --output-prefix OUT/corpus \\
        --tokenizer-type gpt2-bpe --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt \\
        --append-eod [--shard i/N] [--on-bad-record skip]
    python -m trainer tokenize merge --output-prefix OUT/corpus PART_PREFIX...

Writes ``OUT/corpus_{key}_document.bin/.idx`` byte-identical to preprocess_data.py's for the
same input, tokenizer and options. Batches of documents are parsed, encoded on every core and
written in bulk; memory is bounded by the batch size, not the corpus. Progress goes to stderr
in Megatron's words; the last line on stdout is a JSON record of counts and rates.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from pathlib import Path

import numpy as np

from trainer.indexed_dataset import IndexedDatasetWriter, IndexReader, optimal_dtype
from trainer.nxd_arrow import NxdArrowWriter
from trainer.jsonl_input import BadRecord, expand_inputs, parse_shard, records, text_of
from trainer.records import emit
from trainer.tokenizer import Tokenizer, TokenizerError, load_tokenizer

BATCH_BYTES = 8 << 20  # text per encode call: enough for every core, small enough for memory
MAX_REPORTED = 100  # skipped records listed in the run record


def output_prefix(prefix: str, key: str) -> str:
    return f"{prefix}_{key}_document"


def assemble(tokenizer: Tokenizer, flat: np.ndarray, counts: np.ndarray, append_eod: bool,
             dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Put the tokenizer's specials (BOS) around each document and EOD after each non-empty
    one, as Megatron's Encoder.encode does, in a few vectorised steps."""
    pre, suf = np.asarray(tokenizer.prefix, np.int64), np.asarray(tokenizer.suffix, np.int64)
    lengths = counts + len(pre) + len(suf)
    if append_eod:
        lengths = lengths + (lengths > 0)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), dtype=dtype)
    body_starts = np.cumsum(counts) - counts
    body_pos = np.arange(len(flat), dtype=np.int64) + np.repeat(starts + len(pre) - body_starts, counts)
    out[body_pos] = flat
    for k, token in enumerate(pre):
        out[starts + k] = token
    for k, token in enumerate(suf):
        out[starts + len(pre) + counts + k] = token
    if append_eod:
        nonempty = lengths > 0
        out[(starts + lengths - 1)[nonempty]] = tokenizer.eod
    return out, lengths


class Progress:
    """Megatron's progress line: documents, docs/s and MB/s of JSON input, on stderr."""

    def __init__(self, interval: int):
        self.interval, self.next_at = interval, interval
        self.start = time.monotonic()

    def update(self, documents: int, input_bytes: int, final: bool = False) -> None:
        if documents < self.next_at and not final:
            return
        self.next_at = (documents // self.interval + 1) * self.interval
        elapsed = max(time.monotonic() - self.start, 1e-9)
        print(f"Processed {documents} documents ({documents / elapsed:.1f} docs/s, "
              f"{input_bytes / elapsed / 1024 / 1024:.2f} MB/s).", file=sys.stderr, flush=True)


def tokenize(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    tokenizer = load_tokenizer(args.tokenizer_type, vocab_file=args.vocab_file, merges_file=args.merge_file,
                               model=args.tokenizer_model, engine=args.engine)
    dtype = optimal_dtype(tokenizer.vocab_size)
    files = expand_inputs(args.input)
    shard = parse_shard(args.shard) if args.shard else (0, 1)
    if args.format == "nxd-arrow":
        if not args.seq_length:
            raise ValueError("--format nxd-arrow needs --seq-length (the model's sequence length)")
        if shard != (0, 1):
            raise ValueError("--format nxd-arrow groups documents by 1,000 as get_dataset.py does; run it unsharded")
        writers = {key: NxdArrowWriter(f"{args.output_prefix}_{key}", args.seq_length) for key in args.json_keys}
    else:
        writers = {key: IndexedDatasetWriter(output_prefix(args.output_prefix, key), dtype) for key in args.json_keys}
    progress = Progress(args.log_interval)
    skipped: list[str] = []
    counts = {"documents": 0, "skipped": 0, "empty": 0, "input_bytes": 0}

    def flush(texts: dict[str, list[str]]) -> None:
        for key, writer in writers.items():
            flat, lengths = tokenizer.encode_texts(texts[key])
            tokens, doc_lengths = assemble(tokenizer, flat, lengths, args.append_eod, dtype)
            writer.add_documents(tokens, doc_lengths)
        counts["documents"] += len(texts[args.json_keys[0]])
        progress.update(counts["documents"], counts["input_bytes"])

    try:
        texts: dict[str, list[str]] = {key: [] for key in args.json_keys}
        batch_bytes = 0
        for record in records(files, shard):
            counts["input_bytes"] += len(record.raw)
            try:
                values = {key: text_of(record, key) for key in args.json_keys}
                if not args.keep_empty and not any(values.values()):
                    raise BadRecord(f"{record.where()}: empty document (--keep-empty keeps it as "
                                    "Megatron does: a document with no tokens)")
            except BadRecord as exc:
                if args.on_bad_record == "fail":
                    raise
                counts["skipped"] += 1
                if len(skipped) < MAX_REPORTED:
                    skipped.append(str(exc))
                continue
            counts["empty"] += not any(values.values())
            for key, value in values.items():
                texts[key].append(value)
            batch_bytes += len(record.raw)
            if batch_bytes >= BATCH_BYTES:
                flush(texts)
                texts, batch_bytes = {key: [] for key in args.json_keys}, 0
        if texts[args.json_keys[0]]:
            flush(texts)
        outputs = {key: writer.finalize() for key, writer in writers.items()}
    except BaseException as exc:
        for writer in writers.values():
            writer.abort()
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise OSError(exc.errno, f"disk full while writing {args.output_prefix}; nothing was "
                                     "kept, free space and run again") from None
        raise
    progress.update(counts["documents"], counts["input_bytes"], final=True)
    seconds = time.monotonic() - started
    return {
        **counts,
        "tokens": {key: out["tokens"] for key, out in outputs.items()},
        "outputs": {key: (f"{args.output_prefix}_{key}" if args.format == "nxd-arrow"
                          else output_prefix(args.output_prefix, key)) for key in args.json_keys},
        "format": args.format,
        "dtype": dtype.name, "vocab_size": tokenizer.vocab_size, "engine": tokenizer.engine,
        "tokenizer_sha256": tokenizer.fingerprint, "shard": f"{shard[0]}/{shard[1]}",
        "skipped_records": skipped, "seconds": round(seconds, 3),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}Z",
        "docs_per_s": round(counts["documents"] / seconds, 1),
        "mb_per_s": round(counts["input_bytes"] / seconds / 1e6, 2),
    }


def merge(args: argparse.Namespace) -> dict:
    """Join shard outputs, in the order given, into one dataset per key."""
    started = time.monotonic()
    outputs = {}
    for key in args.json_keys:
        parts = [output_prefix(p, key) for p in args.parts]
        writer = IndexedDatasetWriter(output_prefix(args.output_prefix, key),
                                      IndexReader(Path(f"{parts[0]}.idx")).dtype)
        try:
            for part in parts:
                writer.add_dataset(part)
            outputs[key] = writer.finalize()
        except BaseException:
            writer.abort()
            raise
    return {"outputs": {k: output_prefix(args.output_prefix, k) for k in outputs},
            "documents": {k: v["documents"] for k, v in outputs.items()},
            "tokens": {k: v["tokens"] for k, v in outputs.items()},
            "parts": len(args.parts), "seconds": round(time.monotonic() - started, 3)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer tokenize", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="JSONL files (.gz/.xz/.zst/.bz2 too), directories or globs")
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--tokenizer-type", required=True, choices=["gpt2-bpe", "hf", "sentencepiece"])
    p.add_argument("--vocab-file", help="gpt2-bpe: vocab.json")
    p.add_argument("--merge-file", help="gpt2-bpe: merges.txt")
    p.add_argument("--tokenizer-model", help="hf: a directory with tokenizer.json; sentencepiece: a .model file")
    p.add_argument("--append-eod", action="store_true")
    p.add_argument("--format", choices=["megatron", "nxd-arrow"], default="megatron",
                   help="megatron: PREFIX_{key}_document.bin/.idx; nxd-arrow: NxD's Arrow blocks for hf_llama")
    p.add_argument("--seq-length", type=int, help="nxd-arrow: tokens per block (the model's sequence length)")
    p.add_argument("--keep-empty", action="store_true",
                   help="keep empty documents as Megatron does (a document with no tokens) instead of "
                        "treating them as bad records")
    p.add_argument("--on-bad-record", choices=["fail", "skip"], default="fail",
                   help="fail: stop at the first bad record with file:line and the reason; skip: count "
                        "and report it")
    p.add_argument("--shard", help="i/N: tokenize the i-th of N byte ranges of the input")
    p.add_argument("--engine", choices=["auto", "gigatoken", "hf"], default="auto")
    p.add_argument("--workers", type=int, help="threads (default: the CPUs this job may use)")
    p.add_argument("--log-interval", type=int, default=10000)
    p.add_argument("--record", help="also write the JSON record to this file (atomically)")
    return p


def merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer tokenize merge")
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("parts", nargs="+", help="output prefixes of the shards, in order")
    return p


def main(argv: list[str]) -> int:
    is_merge = bool(argv) and argv[0] == "merge"
    args = (merge_parser() if is_merge else parser()).parse_args(argv[1:] if is_merge else argv)
    if not is_merge:
        # The Rust thread pools read this once, at first use: set it before any encode.
        workers = args.workers or len(os.sched_getaffinity(0))
        os.environ.setdefault("RAYON_NUM_THREADS", str(workers))
    try:
        record = merge(args) if is_merge else tokenize(args)
    except (BadRecord, TokenizerError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    emit(record, getattr(args, "record", None))  # the file's presence means the shard is complete
    return 0
