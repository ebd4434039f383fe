"""torchtitan's own loader on what the fetch stage leaves: the rendered arguments parsed by
torchtitan 0.3.0, then its tokenizer and dataloader built from that config as its Trainer builds
them (``Trainer.__init__`` in torchtitan/trainer.py), on this CPU."""

from __future__ import annotations

import os

import datasets
import pytest
from torchtitan.config import manager as config_manager

from pretrain import manifest
from pretrain.corpus import corpus_texts, write_jsonl
from pretrain.presets import load_spec
from pretrain.spec import TORCHTITAN_FLAVOURS, flavour_overrides
from pretrain.toy_tokenizers import llama3_style
from render.torchtitan import train_args
from tasks.train_torchtitan import loader_view

pytestmark = pytest.mark.pure


def first_batch(config):
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=config.training.seq_len,
                                     local_batch_size=config.training.local_batch_size)
    return next(iter(loader))


def test_torchtitans_loader_reads_the_fetched_jsonl_and_not_the_fetch_manifest(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    write_jsonl(fetched / "corpus.jsonl", 300_000)
    manifest.write_manifest(fetched, "fetch", {"sources": ["corpus.jsonl"]})
    vocab = TORCHTITAN_FLAVOURS["debugmodel"][4]
    tokenizer = llama3_style(tmp_path / "tokenizer", corpus_texts(300_000), vocab_size=vocab)
    spec = load_spec("llama3-8b-gpu", [*flavour_overrides("debugmodel"), "model.seq_length=512",
                                       "cluster.devices_per_node=1", "training.global_batch_size=4",
                                       "training.micro_batch_size=4", f"tokenizer.path={tokenizer}"])
    run = tmp_path / "run"
    view = loader_view(fetched, run)
    assert sorted(p.name for p in view.iterdir()) == ["corpus.jsonl"]
    assert not os.readlink(view / "corpus.jsonl").startswith("/")  # holds wherever the disk is mounted

    inputs, labels = first_batch(config_manager.ConfigManager().parse_args(train_args(spec, str(view), str(run))))
    tokens = inputs["input"]
    assert tuple(tokens.shape) == tuple(labels.shape) == (4, 512)
    assert int(tokens.max()) < vocab and int(tokens.min()) >= 0
    assert (tokens[0, 1:] == labels[0, :-1]).all()  # the labels are the next tokens
    # the same loader pointed at the fetch output itself reads MANIFEST.json as data and fails
    with pytest.raises(datasets.exceptions.DatasetGenerationError):
        first_batch(config_manager.ConfigManager().parse_args(train_args(spec, str(fetched), str(run))))
