"""The pretrain flow and the command line, end to end on the local stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deployments.demo import seed_corpus, save_credentials_block
from flows.pretrain import pretrain

PRETRAIN = [sys.executable, "-m", "pretrain.cli"]


def test_tiny_local_fetches_the_demo_corpus(s3_endpoint, tmp_path):
    seed_corpus(s3_endpoint)
    save_credentials_block(s3_endpoint)
    state = pretrain(preset="tiny-local", overrides=[f"paths.root={tmp_path}"], return_state=True)
    assert state.is_completed(), state.message
    out = Path(state.result()["fetch"])
    assert out.parent == tmp_path / "fetch"
    names = sorted(p.name for p in out.glob("*.jsonl"))
    assert names == ["part-00000.jsonl", "part-00001.jsonl"]  # the .zst shard was unpacked
    docs = [json.loads(line) for name in names for line in (out / name).read_text().splitlines()]
    assert len(docs) > 100 and all(d["text"] for d in docs)


def test_demo_command_runs_the_flow_and_shows_the_fetch_artifact(local_stack, tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PRETRAIN_ROOT": str(tmp_path / "data")}
    env.pop("PREFECT_API_URL", None)  # the demo runs on the ephemeral API, like a fresh machine
    out = subprocess.run([*PRETRAIN, "demo"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "artifact tiny-local-fetch (table)" in out.stdout
    assert "part-00001.jsonl" in out.stdout
    assert "pretrain flow: Completed" in out.stdout


def test_validate_prints_the_resolved_spec_and_rejects_traps():
    ok = subprocess.run([*PRETRAIN, "validate", "llama3-70b", "--set", "training.train_steps=10"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "train_steps: 10" in ok.stdout
    bad = subprocess.run([*PRETRAIN, "validate", "llama3-70b", "--set", "parallel.tp=6"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "parallel.tp" in bad.stderr
    unknown = subprocess.run([*PRETRAIN, "validate", "llama9-1t"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "tiny-local" in unknown.stderr


def test_presets_lists_every_runbook_workload():
    out = subprocess.run([*PRETRAIN, "presets"], capture_output=True, text=True, check=True).stdout
    for name in ("megatron-gpt-6.7b", "gpt3-6.7b-trn1-16node", "gpt3-7.5b-gpu", "llama3-70b",
                 "llama3-70b-trn2", "llama3-70b-cp", "llama3.1-70b", "tiny-local"):
        assert name in out
