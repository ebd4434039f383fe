"""tokenize: the fetched JSONL to Megatron indexed datasets, as a Slurm job array over byte-range
shards followed by a merge job; for NxDT's Llama configs (backend neuron, family llama), to the
HF Arrow blocks NxD's get_dataset.py writes, in one job (its grouping is not shardable). Sources
that already are a tokenized dataset (a saved HF Arrow dataset, or one Megatron .bin/.idx pair,
as both Trainium runbooks download them) are handed on untouched.

The output key is built from the fetched input's manifest key, the tokenizer files' sha256,
the spec fields that change the bytes and the writer's format version (``trainer/formats.py``).
Each finished shard leaves its JSON record in the staging directory, so a retry resubmits only
the shards that failed.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Hashable

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.logging import get_run_logger

from pretrain import manifest
from pretrain.log_parsers import preprocess_progress
from jobs.node import Command
from tasks.executor import cluster_for, job_folder, run_array, run_job
from jobs.contract import JobFailed, ends_cancelled, stage_request
from pretrain.spec import PretrainSpec
from render.dataset_files import arrow_output, tokenizer_files
from render.tokenize_command import merge_command, tokenize_command
from tasks.artifacts import artifact_key, retryable
from trainer import formats

SHARD_BYTES = 256 << 20  # input per array task when the spec does not fix the shard count
MAX_SHARDS = 64
DATA_PREFIX = "data"
PROGRESS_EVERY_S = 30.0


class TokenizeFailed(RuntimeError):
    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable  # whether a retry of the failed shards can end otherwise


class ShardProgress:
    """The shards' progress lines ("Processed N documents (x docs/s, y MB/s).") summed into one
    log line every ``every_s``: how far the whole stage is, which no shard's own line says."""

    def __init__(self, shards: int, every_s: float = PROGRESS_EVERY_S, clock=time.monotonic):
        self.shards, self.every_s, self.clock = shards, every_s, clock
        self.latest: dict[Hashable, dict[str, float]] = {}
        self.logged_at = clock()

    def __call__(self, shard: Hashable, line: str) -> None:
        """``shard``: where the line came from (a Slurm job's index, a pod's name)."""
        if (progress := preprocess_progress(line)) is None:
            return
        self.latest[shard] = progress
        if self.clock() - self.logged_at >= self.every_s:
            self.logged_at = self.clock()
            get_run_logger().info("%s", self.summary())

    def summary(self) -> str:
        reports = self.latest.values()
        return (f"tokenize: {sum(p['documents'] for p in reports)} documents so far from {len(reports)} of "
                f"{self.shards} shards ({sum(p['docs_per_s'] for p in reports):.0f} docs/s, "
                f"{sum(p['mib_per_s'] for p in reports):.1f} MiB/s of JSON)")


def _fingerprint(path: Path) -> str:
    parts = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return manifest.stable_hash([(p.name, manifest.file_sha256(p)) for p in parts])


def jsonl_inputs(data_dir: Path) -> list[Path]:
    files = sorted(p for p in data_dir.rglob("*") if p.is_file() and ".jsonl" in p.name)
    if not files:
        raise TokenizeFailed(f"{data_dir}: no JSONL files to tokenize")
    return files


def pretokenized(data_dir: Path) -> str | None:
    """The fetched dataset when it is tokenized already: a directory ``save_to_disk`` wrote (NxD's
    get_dataset.py output, what the Llama NxDT configs read), or the prefix of the one Megatron
    .bin/.idx pair beside no JSONL; None when there is text to tokenize."""
    if (data_dir / "state.json").exists() and (data_dir / "dataset_info.json").exists():
        return str(data_dir)
    if any(".jsonl" in p.name for p in data_dir.rglob("*")):
        return None
    pairs = sorted(p.with_suffix("") for p in data_dir.rglob("*.idx") if p.with_suffix(".bin").exists())
    if len(pairs) > 1:
        raise TokenizeFailed(f"{data_dir}: {len(pairs)} Megatron datasets ({', '.join(p.name for p in pairs)}); "
                             "the pipeline trains on one: give one .bin/.idx pair per spec")
    return str(pairs[0]) if pairs else None


def shard_count(spec: PretrainSpec, input_bytes: int) -> int:
    return spec.data.tokenize_shards or max(1, min(MAX_SHARDS, math.ceil(input_bytes / SHARD_BYTES)))


def tokenize_key_inputs(spec: PretrainSpec, data: Path) -> dict[str, Any]:
    """What the tokens are a function of: the fetched files, the tokenizer's content, the spec
    fields that change the bytes, and the writer's format version."""
    fetched = json.loads((data / manifest.MANIFEST).read_text())
    t = spec.tokenizer
    inputs = {"format": formats.TOKENIZE, "input": fetched["key"],
              "files": [p.relative_to(data).as_posix() for p in jsonl_inputs(data)],
              "tokenizer": {flag: _fingerprint(p) for flag, p in tokenizer_files(spec, data).items()},
              "tokenizer.type": t.type, "tokenizer.append_eod": t.append_eod, "data.json_keys": spec.data.json_keys}
    if arrow_output(spec):  # NxD's Arrow blocks are cut to the sequence length
        inputs |= {"output": "nxd-arrow", "model.seq_length": spec.model.seq_length}
    return inputs


@task(name="tokenize", retries=2, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def tokenize(spec: PretrainSpec, data_dir: str, reuse_only: bool = False) -> str:
    """Tokenize the fetched corpus; return the dataset: a Megatron prefix (``.../data_text_document``)
    or, for NxDT's Llama configs, an Arrow directory (``.../data_text``).
    ``reuse_only``: return an existing complete dataset, never submit (the stage was left out)."""
    logger = get_run_logger()
    data = Path(data_dir)
    if (dataset := pretokenized(data)) is not None:
        if spec.tokenizer.type == "gpt2-bpe":
            # Training reads the vocab and merges beside the dataset, where the runbooks put them.
            tokenizer_files(spec, Path(dataset).parent)
        logger.info("tokenize: the fetched data is a tokenized dataset already; handing on %s", dataset)
        create_markdown_artifact(f"**Dataset** (fetched, tokenized already): `{dataset}`",
                                 key=artifact_key(spec.name, "dataset"), description="tokenized dataset")
        return dataset
    inputs = jsonl_inputs(data)
    tok_files = tokenizer_files(spec, data)
    arrow = arrow_output(spec)
    key_inputs = tokenize_key_inputs(spec, data)

    def build(staging: Path) -> dict[str, Any]:
        input_bytes = sum(p.stat().st_size for p in inputs)
        shards = 1 if arrow else shard_count(spec, input_bytes)
        cluster = cluster_for(spec)
        folder = job_folder(spec, cluster)
        parts = staging / "parts"
        parts.mkdir(exist_ok=True)
        tokenizer = {flag: str(path) for flag, path in tok_files.items()}
        todo = [i for i in range(shards) if not (parts / f"shard-{i}.json").exists()]
        logger.info("tokenize: %.1f MB in %d files as %d shards (%d to run)", input_bytes / 1e6,
                    len(inputs), shards, len(todo))
        requests = [stage_request(spec, f"tokenize-{i}-of-{shards}", Command(tokenize_command(
            spec, [str(p) for p in inputs], str(staging / DATA_PREFIX if arrow else parts / f"shard-{i}"),
            tokenizer, shard=f"{i}/{shards}", record=str(parts / f"shard-{i}.json"), python=sys.executable)),
            nodes=1, gpus_per_node=None, exclusive=False) for i in todo]
        if requests:
            outcomes = run_array(requests, cluster, folder, on_line=ShardProgress(len(requests)))
            failed = [o for o in outcomes if isinstance(o, JobFailed)]
            if failed:
                raise TokenizeFailed(f"{len(failed)} of {len(requests)} tokenize shards failed; the others "
                                     "are kept and a retry reruns only these:\n\n" + "\n\n".join(map(str, failed)),
                                     retryable=any(f.retryable for f in failed))
        records = [json.loads((parts / f"shard-{i}.json").read_text()) for i in range(shards)]
        if not arrow:
            run_job(stage_request(spec, "tokenize-merge", Command(merge_command(
                spec, str(staging / DATA_PREFIX), [str(parts / f"shard-{i}") for i in range(shards)],
                python=sys.executable)), nodes=1, cpus_per_task=None, gpus_per_node=None, exclusive=False), cluster,
                folder)
        shutil.rmtree(parts)
        if spec.tokenizer.type == "gpt2-bpe":
            # The launches name the tokenizer beside the dataset (render/dataset_files.py).
            for path in tok_files.values():
                shutil.copyfile(path, staging / path.name)
        return {"input_bytes": input_bytes, "dtype": records[0]["dtype"],
                "documents": sum(r["documents"] for r in records), "skipped": sum(r["skipped"] for r in records),
                "tokens": {k: sum(r["tokens"][k] for r in records) for k in spec.data.json_keys},
                "shards": [{k: r[k] for k in ("shard", "documents", "tokens", "skipped", "input_bytes", "seconds",
                                              "mb_per_s", "skipped_records", "finished_at")} for r in records]}

    output = manifest.cached_output(spec.paths.root, "tokenize", key_inputs, build, reuse_only)
    if output.cached:
        logger.info("tokenize: %s is complete (manifest valid); nothing submitted", output.directory)
    prefixes = [f"{output.directory / DATA_PREFIX}_{k}" if arrow else f"{output.directory / DATA_PREFIX}_{k}_document"
                for k in spec.data.json_keys]
    _publish(spec, output.manifest, prefixes, cached=output.cached)
    return prefixes[0]


def _publish(spec: PretrainSpec, done: dict[str, Any], prefixes: list[str], cached: bool) -> None:
    rows = [{"shard": s["shard"], "documents": s["documents"], "tokens": sum(s["tokens"].values()),
             "input MB": round(s["input_bytes"] / 1e6, 2),
             "MB/s": s["mb_per_s"], "seconds": s["seconds"], "skipped": s["skipped"]} for s in done["shards"]]
    create_table_artifact(rows, key=artifact_key(spec.name, "tokenize"), description=(
        f"{done['documents']} documents, {sum(done['tokens'].values())} tokens ({done['dtype']}), "
        f"{done['input_bytes'] / 1e6:.1f} MB in, {done['skipped']} records skipped"
        + (" (cached: nothing submitted)" if cached else "")))
    skipped = [r for s in done["shards"] for r in s["skipped_records"]]
    lines = [f"**Dataset** (`--data-path`): `{prefixes[0]}`"]
    if skipped:
        lines += [f"**Skipped records** ({done['skipped']}, first {len(skipped)}):", *(f"- `{r}`" for r in skipped)]
    create_markdown_artifact("\n\n".join(lines), key=artifact_key(spec.name, "dataset"),
                             description="tokenized dataset")
