"""Training data: the tokenize stage's outputs as fixed-length samples, and an exactly
resumable micro-batch order.

Every item is ``{"tokens", "labels", "loss_mask"}``, each of length ``seq_length``:
``labels[i]`` is the token that follows ``tokens[i]``; ``loss_mask`` (float32) is 0 where
``labels`` holds no real target.

- ``megatron``: ``PREFIX.bin/.idx`` read through megatron-core's ``GPTDataset`` and
  ``BlendedMegatronDatasetBuilder``, so the documents, their shuffle and the blend are the ones
  Megatron-LM trains on for the same prefixes, split and seed. A sample is ``seq_length + 1``
  consecutive tokens of the shuffled document stream; tokens are its first ``seq_length``,
  labels its last ``seq_length``.
- ``nxd-arrow``: the rows NxD's ``get_dataset.py`` saves (``trainer/nxd_arrow.py``): blocks of
  exactly ``seq_length`` tokens, ``labels`` a copy of ``input_ids``. NxDT's HF Llama computes
  the loss of ``logits[:, :-1]`` against ``labels[:, 1:]``, so a block trains ``seq_length - 1``
  predictions. The same happens here: tokens are the block, labels are ``labels`` shifted left
  by one, and the last position, whose target lies outside the block, has loss_mask 0 (as do
  positions whose label is -100, Hugging Face's ignore index). The loss per block is then
  NxDT's, and the block size stays equal to the sequence length, as NxDT requires.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainer.indexed_dataset import IndexReader
from trainer.train.config import DataConfig, split_weights

HF_IGNORE_INDEX = -100


def build_datasets(cfg: DataConfig, *, seq_length: int, seed: int, train_samples: int, valid_samples: int,
                   eod_id: int) -> tuple[Dataset, Dataset | None]:
    """Train and validation datasets of at least ``train_samples`` / ``valid_samples`` items
    (whole epochs, as Megatron builds them). Validation is None when ``valid_samples`` is 0 or
    the split leaves no validation data.

    With torch.distributed initialised this is collective: every rank must call it. Rank 0
    builds Megatron's index cache while the others wait on a barrier, then they read it; the
    cache directory must be one they all see.
    """
    if seq_length < 1 or train_samples < 1 or valid_samples < 0:
        raise ValueError(f"seq_length={seq_length}, train_samples={train_samples}, valid_samples={valid_samples}: "
                         f"seq_length and train_samples must be positive, valid_samples not negative")
    build = _build_megatron if cfg.format == "megatron" else _build_nxd_arrow
    return build(cfg, seq_length=seq_length, seed=seed, train_samples=train_samples,
                 valid_samples=valid_samples, eod_id=eod_id)


class BatchLoader:
    """Deterministic micro-batches with an exact position: Megatron's pretraining sampler
    order. Each micro-step takes the next ``micro_batch_size * dp_size`` consecutive samples of
    the dataset; data-parallel rank r takes its contiguous slice of ``micro_batch_size``.
    ``consumed_samples`` counts samples taken by all ranks, so resuming from ``state_dict()``
    continues with exactly the next sample, whatever the gradient-accumulation grouping."""

    def __init__(self, dataset: Dataset, *, micro_batch_size: int, dp_rank: int, dp_size: int,
                 consumed_samples: int = 0):
        if micro_batch_size < 1 or dp_size < 1 or not 0 <= dp_rank < dp_size or consumed_samples < 0:
            raise ValueError(f"micro_batch_size={micro_batch_size}, dp_rank={dp_rank}, dp_size={dp_size}, "
                             f"consumed_samples={consumed_samples}: need micro_batch_size >= 1, "
                             f"0 <= dp_rank < dp_size, consumed_samples >= 0")
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.consumed_samples = consumed_samples

    def next_batch(self) -> dict[str, torch.Tensor]:
        step_samples = self.micro_batch_size * self.dp_size
        end = self.consumed_samples + step_samples
        if end > len(self.dataset):
            raise IndexError(f"the dataset holds {len(self.dataset)} samples and {self.consumed_samples} are "
                             f"consumed; the next micro-step needs {step_samples} more: build the datasets with "
                             f"more train_samples/valid_samples")
        first = self.consumed_samples + self.dp_rank * self.micro_batch_size
        items = [self.dataset[i] for i in range(first, first + self.micro_batch_size)]
        self.consumed_samples = end
        return {key: torch.stack([item[key] for item in items]) for key in items[0]}

    def state_dict(self) -> dict:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict) -> None:
        consumed = int(state["consumed_samples"])
        if consumed < 0:
            raise ValueError(f"consumed_samples={consumed} in the loaded state is negative")
        self.consumed_samples = consumed


# ---------------------------------------------------------------------------------- megatron


class EodTokenizer:
    """The members of a Megatron tokenizer that GPTDataset reads, for data tokenized already."""

    vocab_size = None  # None: the token dtype is read from each .idx
    pad = -1  # Megatron's "no pad token": a value no .bin holds, so no real label is masked

    def __init__(self, eod: int):
        self.eod = eod
        # json-dumped into the index cache key
        self.unique_identifiers = {"class": "pretrain-pipeline.eod-only", "eod": eod}


class _TrainingItems(Dataset):
    """GPTDataset/BlendedDataset items reduced to the three the trainer uses."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.dataset[index]
        return {"tokens": item["tokens"], "labels": item["labels"], "loss_mask": item["loss_mask"]}


def _sequence_lengths(prefix: str) -> np.ndarray:
    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    for path in (idx_path, bin_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: a Megatron dataset is the pair PREFIX.bin + PREFIX.idx "
                                    f"that the tokenize stage (python -m trainer tokenize) writes; data.paths "
                                    f"takes PREFIX, e.g. .../corpus_text_document")
    index = IndexReader(idx_path)
    needed = int(index.lengths.sum(dtype=np.int64)) * index.dtype.itemsize
    if bin_path.stat().st_size < needed:
        raise ValueError(f"{bin_path} holds {bin_path.stat().st_size} bytes but {idx_path} describes {needed}: "
                         f"the pair is truncated or from different runs; run the tokenize stage again")
    return np.asarray(index.lengths)


def _split_tokens(lengths: np.ndarray, bookends: tuple[float, float] | None) -> int:
    if bookends is None:
        return 0
    # the document range BlendedMegatronDatasetBuilder._build_megatron_dataset_splits takes
    begin, end = (int(round(b * float(len(lengths)))) for b in bookends)
    return int(lengths[begin:end].sum(dtype=np.int64))


def _megatron_data_layer() -> None:
    """Makes megatron-core's data layer importable without the package's ``__init__``.

    Importing any ``megatron.core`` module first runs that ``__init__``, which imports its model,
    DDP, FSDP and optimizer code: with their ``torch.compile`` decorators, torch's inductor too.
    That was 6 of a rank's start-up CPU-seconds here (docs/benchmarks.md), and four of those
    modules warn that Transformer Engine and Apex are not installed, about code this trainer
    never runs. The trainer uses the data layer only, so the package is registered as found, its
    ``__init__`` not run, and its submodules import on their own. ``parallel_state`` goes first:
    it and ``megatron.core.utils`` import each other, and the ``__init__`` imports them in that
    order."""
    if "megatron.core" in sys.modules:
        return  # imported whole, or by an earlier call
    found = importlib.util.find_spec("megatron.core")
    package = importlib.util.module_from_spec(found)
    sys.modules["megatron.core"] = package
    sys.modules["megatron"].core = package
    importlib.import_module("megatron.core.parallel_state")


def _megatron_builder():
    _megatron_data_layer()
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

    class Builder(BlendedMegatronDatasetBuilder):
        @staticmethod
        def build_generic_dataset(cls, is_built_on_rank, synchronize_ranks, *args):
            # megatron-core 0.16.1's BlendedDataset calls torch.distributed.get_rank() when it
            # misses its cache, which raises without a process group. A lone process shares the
            # blend index with no one, and it is one quick C++ pass, so it stays in memory there.
            if cls is BlendedDataset and not torch.distributed.is_initialized():
                *head, config = args
                config = copy.copy(config)
                config.path_to_cache = None
                args = (*head, config)
            return BlendedMegatronDatasetBuilder.build_generic_dataset(cls, is_built_on_rank, synchronize_ranks, *args)

    return Builder


def _build_megatron(cfg: DataConfig, *, seq_length: int, seed: int, train_samples: int, valid_samples: int,
                    eod_id: int) -> tuple[Dataset, Dataset | None]:
    # megatron-core ships helpers_cpp prebuilt in its wheel; compile_helpers() would run make in
    # site-packages, find no Makefile and sys.exit(1), so it is never called here.
    _megatron_data_layer()
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    weights = None if cfg.weights is None else [float(w) for w in cfg.weights]
    if len(cfg.paths) > 1 and weights is None:
        weights = [1.0] * len(cfg.paths)  # Megatron's None would blend by dataset size
    elif len(cfg.paths) == 1:
        weights = None  # one dataset: a plain GPTDataset, no blend index
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=(cfg.paths, weights), split=cfg.split,
        tokenizer=EodTokenizer(eod_id), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False, path_to_cache=cfg.cache_dir)
    train_range, valid_range, _ = config.split_matrix

    # Checked on every rank before the builder's barriers, so a bad input fails everywhere
    # instead of on rank 0 alone while the others wait.
    sample_tokens = seq_length + 1
    has_valid = []
    for prefix in cfg.paths:
        lengths = _sequence_lengths(prefix)
        total = int(lengths.sum(dtype=np.int64))
        if total < sample_tokens:
            raise ValueError(f"{prefix} holds {total} tokens, fewer than one sample of seq_length + 1 = "
                             f"{sample_tokens}: use more data or a shorter sequence")
        train_tokens = _split_tokens(lengths, train_range)
        if train_tokens < sample_tokens:
            raise ValueError(f"the train part of {prefix} (split {cfg.split!r}, {len(lengths)} documents) holds "
                             f"{train_tokens} tokens, fewer than one sample of {sample_tokens}: raise the train "
                             f"weight of data.split or use more data")
        has_valid.append(_split_tokens(lengths, valid_range) >= sample_tokens)
    wants_valid = valid_samples > 0 and any(has_valid)
    if wants_valid and not all(has_valid):
        short = [p for p, ok in zip(cfg.paths, has_valid) if not ok]
        raise ValueError(f"the validation part of {', '.join(short)} (split {cfg.split!r}) holds less than one "
                         f"sample of {sample_tokens} tokens while other datasets have one: raise the validation "
                         f"weight of data.split, or evaluate less (valid_samples=0)")

    # A range the builder is handed must hold documents: megatron-core 0.16.1 loops forever
    # counting epochs over an empty one (the test part of "969,30,1" under 500 documents). The
    # test part is never read, and validation only when wanted; the train range is unchanged.
    config.split_matrix = [train_range, valid_range if wants_valid else None, None]
    sizes = [train_samples, valid_samples if wants_valid else 0, 0]
    train, valid, _ = _megatron_builder()(GPTDataset, sizes, lambda: True, config).build()
    return _TrainingItems(train), (_TrainingItems(valid) if valid is not None else None)


# --------------------------------------------------------------------------------- nxd-arrow


class _ArrowBlocks(Dataset):
    """Rows of an NxD Arrow dataset in a fixed order, as trainer items (see the module docstring)."""

    def __init__(self, table, order: np.ndarray, seq_length: int, eod_id: int):
        self.table = table
        self.order = order
        self.seq_length = seq_length
        self.eod_id = eod_id

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.table[int(self.order[index])]
        targets = np.asarray(row["labels"][1:], dtype=np.int64)
        loss_mask = np.zeros(self.seq_length, np.float32)
        loss_mask[:-1] = targets != HF_IGNORE_INDEX
        labels = np.full(self.seq_length, self.eod_id, np.int64)  # a real id where the mask is 0
        labels[:-1] = np.where(targets == HF_IGNORE_INDEX, self.eod_id, targets)
        return {"tokens": torch.from_numpy(np.asarray(row["input_ids"], dtype=np.int64)),
                "labels": torch.from_numpy(labels), "loss_mask": torch.from_numpy(loss_mask)}


def _epochs_order(rows: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """Whole epochs covering ``samples``, each a fresh permutation: Megatron's shuffle discipline."""
    rng = np.random.RandomState(seed)
    return np.concatenate([rng.permutation(rows) for _ in range(-(-samples // len(rows)))])


def _build_nxd_arrow(cfg: DataConfig, *, seq_length: int, seed: int, train_samples: int, valid_samples: int,
                     eod_id: int) -> tuple[Dataset, Dataset | None]:
    import datasets

    directory = Path(cfg.paths[0])
    if not (directory / "state.json").is_file():
        raise FileNotFoundError(f"{directory} is not a saved Arrow dataset (no state.json): NxD Arrow datasets are "
                                f"written by the tokenize stage (python -m trainer tokenize --format nxd-arrow)")
    table = datasets.load_from_disk(str(directory))
    if not isinstance(table, datasets.Dataset) or not {"input_ids", "labels"} <= set(table.column_names):
        raise ValueError(f"{directory}: expected one dataset with input_ids and labels columns, as NxD's "
                         f"get_dataset.py saves it")
    if table.num_rows == 0:
        raise ValueError(f"{directory} holds no blocks: the corpus had fewer than seq_length tokens per "
                         f"1,000 documents")
    table = table.with_format("numpy", columns=["input_ids", "labels"])
    block = len(table[0]["input_ids"])
    if block != seq_length:
        raise ValueError(f"{directory} holds blocks of {block} tokens but seq_length is {seq_length}: NxD's block "
                         f"size must equal the sequence length; tokenize again with --seq-length {seq_length}")

    train_weight, valid_weight, _ = split_weights(cfg.split)
    bounds = [int(round(b * table.num_rows)) for b in (0.0, train_weight, train_weight + valid_weight)]
    train_rows, valid_rows = np.arange(bounds[0], bounds[1]), np.arange(bounds[1], bounds[2])
    if len(train_rows) == 0:
        raise ValueError(f"the train part of {directory} (split {cfg.split!r}, {table.num_rows} blocks) is empty: "
                         f"raise the train weight of data.split or use more data")
    train = _ArrowBlocks(table, _epochs_order(train_rows, train_samples, seed), seq_length, eod_id)
    if valid_samples == 0 or len(valid_rows) == 0:
        return train, None
    return train, _ArrowBlocks(table, _epochs_order(valid_rows, valid_samples, seed), seq_length, eod_id)
