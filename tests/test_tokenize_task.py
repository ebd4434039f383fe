"""The tokenize task on the local Slurm cluster: a failed shard is reported with its bad
record, the finished shards are kept, and the retry reruns only the failed one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect import flow

from pretrain import manifest
from pretrain.corpus import corpus_texts
from pretrain.presets import load_spec
from pretrain.toy_tokenizers import gpt2_style, llama3_style
from render.dataset_files import MissingTokenizerFile
from tasks.tokenize import ShardProgress, TokenizeFailed, tokenize
from trainer.tokenizer import load_tokenizer


@flow
def tokenize_once(spec, data_dir):
    return tokenize.with_options(retries=0)(spec, data_dir)


def fetched_corpus(root: Path, lines: list[str]) -> Path:
    """A fetch output, written the way the fetch stage writes one."""
    key_inputs = {"sources": ["corpus.jsonl"]}
    final = manifest.output_dir(root, "fetch", manifest.stable_hash(key_inputs))
    with manifest.staged_output(final) as staging:
        (staging / "corpus.jsonl").write_text("".join(lines))
        manifest.write_manifest(staging, "fetch", key_inputs)
    return final


def test_only_failed_shards_are_rerun(local_stack, tmp_path):
    texts = corpus_texts()
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    bad_at = len(lines) - 5
    lines[bad_at] = '{"text": truncated\n'
    data = fetched_corpus(tmp_path, lines)
    spec = load_spec("tiny-local", [f"paths.root={tmp_path}", "cluster.executor=slurm", "data.tokenize_shards=2",
                                    f"tokenizer.path={llama3_style(tmp_path / 'tok', texts)}"])

    failed = tokenize_once(spec, str(data), return_state=True)
    assert failed.is_failed()
    with pytest.raises(TokenizeFailed) as info:
        failed.result()
    assert "1 of 2 tokenize shards failed" in str(info.value)
    assert f"corpus.jsonl:{bad_at + 1}: not valid JSON" in str(info.value)
    (staging,) = (tmp_path / "tokenize").glob(".tokenize-*.partial")
    kept = staging / "parts" / "shard-0.json"
    assert kept.exists() and not (staging / "parts" / "shard-1.json").exists()
    first_run = json.loads(kept.read_text())["finished_at"]

    corpus = data / "corpus.jsonl"  # the bad record repaired where it lies
    corpus.write_text(corpus.read_text().replace('{"text": truncated\n', json.dumps({"text": "repaired"}) + "\n"))
    done = tokenize_once(spec, str(data), return_state=True)
    assert done.is_completed(), done.message
    out = Path(done.result()).parent
    meta = json.loads((out / "MANIFEST.json").read_text())
    assert meta["documents"] == len(texts) and [s["shard"] for s in meta["shards"]] == ["0/2", "1/2"]
    assert meta["shards"][0]["finished_at"] == first_run  # shard 0 ran once; only shard 1 was rerun
    assert meta["shards"][1]["finished_at"] > first_run
    assert not staging.exists()
    assert set(meta["files"]) == {"data_text_document.bin", "data_text_document.idx"}


def test_missing_tokenizer_is_named_before_anything_is_submitted(tmp_path):
    data = fetched_corpus(tmp_path, ['{"text": "x"}\n'])
    spec = load_spec("tiny-local", [f"paths.root={tmp_path}", f"tokenizer.path={tmp_path / 'nope'}"])
    state = tokenize_once(spec, str(data), return_state=True)
    with pytest.raises(MissingTokenizerFile, match=f"tokenizer file {tmp_path / 'nope'} not found"):
        state.result()
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("layout", ["megatron", "arrow"])
def test_a_fetched_dataset_that_is_tokenized_already_is_handed_on(layout, tmp_path):
    """The Trainium runbooks download tokenized data: Megatron .bin/.idx (GPT) or the Arrow blocks
    of NxD's get_dataset.py (Llama). Nothing is submitted for them."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from trainer.nxd_arrow import NxdArrowWriter

    data = manifest.output_dir(tmp_path, "fetch", "k" * 64)
    data.mkdir(parents=True)
    documents = [np.arange(1, 40 + i, dtype=np.int32) for i in range(5)]
    if layout == "megatron":
        builder = IndexedDatasetBuilder(str(data / "my-gpt2_text_document.bin"), dtype=np.uint16)
        for document in documents:
            builder.add_document(document, [len(document)])
        builder.finalize(str(data / "my-gpt2_text_document.idx"))
        expected = str(data / "my-gpt2_text_document")
        # Training reads the tokenizer's files beside the dataset: without them, fail naming them.
        spec = load_spec("megatron-gpt-6.7b", [f"paths.root={tmp_path}"])
        with pytest.raises(MissingTokenizerFile, match="gpt2-vocab.json not found"):
            tokenize_once(spec, str(data))
        # as fetch brings them with the preset's sources
        for path, name in zip(gpt2_style(tmp_path / "tok", corpus_texts()[:50]), ("gpt2-vocab.json", "gpt2-merges.txt")):
            path.rename(data / name)
    else:
        writer = NxdArrowWriter(tmp_path / "arrow", seq_length=16)
        writer.add_documents(np.concatenate(documents), np.array([len(d) for d in documents]))
        writer.finalize()
        for path in (tmp_path / "arrow").iterdir():  # as fetch lays out a local directory source
            path.rename(data / path.name)
        expected = str(data)
    spec = load_spec("megatron-gpt-6.7b" if layout == "megatron" else "llama3-70b", [f"paths.root={tmp_path}"])
    assert tokenize_once(spec, str(data)) == expected
    assert not (tmp_path / "tokenize").exists() and not (tmp_path / "jobs").exists()


def test_the_dataset_keeps_its_gpt2_tokenizer_where_the_launches_read_it(tmp_path):
    """A GPT spec names its tokenizer by URI or by a path on the control plane's machine; the
    nodes read the copy the tokenize stage keeps beside the dataset, as the launches name it."""
    from render.megatron_lm import pretrain_gpt_args
    from render.nxdt import nxdt_config

    texts = corpus_texts()[:100]
    data = fetched_corpus(tmp_path, [json.dumps({"text": t}) + "\n" for t in texts])
    vocab, merges = gpt2_style(tmp_path / "tok", texts)
    overrides = [f"paths.root={tmp_path}", f"tokenizer.vocab_file={vocab}", f"tokenizer.merges_file={merges}",
                 "cluster.executor=local"]
    for preset in ("megatron-gpt-6.7b", "gpt3-7.5b-gpu"):
        spec = load_spec(preset, overrides)
        dataset = tokenize_once(spec, str(data))
        if preset == "megatron-gpt-6.7b":
            tokenizer = nxdt_config(spec, dataset)["data"]["tokenizer"]
            read = [tokenizer["vocab_file"], tokenizer["merge_file"]]
        else:
            args = pretrain_gpt_args(spec, dataset, "/ckpt")
            read = [args[args.index("--vocab-file") + 1], args[args.index("--merge-file") + 1]]
        assert [Path(p).read_bytes() for p in read] == [vocab.read_bytes(), merges.read_bytes()]
        assert Path(read[0]).parent == Path(dataset).parent


def test_nxdt_llama_specs_get_nxd_arrow_blocks_of_their_sequence_length(local_stack, tmp_path):
    import datasets

    texts = corpus_texts()[:300]
    data = fetched_corpus(tmp_path, [json.dumps({"text": t}) + "\n" for t in texts])
    tokenizer = llama3_style(tmp_path / "tok", corpus_texts())
    spec = load_spec("llama3-70b", [f"paths.root={tmp_path}", f"tokenizer.path={tokenizer}", "model.seq_length=64",
                                    "cluster.executor=slurm", "cluster.time_limit_min=10",
                                    # the 70B run's own start-up, save and step time fit no 10-minute job
                                    "cluster.startup_min=1", "backend.neuron.save_before_limit_s=60",
                                    "training.step_time_s=null"])
    out = tokenize_once(spec, str(data))
    assert out.endswith("/data_text") and Path(out).parent.parent == tmp_path / "tokenize"
    blocks = datasets.load_from_disk(out)
    assert blocks.column_names == ["input_ids", "attention_mask", "labels"]
    assert len(blocks) > 10 and {len(row) for row in blocks["input_ids"]} == {64}
    bos = load_tokenizer("hf", model=str(tokenizer))._hf.token_to_id("<|begin_of_text|>")
    assert blocks[0]["input_ids"][0] == bos  # every document starts with <|begin_of_text|>, as get_dataset.py's
    meta = json.loads((Path(out).parent / "MANIFEST.json").read_text())
    assert meta["documents"] == len(texts) and meta["key_inputs"]["output"] == "nxd-arrow"


@pytest.mark.pure
def test_shard_progress_sums_each_shards_latest_line():
    """The task reads the progress line each array task prints (srun-labelled or not) and sums the
    latest per shard; other output is not progress."""
    progress = ShardProgress(shards=3, every_s=float("inf"))
    progress(0, "Processed 1000 documents (500.0 docs/s, 1.50 MB/s).")
    progress(0, "Processed 2000 documents (400.0 docs/s, 1.25 MB/s).")
    progress(1, "0: Processed 3000 documents (600.0 docs/s, 2.00 MB/s).")
    progress(1, "Traceback (most recent call last):")
    assert progress.summary() == "tokenize: 5000 documents so far from 2 of 3 shards (1000 docs/s, 3.2 MiB/s of JSON)"
