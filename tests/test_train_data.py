"""The trainer's data: samples whose labels are the next tokens of the .bin, Megatron's seeded
order and blend, the same build under torch.distributed (gloo, two ranks sharing one cache),
micro-batches that split across data-parallel ranks and resume at the exact sample, NxD Arrow
blocks with NxDT's shifted targets, and bad inputs named."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from trainer.indexed_dataset import IndexedDatasetWriter
from trainer.nxd_arrow import NxdArrowWriter
from trainer.train.data import BatchLoader, DataConfig, build_datasets

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

REPO = Path(__file__).resolve().parents[1]
EOD = 30000
SEQ = 64


def write_megatron(prefix: Path, documents: list[np.ndarray]) -> str:
    writer = IndexedDatasetWriter(prefix, np.uint16)
    writer.add_documents(np.concatenate(documents), np.array([len(d) for d in documents]))
    writer.finalize()
    return str(prefix)


def unique_token_documents(seed: int, first_id: int, count: int, documents: int = 200) -> list[np.ndarray]:
    """Every id in [first_id, first_id + count) once, cut into documents that end with EOD, so a
    token's position in the .bin is known from its value."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.arange(first_id, first_id + count))
    cuts = np.sort(rng.choice(np.arange(1, count), size=documents - 1, replace=False))
    return [np.append(part, EOD) for part in np.split(ids, cuts)]


def tokens_of(dataset, count: int) -> list[list[int]]:
    return [dataset[i]["tokens"].tolist() for i in range(count)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("megatron")
    return {"a": write_megatron(root / "a_text_document", unique_token_documents(1, 0, 10000)),
            "b": write_megatron(root / "b_text_document", unique_token_documents(2, 10000, 10000))}


@pytest.fixture(scope="module")
def train_set(corpora, tmp_path_factory):
    cfg = DataConfig(paths=[corpora["a"]], cache_dir=str(tmp_path_factory.mktemp("cache")))
    train, _ = build_datasets(cfg, seq_length=SEQ, seed=1, train_samples=100, valid_samples=0, eod_id=EOD)
    return train


def test_labels_are_the_next_tokens_of_the_bin(corpora, train_set):
    raw = np.fromfile(f"{corpora['a']}.bin", dtype=np.uint16).astype(np.int64)
    position = np.full(EOD + 1, -1)
    words = np.flatnonzero(raw != EOD)
    position[raw[words]] = words
    document_starts = raw[np.r_[0, np.flatnonzero(raw == EOD)[:-1] + 1]]
    crossed = 0
    for i in range(len(train_set)):
        item = train_set[i]
        tokens, labels = item["tokens"].numpy(), item["labels"].numpy()
        assert item["tokens"].dtype == item["labels"].dtype == torch.int64
        assert item["loss_mask"].dtype == torch.float32 and item["loss_mask"].tolist() == [1.0] * SEQ
        assert tokens.shape == labels.shape == (SEQ,)
        inside = tokens != EOD
        assert (labels[inside] == raw[position[tokens[inside]] + 1]).all()
        # after an EOD comes the first token of the next document in the shuffled order
        assert np.isin(labels[~inside], document_starts).all()
        crossed += int((~inside).sum())
    assert len(train_set) >= 100 and crossed > 0


def test_order_is_fixed_by_the_seed(corpora, tmp_path, train_set):
    def build(seed: int, cache: str):
        cfg = DataConfig(paths=[corpora["a"]], cache_dir=str(tmp_path / cache))
        return build_datasets(cfg, seq_length=SEQ, seed=seed, train_samples=100, valid_samples=0, eod_id=EOD)[0]

    first = tokens_of(build(1, "fresh"), 50)
    assert first == tokens_of(train_set, 50)  # built in another cache dir
    assert first == tokens_of(build(1, "fresh"), 50)  # read back from the cache
    other = tokens_of(build(2, "seed2"), 50)
    assert other != first
    assert sorted(map(tuple, other)) != sorted(map(tuple, first))  # not only reordered samples


@pytest.mark.parametrize("weights, share_of_a", [([1.0, 3.0], 0.25), (None, 0.5)])
def test_blend_follows_the_weights(corpora, tmp_path, weights, share_of_a):
    cfg = DataConfig(paths=[corpora["a"], corpora["b"]], weights=weights, cache_dir=str(tmp_path / "cache"))
    train, valid = build_datasets(cfg, seq_length=SEQ, seed=3, train_samples=400, valid_samples=16, eod_id=EOD)
    sources = []
    for i in range(400):
        words = train[i]["tokens"][train[i]["tokens"] != EOD]
        assert (words < 10000).all() or (words >= 10000).all()  # each sample comes from one dataset
        sources.append("a" if words[0] < 10000 else "b")
    assert abs(sources.count("a") - share_of_a * 400) <= 2
    assert valid is not None and len(valid) >= 16
    valid_sources = {"a" if valid[i]["tokens"][0] < 10000 else "b" for i in range(len(valid))}
    assert valid_sources == {"a", "b"}
    assert any(p.name.endswith("GPTDataset-train-shuffle_index.npy") for p in (tmp_path / "cache").iterdir())


DISTRIBUTED_BUILD = """
import json, sys
import numpy as np
import torch.distributed as dist
from trainer.train.data import DataConfig, build_datasets

a, b, cache, out = sys.argv[1:]
dist.init_process_group("gloo")
results = []
for _ in range(2):  # the second build reads the cache the first one wrote
    cfg = DataConfig(paths=[a, b], weights=[1.0, 3.0], cache_dir=cache)
    train, valid = build_datasets(cfg, seq_length=64, seed=5, train_samples=200, valid_samples=8, eod_id=%d)
    blend = train.dataset  # indices built in memory, or memory-mapped from the cache
    read_back = [isinstance(blend.dataset_index, np.memmap)] + [
        isinstance(d.shuffle_index, np.memmap) for d in blend.datasets]
    results.append({"train": [train[i]["tokens"].tolist() for i in range(0, 200, 7)],
                    "valid": [valid[i]["tokens"].tolist() for i in range(8)], "read_back": read_back})
with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
    json.dump(results, f)
dist.destroy_process_group()
""" % EOD


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_ranks_share_one_cache_and_get_the_same_data(corpora, tmp_path):
    script = tmp_path / "build.py"
    script.write_text(DISTRIBUTED_BUILD)
    cache = tmp_path / "shared-cache"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "PYTHONPATH": str(REPO)}
    ranks = [subprocess.Popen([sys.executable, str(script), corpora["a"], corpora["b"], str(cache), str(tmp_path)],
                              env={**env, "RANK": str(rank)}, cwd=REPO, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    for rank in ranks:
        _, err = rank.communicate(timeout=180)
        assert rank.returncode == 0, err[-3000:]

    cfg = DataConfig(paths=[corpora["a"], corpora["b"]], weights=[1.0, 3.0], cache_dir=str(tmp_path / "alone"))
    train, valid = build_datasets(cfg, seq_length=SEQ, seed=5, train_samples=200, valid_samples=8, eod_id=EOD)
    alone = {"train": [train[i]["tokens"].tolist() for i in range(0, 200, 7)],
             "valid": tokens_of(valid, 8)}
    for rank in range(2):
        builds = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # rank 0 built the indices; rank 1 waited, then read them; the second build read them all
        assert [b.pop("read_back") for b in builds] == [[rank == 1] * 3, [True] * 3]
        assert builds == [alone, alone]
    names = [p.name for p in cache.iterdir()]
    assert sum(n.endswith("GPTDataset-train-shuffle_index.npy") for n in names) == 2  # one per prefix
    assert sum(n.endswith("BlendedDataset-train-dataset_index.npy") for n in names) == 1


QUIET_BUILD = """
import sys, warnings
from trainer.train.data import DataConfig, build_datasets

cfg = DataConfig(paths=sys.argv[1:3], weights=[1.0, 1.0], cache_dir=None)
build_datasets(cfg, seq_length=64, seed=1, train_samples=10, valid_samples=0, eod_id=30000)
print(sorted(name for name in sys.modules if name.startswith("megatron.core.optimizer") or name == "torch._inductor"))
warnings.warn("Transformer Engine and Apex are not installed (this program's own warning)")
"""


def test_megatron_data_layer_loads_without_its_model_and_optimizer_code(corpora):
    """megatron-core's package __init__ imports its optimizer and FSDP modules, which warned four
    times per rank that Transformer Engine and Apex are missing, and its model code, whose
    torch.compile decorators import torch's inductor: seconds of every rank's start-up. The
    trainer builds the datasets without any of them; a warning of its own still shows."""
    out = subprocess.run([sys.executable, "-W", "default", "-c", QUIET_BUILD, corpora["a"], corpora["b"]],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "[]", out.stdout[-3000:]
    warned = [line for line in out.stderr.splitlines() if "Transformer Engine and Apex are not installed" in line]
    assert warned == ["<string>:8: UserWarning: Transformer Engine and Apex are not installed "
                      "(this program's own warning)"], out.stderr[-3000:]


def test_data_parallel_ranks_split_the_same_global_order(train_set):
    whole = BatchLoader(train_set, micro_batch_size=4, dp_rank=0, dp_size=1)
    halves = [BatchLoader(train_set, micro_batch_size=2, dp_rank=r, dp_size=2) for r in range(2)]
    for step in range(5):
        batch = whole.next_batch()
        parts = [loader.next_batch() for loader in halves]
        assert set(batch) == {"tokens", "labels", "loss_mask"} and batch["tokens"].shape == (4, SEQ)
        for key in batch:
            assert torch.equal(batch[key], torch.cat([p[key] for p in parts]))
        assert batch["tokens"].tolist() == tokens_of(train_set, 4 * (step + 1))[4 * step:]
    assert whole.state_dict() == halves[0].state_dict() == {"consumed_samples": 20}


def test_resume_continues_with_the_next_sample(train_set):
    uninterrupted = BatchLoader(train_set, micro_batch_size=3, dp_rank=1, dp_size=2)
    expected = [uninterrupted.next_batch() for _ in range(6)]
    first = BatchLoader(train_set, micro_batch_size=3, dp_rank=1, dp_size=2)
    for _ in range(3):
        first.next_batch()
    resumed = BatchLoader(train_set, micro_batch_size=3, dp_rank=1, dp_size=2)
    resumed.load_state_dict(first.state_dict())
    for want in expected[3:]:
        got = resumed.next_batch()
        assert all(torch.equal(got[k], want[k]) for k in want)

    # another data-parallel layout picks up at the same global sample
    regrouped = BatchLoader(train_set, micro_batch_size=4, dp_rank=1, dp_size=2)
    regrouped.load_state_dict(first.state_dict())  # 18 samples consumed
    assert regrouped.next_batch()["tokens"].tolist() == tokens_of(train_set, 26)[22:]


def test_running_out_of_samples_says_so(train_set):
    loader = BatchLoader(train_set, micro_batch_size=len(train_set), dp_rank=0, dp_size=1)
    loader.next_batch()
    with pytest.raises(IndexError, match="train_samples"):
        loader.next_batch()


@pytest.mark.parametrize("missing", [".idx", ".bin"])
def test_missing_file_is_named_with_its_producer(corpora, tmp_path, missing):
    prefix = tmp_path / "c_text_document"
    for suffix in (".bin", ".idx"):
        if suffix != missing:
            (tmp_path / f"c_text_document{suffix}").write_bytes(Path(corpora["a"] + suffix).read_bytes())
    with pytest.raises(FileNotFoundError, match="tokenize") as error:
        build_datasets(DataConfig(paths=[str(prefix)]), seq_length=SEQ, seed=1, train_samples=10, valid_samples=0,
                       eod_id=EOD)
    assert f"{prefix}{missing}" in str(error.value)


def test_dataset_shorter_than_a_sample_is_refused(tmp_path):
    prefix = write_megatron(tmp_path / "tiny", [np.array([5, 6, 7, EOD]), np.array([8, 9, EOD])])
    with pytest.raises(ValueError, match="7 tokens, fewer than one sample"):
        build_datasets(DataConfig(paths=[prefix]), seq_length=SEQ, seed=1, train_samples=10, valid_samples=0,
                       eod_id=EOD)


def test_validation_is_none_when_not_asked_or_not_split_off(corpora, tmp_path):
    for split, valid_samples in (("100,0,0", 8), ("969,30,1", 0)):
        cfg = DataConfig(paths=[corpora["a"]], split=split, cache_dir=str(tmp_path))
        train, valid = build_datasets(cfg, seq_length=SEQ, seed=1, train_samples=10, valid_samples=valid_samples,
                                      eod_id=EOD)
        assert valid is None and len(train) >= 10


@pytest.mark.parametrize("fields, named", [
    ({"paths": []}, "data.paths"),
    ({"paths": ["x/a_text_document.bin"]}, "data.paths"),
    ({"paths": ["a", "b"], "format": "nxd-arrow"}, "data.paths"),
    ({"paths": ["a", "b"], "weights": [1.0]}, "data.weights"),
    ({"paths": ["a", "b"], "weights": [1.0, -2.0]}, "data.weights"),
    ({"paths": ["a"], "split": "0,50,50"}, "data.split"),
    ({"paths": ["a"], "split": "90,10,0,0"}, "data.split"),
    ({"paths": ["a"], "split": "90;10"}, "data.split"),
    ({"paths": ["a"], "split": "1e3,1"}, "data.split"),
    ({"paths": ["a"], "format": "parquet"}, "data.format"),
])
def test_bad_config_names_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        DataConfig(**fields)


# --------------------------------------------------------------------------------- nxd-arrow


@pytest.fixture(scope="module")
def nxd_blocks(tmp_path_factory) -> tuple[str, np.ndarray]:
    """An NxD Arrow dataset as the tokenize stage writes it, and the blocks it must hold."""
    rng = np.random.default_rng(4)
    documents = [rng.integers(0, 5000, rng.integers(3, 90)) for _ in range(300)]
    directory = tmp_path_factory.mktemp("nxd") / "corpus_text"
    writer = NxdArrowWriter(directory, seq_length=32)
    writer.add_documents(np.concatenate(documents), np.array([len(d) for d in documents]))
    blocks = writer.finalize()["blocks"]
    stream = np.concatenate(documents)
    return str(directory), stream[:blocks * 32].reshape(blocks, 32)


def test_nxd_arrow_blocks_round_trip_with_next_token_labels(nxd_blocks):
    directory, blocks = nxd_blocks
    train_rows = int(round(0.8 * len(blocks)))
    cfg = DataConfig(paths=[directory], format="nxd-arrow", split="80,20,0")
    train, valid = build_datasets(cfg, seq_length=32, seed=1, train_samples=train_rows, valid_samples=4, eod_id=EOD)
    assert len(train) == train_rows and len(valid) == len(blocks) - train_rows
    seen = []
    for dataset in (train, valid):
        for i in range(len(dataset)):
            item = dataset[i]
            assert item["tokens"].dtype == item["labels"].dtype == torch.int64
            assert torch.equal(item["labels"][:-1], item["tokens"][1:]) and item["labels"][-1] == EOD
            assert item["loss_mask"].dtype == torch.float32 and item["loss_mask"].tolist() == [1.0] * 31 + [0.0]
            seen.append(item["tokens"].tolist())
    # train holds the first 80% of the blocks and validation the rest, each shuffled
    assert sorted(seen[:train_rows]) == sorted(blocks[:train_rows].tolist())
    assert sorted(seen[train_rows:]) == sorted(blocks[train_rows:].tolist())
    assert seen[:train_rows] != blocks[:train_rows].tolist()
    again, _ = build_datasets(cfg, seq_length=32, seed=1, train_samples=train_rows, valid_samples=0, eod_id=EOD)
    assert tokens_of(again, train_rows) == seen[:train_rows]
    other, _ = build_datasets(cfg, seq_length=32, seed=2, train_samples=train_rows, valid_samples=0, eod_id=EOD)
    assert tokens_of(other, train_rows) != seen[:train_rows]

    # more samples than blocks: whole epochs, each one every block once
    two, _ = build_datasets(cfg, seq_length=32, seed=1, train_samples=train_rows + 1, valid_samples=0, eod_id=EOD)
    assert len(two) == 2 * train_rows
    epochs = tokens_of(two, 2 * train_rows)
    assert sorted(epochs[:train_rows]) == sorted(epochs[train_rows:]) == sorted(blocks[:train_rows].tolist())


def test_nxd_arrow_ignored_labels_are_masked(tmp_path):
    ids = [list(range(10, 18)), list(range(20, 28))]
    labels = [[10, 11, -100, -100, 14, 15, 16, 17], list(range(20, 28))]
    directory = tmp_path / "masked"
    datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 8] * 2, "labels": labels}) \
        .save_to_disk(str(directory))
    cfg = DataConfig(paths=[str(directory)], format="nxd-arrow", split="1")
    train, _ = build_datasets(cfg, seq_length=8, seed=1, train_samples=2, valid_samples=0, eod_id=EOD)
    item = next(train[i] for i in range(2) if train[i]["tokens"][0] == 10)
    assert item["loss_mask"].tolist() == [1, 0, 0, 1, 1, 1, 1, 0]
    assert item["labels"].tolist() == [11, EOD, EOD, 14, 15, 16, 17, EOD]


def test_nxd_arrow_block_size_must_be_the_sequence_length(nxd_blocks, tmp_path):
    cfg = DataConfig(paths=[nxd_blocks[0]], format="nxd-arrow")
    with pytest.raises(ValueError, match="--seq-length 64"):
        build_datasets(cfg, seq_length=64, seed=1, train_samples=4, valid_samples=0, eod_id=EOD)
    with pytest.raises(FileNotFoundError, match="tokenize"):
        build_datasets(DataConfig(paths=[str(tmp_path / "absent")], format="nxd-arrow"), seq_length=32, seed=1,
                       train_samples=4, valid_samples=0, eod_id=EOD)
