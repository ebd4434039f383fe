"""A dataset repository, as the runbooks read it with ``datasets.load_dataset(name, config)``,
written as JSONL shards for the tokenize stage.

``datasets`` reads the snapshot huggingface_hub brought to the cache (pretrain/hub.py), never the
Hub itself: one download path, one token, one set of error messages, and the commit that keys the
output is the commit that was read.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pretrain.hub import HubError
from pretrain.hub_refs import HubRef

if TYPE_CHECKING:
    import datasets

SHARD_BYTES = 256 << 20  # Arrow bytes per JSONL shard: the tokenize stage's own shard size


def _load(ref: HubRef, folder: Path, config: str | None, split: str, cache_dir: str) -> datasets.Dataset:
    # imported here: seconds of pandas and pyarrow that every CLI call and flow start would pay
    import datasets

    try:
        return datasets.load_dataset(str(folder), name=config, split=split, cache_dir=cache_dir)
    except ValueError as exc:
        # datasets names what it has in its message: unknown configs list the available ones,
        # unknown splits the existing splits
        raise HubError(f"{ref.uri}: datasets cannot read config={config!r} split={split!r}: {exc}; fix "
                       "data.sources[].dataset") from None
    except (FileNotFoundError, datasets.exceptions.DataFilesNotFoundError) as exc:
        scripts = [p.name for p in folder.glob("*.py")]
        if scripts:
            raise HubError(f"{ref.uri}: the repository holds a loading script ({', '.join(scripts)}), which "
                           "datasets 4 and later no longer run; read its Parquet conversion instead: "
                           f"hf://datasets/{ref.repo_id}@refs%2Fconvert%2Fparquet") from None
        raise HubError(f"{ref.uri}: datasets finds no data files in it ({exc}); check the URI's file "
                       "patterns") from None


def write_jsonl_shards(ref: HubRef, folder: Path, config: str | None, split: str, dest: Path) -> dict[str, Any]:
    """Load ``config``/``split`` from the snapshot ``folder`` and write it to ``dest`` as
    ``NAME[-CONFIG]-SPLIT-0000i-of-0000n.jsonl``; return what the manifest records (rows,
    files, columns, the dataset's own fingerprint)."""
    # datasets' Arrow cache beside the output, on the shared filesystem (not a small /tmp), and
    # outside it, so that one a killed attempt leaves is never described as part of the output
    with tempfile.TemporaryDirectory(prefix=".datasets-cache-", dir=dest.parent) as cache_dir:
        dataset = _load(ref, folder, config, split, cache_dir)
        shards = max(1, math.ceil(dataset.data.nbytes / SHARD_BYTES))
        stem = "-".join(p for p in (ref.repo_id.split("/")[-1], config, split) if p)
        files = []
        for i in range(shards):
            name = f"{stem}-{i:05d}-of-{shards:05d}.jsonl"
            tmp = dest / f".{name}.tmp"
            dataset.shard(shards, i, contiguous=True).to_json(tmp, lines=True, force_ascii=False)
            tmp.rename(dest / name)
            files.append(name)
        return {"rows": dataset.num_rows, "files": files, "columns": dataset.column_names,
                "fingerprint": dataset._fingerprint}
