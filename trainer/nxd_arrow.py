"""NxD's Hugging Face Arrow format for ``hf_llama`` models: what NxD's ``get_dataset.py`` saves
(aws-neuron/neuronx-distributed ``examples/training/llama/get_dataset.py``; NxDT reads it with
``datasets.load_from_disk(data.train_dir)``).

Documents are tokenized with the tokenizer's own specials (Llama 3: BOS first, no EOS),
concatenated in groups of 1,000 documents (``datasets.map``'s default batch), and each group is
cut into blocks of exactly ``seq_length`` tokens, its remainder dropped. Columns: ``input_ids``,
``attention_mask`` (all ones) and ``labels`` (a copy), typed as ``datasets`` types them; saved
with ``save_to_disk`` for ``datasets.load_from_disk``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

GROUP_DOCUMENTS = 1000  # get_dataset.py's map batch: the unit whose remainder is dropped
SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("attention_mask", pa.list_(pa.int8())),
                    ("labels", pa.list_(pa.int64()))])


class NxdArrowWriter:
    def __init__(self, directory: str | Path, seq_length: int):
        self.directory = Path(directory)
        self.partial = self.directory.with_name(self.directory.name + ".partial")
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        self.stream_path = self.partial / "blocks.arrow"
        self._sink = pa.OSFile(str(self.stream_path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, SCHEMA)
        self.seq_length = seq_length
        self._pending: list[np.ndarray] = []
        self._pending_docs = 0
        self.blocks = 0
        self.documents = 0

    def add_documents(self, tokens: np.ndarray, doc_lengths: np.ndarray) -> None:
        ends = np.cumsum(doc_lengths)
        start_doc, start_tok = 0, 0
        while start_doc < len(doc_lengths):
            take = min(GROUP_DOCUMENTS - self._pending_docs, len(doc_lengths) - start_doc)
            end_tok = int(ends[start_doc + take - 1])
            self._pending.append(tokens[start_tok:end_tok])
            self._pending_docs += take
            start_doc, start_tok = start_doc + take, end_tok
            if self._pending_docs == GROUP_DOCUMENTS:
                self._emit_group()
        self.documents += len(doc_lengths)

    def _emit_group(self) -> None:
        group = np.concatenate(self._pending) if self._pending else np.zeros(0, np.int64)
        self._pending, self._pending_docs = [], 0
        blocks = len(group) // self.seq_length
        if blocks == 0:
            return
        values = group[: blocks * self.seq_length]
        offsets = pa.array(np.arange(blocks + 1, dtype=np.int32) * self.seq_length)
        column = lambda dtype, data: pa.ListArray.from_arrays(offsets, pa.array(data, dtype))  # noqa: E731
        self._writer.write_batch(pa.record_batch(
            [column(pa.int32(), values.astype(np.int32)), column(pa.int8(), np.ones(len(values), np.int8)),
             column(pa.int64(), values.astype(np.int64))], schema=SCHEMA))
        self.blocks += blocks

    def finalize(self) -> dict[str, int]:
        self._emit_group()
        self._writer.close()
        self._sink.close()
        import datasets

        dataset = datasets.Dataset.from_file(str(self.stream_path))
        saved = self.partial / "dataset"
        dataset.save_to_disk(str(saved))
        del dataset
        if self.directory.exists():
            shutil.rmtree(self.directory)
        saved.rename(self.directory)
        shutil.rmtree(self.partial)
        return {"documents": self.documents, "blocks": self.blocks, "tokens": self.blocks * self.seq_length}

    def abort(self) -> None:
        self._sink.close()
        shutil.rmtree(self.partial, ignore_errors=True)
