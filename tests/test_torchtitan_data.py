"""torchtitan's own loader on what the fetch stage leaves: the rendered arguments parsed by
torchtitan 0.3.0, then its tokenizer and dataloader built from that config as its Trainer builds
them (``Trainer.__init__`` in torchtitan/trainer.py), on this CPU."""

from __future__ import annotations

import os
from dataclasses import replace

import datasets
import pytest
from torchtitan.config import manager as config_manager

from pretrain import manifest
from pretrain.corpus import corpus_texts, write_jsonl
from pretrain.presets import load_spec
from pretrain.spec import TORCHTITAN_FLAVOURS, flavour_overrides
from pretrain.toy_tokenizers import llama3_style
from render.torchtitan import SplitRefused, loader_view, train_args, validation_dir
from tasks.train_torchtitan import train_torchtitan

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
    view = loader_view(fetched, run, spec.data)
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


def linked(view):
    return sorted(str(path.relative_to(view)) for path in view.rglob("*") if path.is_symlink())


def test_a_validation_weight_holds_the_last_files_out_of_training_for_torchtitans_validator(tmp_path, monkeypatch):
    """data.split's validation share of the fetched files, whole files, in a folder of its own that
    torchtitan's validator reads with the same loader entry (its dataloader built from the parsed
    config as ``Validator.validate`` builds it, infinite for a fixed number of steps)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    write_jsonl(tmp_path / "corpus.jsonl", 300_000)
    lines = (tmp_path / "corpus.jsonl").read_text().splitlines(keepends=True)
    for shard in range(4):
        (fetched / f"shard-{shard}.jsonl").write_text("".join(lines[shard::4]))
    manifest.write_manifest(fetched, "fetch", {"sources": ["shard-*.jsonl"]})
    vocab = TORCHTITAN_FLAVOURS["debugmodel"][4]
    tokenizer = llama3_style(tmp_path / "tokenizer", corpus_texts(300_000), vocab_size=vocab)
    spec = load_spec("llama3-8b-gpu", [*flavour_overrides("debugmodel"), "model.seq_length=512",
                                       "cluster.devices_per_node=1", "training.global_batch_size=4",
                                       "training.micro_batch_size=4", f"tokenizer.path={tokenizer}",
                                       "data.split=75,25,0", "training.eval_iters=2", "training.eval_interval=5"])
    run = tmp_path / "run"
    view = loader_view(fetched, run, spec.data)
    trained, held_out = linked(view), linked(validation_dir(run))
    assert (trained, held_out) == (["shard-0.jsonl", "shard-1.jsonl", "shard-2.jsonl"], ["shard-3.jsonl"])
    assert not set(trained) & set(held_out)  # a held-out file is never trained on

    config = config_manager.ConfigManager().parse_args(train_args(spec, str(view), str(run)))
    assert config.validator.dataloader.dataset_path == str(validation_dir(run))
    built = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = replace(config.validator.dataloader, infinite=True).build(
        dp_world_size=1, dp_rank=0, tokenizer=built, seq_len=config.training.seq_len,
        local_batch_size=config.training.local_batch_size)
    inputs, labels = next(iter(loader))
    assert tuple(inputs["input"].shape) == tuple(labels.shape) == (4, 512)


@pytest.mark.parametrize("split, files, held_out", [
    ("75,25,0", 4, 1), ("60,40,0", 10, 4), ("969,30,0", 10, 1),  # the share, and at least one file
    ("50,50,0", 2, 1), ("10,90,0", 3, 2),                           # and one file left to train on
    ("100,0,0", 1, 0),                                              # no validation share: every file trains
])
def test_the_validation_share_is_counted_in_whole_files(tmp_path, split, files, held_out):
    fetched = tmp_path / "fetched"
    (fetched / "part").mkdir(parents=True)
    for index in range(files):
        (fetched / "part" / f"{index:02d}.jsonl").write_text("{}\n")
    (fetched / ".partial").write_text("")  # a download in progress is no data
    manifest.write_manifest(fetched, "fetch", {})
    run = tmp_path / "run"
    (validation_dir(run) / "stale").mkdir(parents=True)  # an earlier run's view goes
    view = loader_view(fetched, run, load_spec("llama3-8b-gpu", [f"data.split={split}"]).data)
    names = [f"part/{index:02d}.jsonl" for index in range(files)]
    assert linked(view) == names[:files - held_out]
    assert linked(validation_dir(run)) == names[files - held_out:]


def test_a_validation_share_of_a_single_fetched_file_fails_before_any_job_is_queued(tmp_path):
    spec = load_spec("llama3-8b-gpu", ["data.split=99,1,0", "training.eval_iters=10", f"paths.root={tmp_path}"])
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    write_jsonl(fetched / "corpus.jsonl", 10_000)
    manifest.write_manifest(fetched, "fetch", {})
    # the task raises before it looks for a cluster; no retry finds other files
    with pytest.raises(SplitRefused, match="data.split='99,1,0' holds whole files out .* has 1 file.*add a "
                                           "data.sources entry, or set data.split='100,0,0' and training.eval_iters=0"):
        train_torchtitan.fn(spec, str(fetched))
    assert SplitRefused.retryable is False
