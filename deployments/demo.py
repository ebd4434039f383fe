"""`make demo`: the pretrain flow on the tiny-local preset, with everything it needs set up here.

The corpus is built from text on this machine and served by the local S3 server; the flow
runs on the ephemeral Prefect API, on the local Slurm cluster when Slurm is installed here,
else with submitit's local executor.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import boto3
import zstandard

from deployments import stack
from pretrain.corpus import corpus_texts, write_jsonl
from pretrain.presets import load_spec
from pretrain.toy_tokenizers import llama3_style
from tasks.artifacts import artifact_key
from trainer.run_layout import metrics_path

PRESET = "tiny-local"
BUCKET = "pretrain-demo"
CREDENTIALS_BLOCK = "local-s3"


def seed_corpus(endpoint: str) -> None:
    """Two shards under s3://pretrain-demo/corpus/, one zstd-compressed like real dumps."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="demo", aws_secret_access_key="demo")
    if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=BUCKET)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        write_jsonl(corpus)
        lines = corpus.read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    s3.put_object(Bucket=BUCKET, Key="corpus/part-00000.jsonl", Body=b"".join(lines[:half]))
    s3.put_object(Bucket=BUCKET, Key="corpus/part-00001.jsonl.zst",
                  Body=zstandard.ZstdCompressor().compress(b"".join(lines[half:])))


def ensure_tokenizer() -> Path:
    """The tiny-local preset's tokenizer: a Llama-3-shaped BPE trained on the demo corpus."""
    directory = Path(load_spec(PRESET).tokenizer.path).expanduser()
    if not (directory / "tokenizer.json").exists():
        llama3_style(directory, corpus_texts())
    return directory


def save_credentials_block(endpoint: str, secret: str = "demo") -> None:
    from prefect_aws import AwsClientParameters, AwsCredentials

    AwsCredentials(
        aws_access_key_id="demo", aws_secret_access_key=secret, region_name="us-east-1",
        aws_client_parameters=AwsClientParameters(endpoint_url=endpoint),
    ).save(CREDENTIALS_BLOCK, overwrite=True)


def show_artifacts(flow_run_id, spec_name: str) -> None:
    """Print the flow run's artifacts in the order the stages published them, the run summary
    last, so that the terminal ends with the results. The loss-points table (200 rows for the
    demo's 400 steps) is named, not printed: the loss curve above it already shows its points."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    summary, points = artifact_key(spec_name, "run-summary"), artifact_key(spec_name, "loss-points")
    # keyless ones are Prefect's result records
    for artifact in sorted((a for a in artifacts if a.key), key=lambda a: (a.key == summary, a.created)):
        print(f"\nartifact {artifact.key} ({artifact.type}): {artifact.description}")
        if artifact.key == points:
            print("  not printed: the loss curve above shows these points; every step's metrics are in the "
                  "file named at the end")
        else:
            print(artifact_text(artifact.type, artifact.data))


# An image inlined as a data URI (the loss curve's PNG: tens of KB of base64 on one line).
DATA_URI = re.compile(r"data:image/[\w.+-]+;base64,[A-Za-z0-9+/=]*")


def artifact_text(kind: str | None, data: Any) -> str:
    """An artifact as the demo prints it: a table as ``column | column`` lines, anything else
    (markdown, a progress percentage) whole and line for line, indentation included (the
    resolved spec's YAML, the mermaid chart), with an inline image's data URI named instead of
    spelled out: the UI shows the image, a terminal cannot."""
    rows = json.loads(data) if kind == "table" and isinstance(data, str) else data
    if kind == "table" and isinstance(rows, list) and rows and isinstance(rows[0], dict):
        columns = list(rows[0])
        return "\n".join(["  " + " | ".join(columns),
                          *("  " + " | ".join(str(row.get(c)) for c in columns) for row in rows)])
    lines = str(data).splitlines() or [""]
    return "\n".join("  " + DATA_URI.sub(_image_placeholder, line) if line else "" for line in lines)


def _image_placeholder(uri: re.Match) -> str:
    media_type = uri.group(0).split(";", 1)[0].removeprefix("data:")
    return f"<{media_type}, {len(uri.group(0)) * 3 // 4 // 1024} KB: see the Prefect UI>"


def main(inputs_only: bool = False, overrides: list[str] | None = None) -> int:
    """``inputs_only``: set up what tiny-local reads (the corpus on the local S3 server, its
    credentials block in the Prefect API this process talks to, the tokenizer) and run nothing,
    for ``prefect deployment run pretrain/tiny-local`` against the stack's server.
    ``overrides``: spec fields to change, as ``pretrain run --set`` takes them."""
    components = ["s3"]
    if os.geteuid() == 0 and shutil.which("slurmctld") and not inputs_only:
        components.insert(0, "slurm")
    stack.up(components=tuple(components))
    endpoint = stack.environment()["PRETRAIN_S3_ENDPOINT"]
    if "slurm" in components:
        os.environ["SLURM_CONF"] = stack.environment()["SLURM_CONF"]
    seed_corpus(endpoint)
    save_credentials_block(endpoint)
    tokenizer = ensure_tokenizer()
    if inputs_only:
        print(f"s3://{BUCKET}/corpus/ on {endpoint}, block {CREDENTIALS_BLOCK!r}, tokenizer {tokenizer}")
        return 0

    from flows.pretrain import pretrain

    # Each demo trains afresh: a second `make demo` shows training again, not the finished run it
    # would otherwise continue (training.continue_run), unless the overrides say otherwise.
    overrides = ["training.continue_run=false", *(overrides or [])]
    spec = load_spec(PRESET, overrides)
    state = pretrain(preset=PRESET, overrides=overrides, return_state=True)
    show_artifacts(state.state_details.flow_run_id, spec.name)
    outputs = state.result(raise_on_failure=False)
    train = outputs.get("train") if isinstance(outputs, dict) else None
    # The last line: the run's outcome and, for a run that trained, the whole table of its steps
    # (the artifacts hold a downsample); else what the flow returned, a failure's message included.
    print(f"\npretrain flow: {state.name}; "
          + (f"every step's metrics: {metrics_path(train['run_dir'])}" if train else f"outputs: {outputs}"))
    return 0 if state.is_completed() else 1
