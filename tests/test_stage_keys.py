"""Which spec fields move each cached stage's key, and which do not.

A key must change exactly when the stage's output would: a learning-rate change must not send a
user back to re-tokenizing terabytes, and a tokenizer change must. Each test computes the keys with
the stage's own function over real inputs (a fetched directory, tokenizer files, a checkpoint)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pretrain import manifest
from pretrain.presets import load_spec
from tasks.convert import convert_key_inputs
from tasks.fetch import fetch_key_inputs, list_sources
from tasks.tokenize import tokenize_key_inputs
from test_formats import ASSETS, tiny_llama

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

# Fields no cached stage's output depends on.
TRAINING_ONLY = ["training.lr=1.0e-2", "training.train_steps=7", "training.micro_batch_size=2",
                 "cluster.time_limit_min=9", "backend.native.compile=false", "paths.root=/elsewhere"]


def key(inputs: dict) -> str:
    return manifest.stable_hash(inputs)


def moved(compute, base: list[str], changes: list[str]) -> dict[str, bool]:
    """For each override: whether it changes the key computed from ``base`` plus it."""
    before = key(compute(load_spec("tiny-local", base)))
    return {change: key(compute(load_spec("tiny-local", [*base, change]))) != before for change in changes}


@pytest.fixture
def fetched(tmp_path) -> Path:
    """A fetch output holding the corpus, as the fetch stage leaves one."""
    inputs = {"sources": ["corpus.jsonl"]}
    final = manifest.output_dir(tmp_path, "fetch", key(inputs))
    with manifest.staged_output(final) as staging:
        shutil.copy(ASSETS / "corpus.jsonl", staging)
        manifest.write_manifest(staging, "fetch", inputs)
    return final


def test_tokenize_key_moves_with_the_tokenizer_and_the_text_fields_only(fetched, tmp_path):
    same_content, other = tmp_path / "same-tokenizer", tmp_path / "other-tokenizer"
    shutil.copytree(ASSETS / "hf", same_content)
    shutil.copytree(ASSETS / "hf", other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|begin_of_text|>"}))
    changes = moved(lambda spec: tokenize_key_inputs(spec, fetched), [f"tokenizer.path={ASSETS / 'hf'}"], [
        *TRAINING_ONLY, "model.num_layers=2", "model.seq_length=64",
        f"tokenizer.path={same_content}",
        f"tokenizer.path={other}", "tokenizer.append_eod=false", "data.json_keys=[text, title]"])
    assert [c for c, did in changes.items() if did] == [
        f"tokenizer.path={other}", "tokenizer.append_eod=false", "data.json_keys=[text, title]"]


def test_the_fetched_files_move_the_tokenize_key(fetched):
    spec = load_spec("tiny-local", [f"tokenizer.path={ASSETS / 'hf'}"])
    before = key(tokenize_key_inputs(spec, fetched))
    (fetched / "more.jsonl").write_text('{"text": "one more"}\n')
    assert key(tokenize_key_inputs(spec, fetched)) != before


def test_nxd_arrow_blocks_are_cut_to_the_sequence_length_so_it_moves_their_key(fetched):
    # NxDT's Llama configs validate on nothing (no stage writes a second Arrow set): eval_iters 0
    base = ["backend.kind=neuron", "backend.neuron.instance_type=trn1", f"tokenizer.path={ASSETS / 'hf'}",
            "training.eval_iters=0", "training.precision=mixed_precision"]

    def arrow_key(*extra: str) -> str:
        return key(tokenize_key_inputs(load_spec("tiny-local", [*base, *extra]), fetched))

    assert arrow_key("model.seq_length=64") != arrow_key()
    assert arrow_key("training.lr=1.0e-2") == arrow_key()
    native = load_spec("tiny-local", [f"tokenizer.path={ASSETS / 'hf'}"])
    assert key(tokenize_key_inputs(native, fetched)) != arrow_key()  # Megatron's .bin/.idx: other bytes


def test_fetch_key_moves_with_the_sources_only(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    shutil.copy(ASSETS / "corpus.jsonl", corpus)
    source = f"data.sources=[{{uri: {corpus}}}]"
    changes = moved(lambda spec: fetch_key_inputs(list_sources(spec)), [source], [
        *TRAINING_ONLY, f"tokenizer.path={ASSETS / 'hf'}", "model.num_layers=2",
        f"data.sources=[{{uri: {corpus}, decompress: true}}]", f"data.sources=[{{uri: {ASSETS}/}}]"])
    assert [c for c, did in changes.items() if did] == [
        f"data.sources=[{{uri: {corpus}, decompress: true}}]", f"data.sources=[{{uri: {ASSETS}/}}]"]
    before = key(fetch_key_inputs(list_sources(load_spec("tiny-local", [source]))))
    corpus.write_text(corpus.read_text() + '{"text": "appended"}\n')  # the object changed in the store
    assert key(fetch_key_inputs(list_sources(load_spec("tiny-local", [source])))) != before


def test_convert_key_moves_with_the_checkpoint_and_the_layout_only(tmp_path):
    source = tiny_llama(tmp_path / "hf")
    shape = ["backend.kind=neuron", "model.num_layers=2", "model.hidden_size=32", "model.num_attention_heads=4",
             "model.num_kv_heads=2", "model.ffn_hidden_size=48", "model.vocab_size=64",
             "model.max_position_embeddings=32", "model.seq_length=32", "cluster.nodes=1",
             "cluster.devices_per_node=4", "parallel.tp=2", "parallel.pp=2", "parallel.kv_replicator=1",
             "training.global_batch_size=4", "training.micro_batch_size=1", "parallel.pipeline_cuts=[]"]

    def convert_key(*extra: str) -> str:
        return key(convert_key_inputs(load_spec("llama3-70b", [*shape, *extra]), source))

    base = convert_key()
    assert convert_key("training.lr=1.0e-5") == base
    assert convert_key("tokenizer.append_eod=false") == base
    assert convert_key("training.train_steps=3") == base
    assert convert_key("parallel.pp=1", "cluster.devices_per_node=2") != base  # another layout
    assert convert_key("backend.neuron.instance_type=trn2", "backend.neuron.lnc=2") != base  # trn2 places K/V otherwise
    (source / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes()[:-4] + b"\1\2\3\4")
    assert convert_key() != base  # another training's weights


def test_fetch_key_of_an_hf_source_is_its_commit(tmp_path):
    """The revision is resolved to its commit: a moving main moves the key, a pinned commit keeps
    it, and main and the commit it points at are the same key."""
    from hub_server import LocalHub

    server = LocalHub()
    try:
        repo = server.repo("dataset", "org/corpus")
        first = repo.commit({"a.jsonl": (ASSETS / "corpus.jsonl").read_bytes()})
        hub = [f"hub.endpoint={server.endpoint}", f"hub.cache_dir={tmp_path}"]

        def fetch_key(uri: str, *extra: str) -> str:
            spec = load_spec("tiny-local", [*hub, f"data.sources=[{{uri: '{uri}'}}]", *extra])
            return key(fetch_key_inputs(list_sources(spec)))

        main, pinned = fetch_key("hf://datasets/org/corpus"), fetch_key(f"hf://datasets/org/corpus@{first}")
        assert main == pinned == fetch_key("hf://datasets/org/corpus", *TRAINING_ONLY)
        assert fetch_key("hf://datasets/org/corpus/*.jsonl") != main  # other files asked for
        repo.commit({"a.jsonl": b'{"text": "another corpus"}\n'})
        assert fetch_key("hf://datasets/org/corpus") != main
        assert fetch_key(f"hf://datasets/org/corpus@{first}") == pinned
    finally:
        server.close()
