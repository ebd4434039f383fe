"""The baseline of the tokenize benchmark: the way Megatron-LM's tools/preprocess_data.py
works (core_v0.16.1), with its tokenizer call and its writer:

- a ``multiprocessing.Pool(workers)`` whose initializer builds the tokenizer in each worker;
- ``pool.imap(encode, input_file, 32)``, where ``encode`` does ``json.loads`` and one
  tokenizer call per document, then appends EOD to non-empty documents;
- the main process adds one document at a time with megatron-core's ``IndexedDatasetBuilder``.

The per-document call is the Hugging Face ``tokenizers`` engine that Megatron's
HuggingFaceTokenizer wraps (without transformers' Python layer around it, so if anything this
baseline is a little faster than the real tool).

    python benchmarks/megatron_style_preprocess.py INPUT OUTPUT_PREFIX VOCAB MERGES WORKERS
"""

import json
import multiprocessing
import sys

import numpy as np
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

_tokenizer = None
_eod = None


def _init(vocab: str, merges: str) -> None:
    global _tokenizer, _eod
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    _tokenizer = Tokenizer(models.BPE.from_file(vocab, merges))
    _tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    _tokenizer.decoder = decoders.ByteLevel()
    _eod = _tokenizer.token_to_id("<|endoftext|>")


def _encode(line: str):
    ids = _tokenizer.encode(json.loads(line)["text"]).ids
    if ids:
        ids.append(_eod)
    return ids, [len(ids)] if ids else [], len(line)


def main(input_path: str, prefix: str, vocab: str, merges: str, workers: str) -> None:
    vocab_size = len(json.load(open(vocab)))
    builder = IndexedDatasetBuilder(f"{prefix}_text_document.bin", dtype=DType.optimal_dtype(vocab_size))
    with open(input_path, encoding="utf-8") as fin, \
            multiprocessing.Pool(int(workers), initializer=_init, initargs=(vocab, merges)) as pool:
        for ids, lengths, _ in pool.imap(_encode, fin, 32):
            builder.add_document(np.array(ids, dtype=np.int64), lengths)
    builder.finalize(f"{prefix}_text_document.idx")


if __name__ == "__main__":
    main(*sys.argv[1:])
