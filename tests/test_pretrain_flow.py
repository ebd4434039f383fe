"""The pretrain flow and the command line, end to end on the local stack."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset

from deployments.demo import save_credentials_block, seed_corpus
from flows.pretrain import pretrain
from pretrain import manifest
from pretrain.corpus import corpus_texts
from pretrain.toy_tokenizers import llama3_style
from trainer.tokenizer import load_tokenizer

PRETRAIN = [sys.executable, "-m", "cli.main"]


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory) -> Path:
    return llama3_style(tmp_path_factory.mktemp("tok"), corpus_texts())


def read_artifacts(state) -> dict:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    return {a.key: a for a in artifacts}


@pytest.mark.parametrize("executor", ["slurm", "local"])  # local: a fresh machine without Slurm
def test_tiny_local_runs_every_stage_on_the_demo_corpus(executor, s3_endpoint, demo_tokenizer, tmp_path):
    seed_corpus(s3_endpoint)
    save_credentials_block(s3_endpoint)
    # A short run: the trainer's own behaviour is covered in test_train_loop and test_train_task.
    overrides = [f"paths.root={tmp_path}", f"tokenizer.path={demo_tokenizer}", f"cluster.executor={executor}",
                 "data.tokenize_shards=2", "training.train_steps=12", "training.checkpoint_interval=5",
                 "training.eval_interval=6", "training.eval_iters=2", f"backend.native.compile={executor == 'slurm'}"]
    state = pretrain(preset="tiny-local", overrides=overrides, return_state=True)
    assert state.is_completed(), state.message
    out = Path(state.result()["fetch"])
    assert out.parent == tmp_path / "fetch"
    names = sorted(p.name for p in out.glob("*.jsonl"))
    assert names == ["part-00000.jsonl", "part-00001.jsonl"]  # the .zst shard was unpacked
    texts = [json.loads(line)["text"] for name in names for line in (out / name).read_text().splitlines()]

    dataset = IndexedDataset(state.result()["tokenize"])
    tokenizer = load_tokenizer("hf", model=str(demo_tokenizer))
    assert len(dataset) == len(texts)
    assert tokenizer._hf.decode(dataset[len(texts) - 1].tolist(), skip_special_tokens=True) == texts[-1]
    artifacts = read_artifacts(state)
    rows = json.loads(artifacts["tiny-local-tokenize"].data)
    assert [r["shard"] for r in rows] == ["0/2", "1/2"]  # a 2-task array (Slurm) or two local jobs
    assert sum(r["documents"] for r in rows) == len(texts)
    assert sum(r["tokens"] for r in rows) == int(dataset.sequence_lengths.sum())
    assert state.result()["tokenize"] in artifacts["tiny-local-dataset"].data

    trained = state.result()["train"]
    assert trained["status"] == "finished" and trained["step"] == 12
    assert Path(trained["run_dir"], "hf", "model.safetensors").exists()
    losses = [p for p in json.loads(artifacts["tiny-local-loss-points"].data) if p["loss"] is not None]
    assert [p["step"] for p in losses] == list(range(1, 13))
    assert "xychart-beta" in artifacts["tiny-local-loss-curve"].data
    assert "data:image/png;base64," in artifacts["tiny-local-loss-curve"].data
    summary = artifacts["tiny-local-run-summary"].data
    assert "| outcome | completed |" in summary
    # the run's results as the metrics stream gave them, and where they came from
    val = [p["val_loss"] for p in json.loads(artifacts["tiny-local-loss-points"].data) if p.get("val_loss")]
    assert f"| final train loss | {losses[-1]['loss']:.4g} (step 12) |" in summary, summary
    assert val and f"| final validation loss | {val[-1]:.4g} |" in summary, summary
    assert re.search(r"\| tokens/s \| [\d,]+ \|", summary) and re.search(r"\| step time \| [\d,.]+ ms \|", summary)
    assert f"| code version | `{manifest.code_version()}` |" in summary
    assert f"| torch | {torch.__version__} |" in summary and "| prefect | " in summary
    durations = summary.split("#### Stage durations")[1].split("####")[0]
    timed = [line.split(" | ")[0].strip("| ") for line in durations.splitlines()[3:] if line]
    assert [name for name in timed if name != "precompile"] == ["fetch", "tokenize", "train"], durations
    # every job of the run, each stage's: the tokenize array and merge, the warm-up, training
    rows = [line for line in summary.split("#### Slurm jobs")[1].split("####")[0].splitlines()[3:] if line]
    jobs = [line.split(" | ")[:2] for line in rows]
    stages = [stage.strip("| ") for stage, _ in jobs]
    assert stages == ["tokenize-0-of-2", "tokenize-1-of-2", "tokenize-merge",
                      *(["precompile"] if executor == "slurm" else []), "train"], summary
    assert jobs[-1][1] == trained["attempts"][0]["job"] and rows[-1].endswith(" | completed |"), rows
    if executor == "slurm":  # the precompile warm-up ran on the node training then used
        compiled = json.loads(artifacts["tiny-local-precompile"].data)
        assert compiled and compiled[0]["compiled"] > 0
        assert [row["compiled"] for row in trained["compiled_during_training"]] == [0]
        # the node is named as Slurm names it, so the next job can be pinned to it
        node = trained["compiled_during_training"][0]["node"]
        assert subprocess.run(["sinfo", "-h", "-n", node, "-o", "%n"], capture_output=True, text=True).stdout.strip() == node
        assert f"| train | {node} | 0 | " in summary and f"| precompile | {node} | {compiled[0]['compiled']} | " in summary

    again = pretrain(preset="tiny-local", overrides=overrides, return_state=True)
    assert {k: again.result()[k] for k in ("fetch", "tokenize")} == {k: state.result()[k] for k in ("fetch", "tokenize")}
    assert "nothing submitted" in read_artifacts(again)["tiny-local-tokenize"].description


def test_stages_run_alone_hand_on_earlier_outputs_or_name_the_stage_to_add(s3_endpoint, demo_tokenizer, tmp_path):
    seed_corpus(s3_endpoint)
    save_credentials_block(s3_endpoint)
    overrides = [f"paths.root={tmp_path}", f"tokenizer.path={demo_tokenizer}", "cluster.executor=local"]
    cold = pretrain(preset="tiny-local", overrides=overrides, stages=["train"], return_state=True)
    assert cold.is_failed() and "add 'fetch' to the flow's stages" in str(cold.message), cold.message
    assert not (tmp_path / "train").exists()
    # a run meant to train that did not says so in its summary, with what it got done
    summary = read_artifacts(cold)["tiny-local-run-summary"].data
    assert "| outcome | failed: " in summary and "add 'fetch' to the flow's stages" in summary
    assert "| final train loss | n/a |" in summary

    fetched = pretrain(preset="tiny-local", overrides=overrides, stages=["fetch"], return_state=True).result()
    assert set(fetched) == {"fetch"}
    later = pretrain(preset="tiny-local", overrides=overrides, stages=["tokenize"], return_state=True)
    assert later.result()["fetch"] == fetched["fetch"]  # handed on, not fetched again
    assert set(later.result()) == {"fetch", "tokenize"} and not (tmp_path / "train").exists()
    assert "cached" not in read_artifacts(later)["tiny-local-tokenize"].description


def test_demo_command_runs_the_flow_and_shows_the_fetch_artifact(local_stack, tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PRETRAIN_ROOT": str(tmp_path / "data")}
    env.pop("PREFECT_API_URL", None)  # the demo runs on the ephemeral API, like a fresh machine
    out = subprocess.run([*PRETRAIN, "demo"], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "artifact tiny-local-fetch (table)" in out.stdout
    assert "part-00001.jsonl" in out.stdout
    assert "artifact tiny-local-tokenize (table)" in out.stdout
    assert "artifact tiny-local-precompile (table)" in out.stdout
    assert "artifact tiny-local-loss-curve (markdown)" in out.stdout
    assert "xychart-beta" in out.stdout
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
