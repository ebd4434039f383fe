"""The fetch stage of the pretrain flow with hf:// URIs, on Prefect's API: the token comes from a
Secret block and appears in no log, artifact, output or rendered job file; the later stages get
paths on the shared disk. The Hub is tests/hub_server.py's loopback server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prefect import flow, get_client
from prefect.blocks.system import Secret
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from flows.pretrain import run_stages
from hub_server import LocalHub
from pretrain.hub import HubError
from pretrain.presets import load_spec
from flows.dry_run import render_files
from tasks.fetch import hub_access
from test_formats import ASSETS

TOKEN = "hf_" + "s" * 34
README = b"---\nconfigs:\n- config_name: raw_en\n  data_files:\n  - split: train\n    path: raw_en/*.parquet\n---\n"


@flow
def fetch_stage(spec):
    outputs, _ = run_stages(spec, ["fetch"])
    return outputs


def corpus_parquet() -> bytes:
    texts = [json.loads(line)["text"] for line in (ASSETS / "corpus.jsonl").read_text().splitlines()]
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buffer)
    return buffer.getvalue()


def test_hub_sources_with_a_token_from_a_secret_block(tmp_path):
    server = LocalHub()
    try:
        server.tokens.add(TOKEN)
        server.granted.add(TOKEN)
        tokenizer = {p.name: p.read_bytes() for p in (ASSETS / "hf").iterdir()}
        server.repo("model", "org/llama", gated=True).commit(
            {**tokenizer, "config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 1024})
        server.repo("dataset", "org/wiki").commit({"README.md": README, "raw_en/train.parquet": corpus_parquet()})
        Secret(value=TOKEN).save("hf-token-flowtest", overwrite=True)
        spec = load_spec("tiny-local", [
            "data.sources=[{uri: 'hf://datasets/org/wiki', dataset: {config: raw_en, split: train}}]",
            "tokenizer.path=hf://org/llama", "hub.token_block=hf-token-flowtest", f"hub.endpoint={server.endpoint}",
            f"paths.root={tmp_path / 'root'}"])

        state = fetch_stage(spec, return_state=True)
        fetched = Path(state.result()["fetch"])
        shard = fetched / "wiki-raw_en-train-00000-of-00001.jsonl"
        assert shard.read_text().count("\n") == (ASSETS / "corpus.jsonl").read_text().count("\n")
        described = json.loads((fetched / "MANIFEST.json").read_text())
        sources = described["key_inputs"]["sources"]
        assert len(sources[0]["commit"]) == 40 and sources[0]["uri"].endswith(sources[0]["commit"])
        # what datasets read, recorded beside the commit that keys it
        [(uri, read)] = described["datasets"].items()
        assert uri == sources[0]["uri"] and read["rows"] == shard.read_text().count("\n")
        assert read["columns"] == ["text"] and len(read["fingerprint"]) == 16
        # no weights: the tokenizer's files only
        (tokenizer_dir,) = (tmp_path / "root" / "hub").glob("hub-*")
        assert sorted(p.name for p in tokenizer_dir.iterdir()) == sorted([*tokenizer, "MANIFEST.json"])

        # the token: in no log, artifact, output or rendered file
        APILogWorker.drain_all(timeout=30)
        flow_run = state.state_details.flow_run_id
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run])))
            artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run])))
        assert any("commit" in log.message for log in logs)
        assert {a.key for a in artifacts} >= {"tiny-local-hub", "tiny-local-fetch"}
        assert not any(TOKEN in log.message for log in logs)
        assert not any(TOKEN in json.dumps(a.data) + (a.description or "") for a in artifacts)
        written = [p for p in (tmp_path / "root").rglob("*") if p.is_file()]
        assert written and not any(TOKEN.encode() in p.read_bytes() for p in written)
        rendered = render_files(spec)
        assert "hf-token-flowtest" in rendered["hub_downloads.txt"]
        assert not any(TOKEN in text for text in rendered.values())
    finally:
        server.close()


def test_a_missing_secret_block_is_named():
    spec = load_spec("tiny-local", ["tokenizer.path=hf://org/llama", "hub.token_block=no-such-hf-block"])
    with pytest.raises(HubError, match="hub.token_block='no-such-hf-block': no Secret block of that name"):
        hub_access(spec)
