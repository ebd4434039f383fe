"""fetch: bring every source of the spec to a content-addressed directory on the shared disk.

Runs on the control plane (it is I/O, not compute). The output key is built from what the
sources are — URIs, ETags, sizes, a Hub repository's commit — and how they are unpacked, so a
second run with unchanged sources lists them, finds a valid MANIFEST.json and downloads nothing.

The spec's other hf:// fields (the tokenizer, the checkpoint to continue from, NxDT's
config.json) each become a content-addressed output of their own (``<root>/hub/hub-<key>/``,
keyed by the commit), and the stages after fetch get a spec naming those directories instead of
the URIs, so no node and no job file ever sees the Hub or the token.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger
from prefect.tasks import exponential_backoff

from pretrain import manifest
from pretrain.hub import (HubAccess, HubError, access_for, fetch_files, link_files, resolve_commit, snapshot,
                         snapshot_files)
from pretrain.hub_dataset import write_jsonl_shards
from pretrain.hub_refs import (HubRef, download_patterns, is_hub_uri, local_value, parse_hub_uri, spec_references,
                               with_local_values)
from pretrain.spec import DataSource, PretrainSpec
from pretrain.transfer import (
    ANONYMOUS, FetchError, HttpReader, LocalReader, RemoteObject, S3Reader, decompress, decompressed_name,
    download,
)
from tasks.artifacts import artifact_key, retryable

FETCH_FORMAT = 1  # bump when the layout of fetch outputs changes
FILE_WORKERS = 4
STATE_DIR = ".fetch-state"


def _s3_client_config() -> dict[str, Any]:
    # Bounded retries with backoff, then a clear error (unreachable endpoints must not hang).
    return {"retries": {"max_attempts": 4, "mode": "standard"}, "connect_timeout": 5,
            "read_timeout": 60}


def reader_for(source: DataSource) -> S3Reader | HttpReader | LocalReader:
    """A reader with the source's credentials: a prefect-aws AwsCredentials block (s3://), a
    Secret block holding a bearer token such as a Hugging Face token (https://), or none."""
    if source.uri.startswith("s3://"):
        if source.credentials:
            from prefect_aws import AwsCredentials

            creds = credentials_block(AwsCredentials, source.credentials, "data.sources[].credentials",
                                      "AwsCredentials(aws_access_key_id=..., aws_secret_access_key=...) of "
                                      "prefect-aws")
            endpoint = source.endpoint_url or creds.aws_client_parameters.endpoint_url
            client = creds.get_boto3_session().client(
                "s3", endpoint_url=endpoint, config=Config(**_s3_client_config()))
            return S3Reader(client, f"credentials block {source.credentials!r}")
        client = boto3.session.Session().client(
            "s3", endpoint_url=source.endpoint_url, region_name="us-east-1",
            config=Config(signature_version=UNSIGNED, **_s3_client_config()))
        return S3Reader(client, ANONYMOUS)
    if source.uri.startswith(("http://", "https://")):
        if source.credentials:
            from prefect.blocks.system import Secret

            return HttpReader(token=credentials_block(Secret, source.credentials, "data.sources[].credentials",
                                                      "Secret(value=<the bearer token>)").get())
        return HttpReader()
    return LocalReader()


def hub_access(spec: PretrainSpec) -> HubAccess:
    """The spec's hub settings with the token of its Secret block (hub.token_block), if any."""
    token = None
    if spec.hub.token_block:
        from prefect.blocks.system import Secret

        token = credentials_block(Secret, spec.hub.token_block, "hub.token_block",
                                  "Secret(value=<a Hugging Face token>)", HubError).get()
    return access_for(spec, token)


def credentials_block(kind: type, name: str, field: str, example: str, error: type[FetchError] = FetchError):
    """The block of type ``kind`` that the spec's ``field`` names, from the Prefect API this process
    talks to (with no PREFECT_API_URL, Prefect's ephemeral one: a temporary server on PREFECT_HOME's
    database, which is where `pretrain demo` saves its block); ``error`` naming the field, that API
    and the fix when it holds no such block. ``example``: the block as Python saves it."""
    try:
        return kind.load(name)
    except ValueError:
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        where = (f"the Prefect API at {settings.api.url}" if settings.api.url else
                 f"the ephemeral Prefect API of PREFECT_HOME={settings.home} (PREFECT_API_URL is not set)")
        raise error(f"{field}={name!r}: no {kind.__name__} block of that name in {where}; create it there "
                    f"({example}.save({name!r}), or in the UI under Blocks), or set PREFECT_API_URL to the "
                    "server that holds it") from None


@dataclass(frozen=True)
class HubSource:
    """An hf:// source at the commit its revision points at now: the commit stands for its files."""

    ref: HubRef
    commit: str
    access: HubAccess


def list_sources(spec: PretrainSpec) -> list[tuple[DataSource, Any, list[RemoteObject]]]:
    """Each source of the spec, its reader, and its objects as the store lists them now (an
    hf:// source: its commit, and no objects)."""
    access = hub_access(spec) if any(is_hub_uri(s.uri) for s in spec.data.sources) else None
    listing = []
    for source in spec.data.sources:
        if is_hub_uri(source.uri):
            ref = parse_hub_uri(source.uri, "data.sources[].uri")
            listing.append((source, HubSource(ref, resolve_commit(ref, access), access), []))
            continue
        reader = reader_for(source)
        listing.append((source, reader, reader.list(source.uri)))
    return listing


def fetch_key_inputs(listing: list[tuple[DataSource, Any, list[RemoteObject]]]) -> dict[str, Any]:
    """What the fetched files are a function of: each source's objects as the store lists them,
    or a Hub source's commit and how it is read."""
    sources = []
    for src, reader, objects in listing:
        entry = {"uri": src.uri, "decompress": src.decompress, "sha256": src.sha256,
                 "objects": [(o.uri, o.name, o.size, o.etag) for o in objects]}
        if isinstance(reader, HubSource):
            # the commit stands for the revision: @main and the commit main points at are one key
            entry |= {"uri": replace(reader.ref, revision=reader.commit).uri, "commit": reader.commit,
                      "dataset": src.dataset.model_dump() if src.dataset else None}
        sources.append(entry)
    return {"format": FETCH_FORMAT, "sources": sources}


def _output_name(source: DataSource, obj: RemoteObject) -> str:
    return (decompressed_name(obj.name) if source.decompress else None) or obj.name


def _fetch_one(reader, source: DataSource, obj: RemoteObject, staging: Path) -> dict[str, Any]:
    """Download (and unpack) one object into ``staging``, unless an earlier attempt finished it."""
    record_path = staging / STATE_DIR / f"{obj.name}.json"
    output = staging / _output_name(source, obj)
    if record_path.exists() and output.exists():
        return {**json.loads(record_path.read_text()), "bytes_transferred": 0, "resumed": True}
    result = download(reader, obj, staging / obj.name, expected_sha256=source.sha256)
    if output.name != obj.name:
        decompress(staging / obj.name)
    record = {"file": output.name, "source": obj.uri, "etag": obj.etag, "bytes": obj.size,
              "output_bytes": output.stat().st_size, "seconds": round(result.seconds, 3)}
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record))
    return {**record, "bytes_transferred": result.bytes_transferred, "resumed": False}


def _claim(names: dict[str, str], name: str, uri: str) -> None:
    """Refuse two sources that would write the same file."""
    if names.setdefault(name, uri) != uri:
        raise FetchError(f"{uri} and {names[name]} would both be written as {name!r}; "
                         "fetch them in separate pipelines or rename one")


def _fetch_hub(source: DataSource, hub: HubSource, staging: Path, names: dict[str, str]) -> list[dict[str, Any]]:
    """An hf:// source's files into ``staging``, linked from huggingface_hub's cache; with
    ``dataset:``, its split read with ``datasets`` and written as JSONL shards instead."""
    started = time.monotonic()
    folder = snapshot(hub.ref, hub.commit, hub.ref.patterns, hub.access)
    pinned = replace(hub.ref, revision=hub.commit, patterns=()).uri
    described = None
    if source.dataset is not None:
        written = write_jsonl_shards(hub.ref, folder, source.dataset.config, source.dataset.split, staging)
        files = written["files"]
        for name in files:
            _claim(names, name, hub.ref.uri)
        sources = {name: pinned for name in files}
        described = {k: written[k] for k in ("rows", "columns", "fingerprint")}
    else:
        files = snapshot_files(folder)
        for name in files:
            _claim(names, name, hub.ref.uri)
        link_files(folder, staging, files)
        sources = {name: f"{pinned}/{name}" for name in files}
        if source.decompress:
            files = [decompress(staging / name).relative_to(staging).as_posix() if decompressed_name(name)
                     else name for name in files]
            sources = dict(zip(files, sources.values()))
    seconds = round(time.monotonic() - started, 3)
    # huggingface_hub's cache may have held some files already: bytes moved are not counted
    return [{"file": name, "source": uri, "etag": hub.commit, "bytes": (staging / name).stat().st_size,
             "output_bytes": (staging / name).stat().st_size, "seconds": seconds, "bytes_transferred": None,
             "resumed": False, **({"dataset": described} if described else {})} for name, uri in sources.items()]


@task(name="fetch", retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=5),
      retry_condition_fn=retryable)
def fetch(spec: PretrainSpec, reuse_only: bool = False) -> str:
    """Fetch ``spec.data.sources``; return the output directory. ``reuse_only``: return an
    existing complete output, never download (the stage was left out of the run)."""
    logger = get_run_logger()
    listing = list_sources(spec)
    key_inputs = fetch_key_inputs(listing)

    names: dict[str, str] = {}
    for source, _, objects in listing:
        for obj in objects:
            _claim(names, _output_name(source, obj), obj.uri)

    records: list[dict[str, Any]] = []

    def build(staging: Path) -> dict[str, Any]:
        started = time.monotonic()
        records.extend(record for source, reader, _ in listing if isinstance(reader, HubSource)
                       for record in _fetch_hub(source, reader, staging, names))
        jobs = [(reader, source, obj) for source, reader, objects in listing for obj in objects]
        if jobs:
            with ThreadPoolExecutor(min(FILE_WORKERS, len(jobs))) as pool:
                records.extend(pool.map(lambda job: _fetch_one(*job, staging), jobs))
            shutil.rmtree(staging / STATE_DIR)
        for record in records:
            logger.info("fetched %s: %d bytes in %.2f s", record["source"], record["bytes"], record["seconds"])
        return {"sources": [{"uri": r["source"], "etag": r["etag"], "bytes": r["bytes"], "file": r["file"]}
                            for r in records],
                "bytes": sum(r["bytes"] for r in records), "seconds": round(time.monotonic() - started, 3),
                # what datasets read, by source: its rows, columns and fingerprint. The commit keys
                # the output, not the fingerprint: that is known only once the split is read, and it
                # hashes the builder's directory name, in which local files count by their
                # modification times, not their bytes (``_get_dataset_fingerprint`` in
                # huggingface/datasets builder.py, ``_get_single_origin_metadata`` in data_files.py).
                "datasets": {r["source"]: r["dataset"] for r in records if "dataset" in r}}

    output = manifest.cached_output(spec.paths.root, "fetch", key_inputs, build, reuse_only)
    if output.cached:
        logger.info("fetch: %d files already in %s (manifest valid); nothing downloaded",
                    len(output.manifest["files"]), output.directory)
        rows = [{"file": f, "bytes": m["bytes"], "MB/s": None, "transferred": 0, "cached": True}
                for f, m in output.manifest["files"].items()]
    else:
        rows = [{"file": r["file"], "bytes": r["bytes"],
                 "MB/s": round(r["bytes"] / 1e6 / r["seconds"], 1) if r["seconds"] else None,
                 "transferred": r["bytes_transferred"], "cached": False} for r in records]
    _publish(spec, rows, output.directory, cached=output.cached)
    return str(output.directory)


def _publish(spec: PretrainSpec, rows: list[dict[str, Any]], final: Path, cached: bool) -> None:
    total = sum(r["bytes"] for r in rows)
    create_table_artifact(
        rows, key=artifact_key(spec.name, "fetch"),
        description=f"{len(rows)} files, {total / 1e6:.1f} MB in {final}"
        + (" (cached: nothing downloaded)" if cached else ""),
    )


@task(name="fetch-hub-files", retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=5),
      retry_condition_fn=retryable)
def fetch_hub_files(spec: PretrainSpec, reuse_only: bool = False) -> PretrainSpec:
    """Download each hf:// field's files (only those the field needs); return the spec with the
    fields pointing at them. ``reuse_only``: never download (fetch was left out of the run)."""
    logger = get_run_logger()
    access = hub_access(spec)
    values, rows = {}, []
    for field, ref in spec_references(spec).items():
        patterns = download_patterns(field, ref)
        directory, done, cached = fetch_files(ref, patterns, access, spec.paths.root, reuse_only)
        values[field] = local_value(field, ref, str(directory))
        logger.info("%s: %s at commit %s -> %s%s", field, ref.uri, done["commit"], values[field],
                    " (cached)" if cached else "")
        rows.append({"field": field, "uri": ref.uri, "commit": done["commit"], "files": len(done["files"]),
                     "bytes": sum(f["bytes"] for f in done["files"].values()), "cached": cached,
                     "path": values[field]})
    create_table_artifact(rows, key=artifact_key(spec.name, "hub"),
                          description="Hugging Face Hub files of the spec, by commit")
    return with_local_values(spec, values)
