"""The tokenize node program: byte-identical to Megatron's writer for the same token ids, read
back through megatron-core, sharded + merged equal to unsharded, and bad input reported by
file and line with nothing half-written left behind."""

from __future__ import annotations

import gzip
import json
import lzma
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from pretrain.corpus import corpus_texts
from pretrain.log_parsers import preprocess_progress
from pretrain.toy_tokenizers import gpt2_style, llama3_style, sentencepiece_model
from trainer.indexed_dataset import optimal_dtype
from trainer.tokenize import Progress
from trainer.tokenizer import load_tokenizer

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

TOKENIZE = [sys.executable, "-m", "trainer", "tokenize"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus_texts()


@pytest.fixture(scope="module")
def assets(tmp_path_factory, texts):
    root = tmp_path_factory.mktemp("tokenizers")
    vocab, merges = gpt2_style(root / "gpt2", texts)
    return {
        "gpt2-bpe": ["--tokenizer-type", "gpt2-bpe", "--vocab-file", str(vocab), "--merge-file", str(merges)],
        "hf": ["--tokenizer-type", "hf", "--tokenizer-model", str(llama3_style(root / "llama3", texts))],
        "sentencepiece": ["--tokenizer-type", "sentencepiece", "--tokenizer-model",
                          str(sentencepiece_model(root / "sp", texts))],
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, texts) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([*TOKENIZE, *args], capture_output=True, text=True)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def tokenizer_of(args: list[str]):
    opts = dict(zip(args[::2], args[1::2]))
    return load_tokenizer(opts["--tokenizer-type"], vocab_file=opts.get("--vocab-file"),
                          merges_file=opts.get("--merge-file"), model=opts.get("--tokenizer-model"))


def megatron_reference(prefix: Path, texts: list[str], tokenizer, append_eod: bool) -> None:
    """What preprocess_data.py writes: per-document tokenizer calls, EOD appended to non-empty
    documents, megatron-core's IndexedDatasetBuilder adding one document at a time."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=optimal_dtype(tokenizer.vocab_size).type)
    for text in texts:
        if tokenizer.kind == "sentencepiece":
            ids = list(tokenizer._sp.encode(text))
        else:  # Megatron's HuggingFaceTokenizer adds the tokenizer's own specials (Llama 3: BOS)
            ids = tokenizer._hf.encode(text, add_special_tokens=tokenizer.kind == "hf").ids
        if ids and append_eod:
            ids = ids + [tokenizer.eod]
        builder.add_document(ids, [len(ids)] if ids else [])
    builder.finalize(f"{prefix}.idx")


@pytest.mark.parametrize("kind", ["gpt2-bpe", "hf", "sentencepiece"])
def test_output_is_byte_identical_to_megatrons_writer(kind, assets, corpus, texts, tmp_path):
    record = json.loads(run("--input", str(corpus), "--output-prefix", str(tmp_path / "ours"),
                            "--append-eod", *assets[kind]).stdout.splitlines()[-1])
    tokenizer = tokenizer_of(assets[kind])
    megatron_reference(tmp_path / "megatron", texts, tokenizer, append_eod=True)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours_text_document{suffix}").read_bytes() == \
            (tmp_path / f"megatron{suffix}").read_bytes(), suffix
    assert record["documents"] == len(texts)
    if kind == "hf":  # Llama 3 style: BOS first, EOS last, in every document
        dataset = IndexedDataset(str(tmp_path / "ours_text_document"))
        assert dataset[0][0] == tokenizer.prefix[0] and dataset[0][-1] == tokenizer.eod


def test_every_document_decodes_back_to_its_text(assets, corpus, texts, tmp_path):
    run("--input", str(corpus), "--output-prefix", str(tmp_path / "c"), "--append-eod", *assets["gpt2-bpe"])
    dataset = IndexedDataset(str(tmp_path / "c_text_document"))
    tokenizer = tokenizer_of(assets["gpt2-bpe"])
    assert len(dataset) == len(texts) and dataset.index.dtype == np.uint16
    for i, text in enumerate(texts):
        ids = dataset[i]
        assert ids[-1] == tokenizer.eod
        assert tokenizer._hf.decode(ids[:-1].tolist()) == text


def test_gpt_dataset_builds_samples_from_the_output(assets, corpus, tmp_path):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from trainer.train.data import EodTokenizer

    run("--input", str(corpus), "--output-prefix", str(tmp_path / "c"), "--append-eod", *assets["gpt2-bpe"])
    tokenizer = tokenizer_of(assets["gpt2-bpe"])

    config = GPTDatasetConfig(  # as the trainer builds it (trainer/train/data.py)
        random_seed=1234, sequence_length=128, blend=([str(tmp_path / "c_text_document")], None),
        split="949,50,1", tokenizer=EodTokenizer(tokenizer.eod), reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, path_to_cache=str(tmp_path / "cache"),
        mid_level_dataset_surplus=0.005)
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [64, 8, 0], lambda: True, config).build()
    sample = train[0]
    assert sample["tokens"].shape == (128,) and len(train) >= 64 and len(valid) >= 8


@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_and_merged_equals_unsharded(assets, corpus, tmp_path, shards):
    run("--input", str(corpus), "--output-prefix", str(tmp_path / "whole"), "--append-eod", *assets["hf"])
    parts = []
    for i in range(shards):
        prefix = tmp_path / f"part{i}"
        run("--input", str(corpus), "--output-prefix", str(prefix), "--append-eod", "--shard", f"{i}/{shards}",
            *assets["hf"])
        parts.append(str(prefix))
    run("merge", "--output-prefix", str(tmp_path / "merged"), *parts)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"merged_text_document{suffix}").read_bytes() == \
            (tmp_path / f"whole_text_document{suffix}").read_bytes()


def test_compressed_and_multiple_inputs_tokenize_like_one_file(assets, corpus, tmp_path):
    lines = corpus.read_bytes().splitlines(keepends=True)
    third = len(lines) // 3
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[:third])))
    (inputs / "b.jsonl.xz").write_bytes(lzma.compress(b"".join(lines[third:2 * third])))
    (inputs / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines[2 * third:])))
    run("--input", str(inputs), "--output-prefix", str(tmp_path / "dir"), "--append-eod", *assets["gpt2-bpe"])
    run("--input", str(corpus), "--output-prefix", str(tmp_path / "one"), "--append-eod", *assets["gpt2-bpe"])
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"dir_text_document{suffix}").read_bytes() == \
            (tmp_path / f"one_text_document{suffix}").read_bytes()


BAD_LINES = {
    "not json": (b'{"text": "fine"}\n{"text": broken\n', "2: not valid JSON"),
    "missing key": (b'{"text": "fine"}\n{"body": "x"}\n', "2: no 'text' key"),
    "not a string": (b'{"text": ["a", "b"]}\n', "1: 'text' is a list, not a string"),
    "invalid utf-8": (b'{"text": "fine"}\n{"text": "caf\xe9"}\n', "2: invalid UTF-8"),
    "empty": (b'{"text": "fine"}\n{"text": ""}\n', "2: empty document"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_records_stop_with_file_and_line_and_leave_no_dataset(case, assets, tmp_path):
    content, expected = BAD_LINES[case]
    data = tmp_path / "bad.jsonl"
    data.write_bytes(content)
    out = run("--input", str(data), "--output-prefix", str(tmp_path / "o"), *assets["gpt2-bpe"], check=False)
    assert out.returncode == 2
    assert f"{data}:{expected}" in out.stderr
    assert list(tmp_path.glob("o_*")) == []  # no .bin/.idx, not even partial files

    skipped = run("--input", str(data), "--output-prefix", str(tmp_path / "s"), "--on-bad-record", "skip",
                  *assets["gpt2-bpe"])
    record = json.loads(skipped.stdout.splitlines()[-1])
    assert record["skipped"] == 1 and expected in record["skipped_records"][0]


def test_empty_documents_kept_like_megatron(assets, tmp_path):
    data = tmp_path / "e.jsonl"
    data.write_text('{"text": "first"}\n{"text": ""}\n{"text": "third"}\n')
    run("--input", str(data), "--output-prefix", str(tmp_path / "o"), "--append-eod", "--keep-empty",
        *assets["gpt2-bpe"])
    tokenizer = tokenizer_of(assets["gpt2-bpe"])
    megatron_reference(tmp_path / "m", ["first", "", "third"], tokenizer, append_eod=True)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"o_text_document{suffix}").read_bytes() == (tmp_path / f"m{suffix}").read_bytes()
    assert IndexedDataset(str(tmp_path / "o_text_document")).document_indices.tolist() == [0, 1, 1, 2]


def test_truncated_compressed_input_is_reported(assets, corpus, tmp_path):
    data = tmp_path / "t.jsonl.zst"
    data.write_bytes(zstandard.ZstdCompressor().compress(corpus.read_bytes())[:5000])
    out = run("--input", str(data), "--output-prefix", str(tmp_path / "o"), *assets["gpt2-bpe"], check=False)
    assert out.returncode == 2 and f"{data}: truncated or corrupt" in out.stderr
    assert list(tmp_path.glob("o_*")) == []


def test_missing_or_broken_tokenizer_files_are_named(corpus, tmp_path):
    out = run("--input", str(corpus), "--output-prefix", str(tmp_path / "o"), "--tokenizer-type", "gpt2-bpe",
              "--vocab-file", str(tmp_path / "nope.json"), "--merge-file", str(tmp_path / "m.txt"), check=False)
    assert out.returncode == 2 and f"{tmp_path / 'nope.json'}: no such file" in out.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    out = run("--input", str(corpus), "--output-prefix", str(tmp_path / "o"), "--tokenizer-type", "hf",
              "--tokenizer-model", str(broken), check=False)
    assert out.returncode == 2 and f"{broken / 'tokenizer.json'}: not a Hugging Face tokenizer.json" in out.stderr


def test_disk_full_leaves_no_dataset(assets, corpus, filesystem):
    mount = filesystem(256 * 1024)
    out = run("--input", str(corpus), "--output-prefix", str(mount / "o"), *assets["gpt2-bpe"], check=False)
    assert out.returncode == 2 and "disk full" in out.stderr
    assert list(mount.iterdir()) == []


def get_dataset_reference(texts: list[str], tokenizer_dir: Path, block_size: int):
    """NxD's get_dataset.py, step by step: datasets.map(tokenize, batched), then group_texts
    concatenating each 1,000-row batch and cutting it into blocks."""
    import datasets
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    raw = datasets.Dataset.from_dict({"text": texts})
    tokenized = raw.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])

    def group_texts(examples):
        concatenated = {k: sum(examples[k], []) for k in examples}
        total = (len(concatenated["input_ids"]) // block_size) * block_size
        result = {k: [t[i:i + block_size] for i in range(0, total, block_size)] for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    return tokenized.map(group_texts, batched=True)


def test_nxd_arrow_matches_nxds_get_dataset(assets, corpus, texts, tmp_path):
    import datasets

    tokenizer_dir = Path(assets["hf"][-1])
    run("--input", str(corpus), "--output-prefix", str(tmp_path / "nxd"), "--format", "nxd-arrow",
        "--seq-length", "256", *assets["hf"])
    ours = datasets.load_from_disk(str(tmp_path / "nxd_text"))
    reference = get_dataset_reference(texts, tokenizer_dir, 256)
    assert ours.num_rows == reference.num_rows > 0
    assert ours.features == reference.features
    for column in ("input_ids", "attention_mask", "labels"):
        assert ours[column] == reference[column]


def test_the_progress_line_reads_back_as_the_tokenize_stage_reads_megatrons(capsys):
    """``trainer tokenize`` prints Megatron's progress line; the parser the task streams it through
    reads back the documents and both rates."""
    progress = Progress(interval=1000)
    progress.update(999, 1 << 20)  # below the interval: nothing printed
    progress.update(1000, 3 << 20)
    line = capsys.readouterr().err.strip()
    read = preprocess_progress(line)
    assert line.startswith("Processed 1000 documents (") and read is not None
    assert read["documents"] == 1000 and read["docs_per_s"] > 0 and read["mib_per_s"] > 0
    assert read["mib_per_s"] == pytest.approx(3 * read["docs_per_s"] / 1000, rel=0.01)
