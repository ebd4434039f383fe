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
import yaml
from megatron.core.datasets.indexed_dataset import IndexedDataset

from deployments.demo import artifact_text, save_credentials_block, seed_corpus
from flows.pretrain import pretrain
from pretrain import manifest
from pretrain.corpus import corpus_texts
from pretrain.loss_curve import loss_curve_markdown, table_rows
from pretrain.presets import load_spec
from pretrain.toy_tokenizers import llama3_style
from run_summary import section_rows
from trainer.tokenizer import load_tokenizer

PRETRAIN = [sys.executable, "-m", "cli.main"]
REPO = Path(__file__).resolve().parents[1]


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


def test_tiny_local_runs_every_stage_on_the_demo_corpus(s3_endpoint, demo_tokenizer, tmp_path):
    """A fresh machine without Slurm: every stage as local jobs. The same flow on Slurm, with the
    compile warm-up, is test_deployments' run and the demo's (below)."""
    seed_corpus(s3_endpoint)
    save_credentials_block(s3_endpoint)
    # A short run: the trainer's own behaviour is covered in test_train_loop and test_train_task.
    overrides = [f"paths.root={tmp_path}", f"tokenizer.path={demo_tokenizer}", "cluster.executor=local",
                 "data.tokenize_shards=2", "training.train_steps=6", "training.checkpoint_interval=3",
                 "training.eval_interval=3", "training.eval_iters=2", "backend.native.compile=false",
                 "cluster.devices_per_node=1", "cluster.cpus_per_task=1"]  # one rank, one thread
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
    assert [r["shard"] for r in rows] == ["0/2", "1/2"]  # two local jobs (a 2-task array on Slurm)
    assert sum(r["documents"] for r in rows) == len(texts)
    assert sum(r["tokens"] for r in rows) == int(dataset.sequence_lengths.sum())
    assert state.result()["tokenize"] in artifacts["tiny-local-dataset"].data

    trained = state.result()["train"]
    assert trained["status"] == "finished" and trained["step"] == 6
    assert Path(trained["run_dir"], "hf", "model.safetensors").exists()
    losses = [p for p in json.loads(artifacts["tiny-local-loss-points"].data) if p["loss"] is not None]
    assert [p["step"] for p in losses] == list(range(1, 7))
    assert "xychart-beta" in artifacts["tiny-local-loss-curve"].data
    assert "data:image/png;base64," in artifacts["tiny-local-loss-curve"].data
    summary = artifacts["tiny-local-run-summary"].data
    assert "| outcome | completed |" in summary
    # the run's results as the metrics stream gave them, and where they came from
    val = [p["val_loss"] for p in json.loads(artifacts["tiny-local-loss-points"].data) if p.get("val_loss")]
    assert f"| final train loss | {losses[-1]['loss']:.4g} (step 6) |" in summary, summary
    assert val and f"| final validation loss | {val[-1]:.4g} |" in summary, summary
    assert re.search(r"\| tokens/s \| [\d,]+ \|", summary) and re.search(r"\| step time \| [\d,.]+ ms \|", summary)
    assert f"| code version | `{manifest.code_version()}` |" in summary
    assert f"| torch | {torch.__version__} |" in summary and "| prefect | " in summary
    stages = [stage for stage, *_ in section_rows(summary, "Stage durations")]
    assert stages == ["preflight", "fetch", "tokenize", "train"], summary
    # every job of the run, each stage's: the tokenize shards and their merge, training
    jobs = section_rows(summary, "Jobs")
    assert [stage for stage, *_ in jobs] == ["tokenize-0-of-2", "tokenize-1-of-2", "tokenize-merge", "train"], summary
    assert jobs[-1][1] == trained["attempts"][0]["job"] and jobs[-1][-1] == "completed", jobs

    # the data stages again, reused
    again = pretrain(preset="tiny-local", overrides=overrides, stages=["fetch", "tokenize"], return_state=True)
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
    env.pop("PREFECT_SERVER_ANALYTICS_ENABLED", None)  # set for the tests' own server (conftest), not a user's
    # 10 of the demo's 400 steps: the command end to end, its compile warm-up included; the loss
    # target of the whole run is measured by benchmarks/train_benchmark.py (docs/benchmarks.md)
    steps = ["--set=training.train_steps=10", "--set=training.checkpoint_interval=5",
             "--set=training.eval_interval=5"]
    out = subprocess.run([*PRETRAIN, "demo", *steps], env=env, capture_output=True, text=True, timeout=900)
    (tmp_path / "demo.stdout").write_text(out.stdout)  # what a user sees, kept for reading
    (tmp_path / "demo.stderr").write_text(out.stderr)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "artifact tiny-local-fetch (table)" in out.stdout
    assert "part-00001.jsonl" in out.stdout
    assert "artifact tiny-local-tokenize (table)" in out.stdout
    assert "artifact tiny-local-precompile (table)" in out.stdout
    assert "artifact tiny-local-loss-curve (markdown)" in out.stdout
    assert "xychart-beta" in out.stdout
    assert "pretrain flow: Completed" in out.stdout
    # what a new user saw first: the ephemeral server's telemetry losing SQLite's lock, and
    # megatron-core's optimizer warnings from every rank of every training job
    assert "Traceback" not in out.stderr and "database is locked" not in out.stderr, out.stderr[:3000]
    assert "Failed to send telemetry" not in out.stderr, out.stderr[:3000]  # offline: an error line instead
    assert "Transformer Engine and Apex are not installed" not in out.stderr
    # the artifacts whole: the spec's nested keys and the chart's indented statements
    assert "\n  data:\n    sources:\n" in out.stdout and "\n      xyChart:\n" in out.stdout
    assert "\n      line [" in out.stdout
    # the jobs table: every job's outcome, the nodes by Slurm's names (the compile table's too)
    jobs = re.findall(r"^  \| ([\w-]+) \| (\d+(?:_\d+)?) \| ([^|]*) \| ([^|]*) \|$", out.stdout, re.MULTILINE)
    assert {stage.split("-")[0] for stage, *_ in jobs} >= {"tokenize", "precompile", "train"}, out.stdout[-5000:]
    assert all(outcome.strip() == "completed" for *_, outcome in jobs), jobs
    [node] = {nodes.strip() for _, _, nodes, _ in jobs}  # the stack's one node, named as Slurm names it
    assert subprocess.run(["sinfo", "-h", "-n", node, "-o", "%n"], capture_output=True, text=True,
                          env=env).stdout.strip() == node
    # The warm-up compiled on the node that training then used, so training compiled nothing:
    # every graph it needed came from the warm-up's cache.
    compiled = dict(re.findall(r"^  \| (precompile|train) \| " + re.escape(node) + r" \| (\d+ \| \d+) \|$",
                               out.stdout, re.MULTILINE))
    (warm_up, _), (train_compiled, train_hits) = (map(int, compiled[s].split(" | ")) for s in ("precompile", "train"))
    assert warm_up > 0 and train_compiled == 0 and train_hits > 0, compiled
    # The terminal ends with the results: the run summary, then the file of every step's metrics;
    # the loss-points table (200 rows in the demo's 400 steps) is named, not printed.
    points = out.stdout.split("artifact tiny-local-loss-points (table)", 1)[1].split("\n\n", 1)[0]
    assert "not printed" in points and "| loss |" not in points, points
    last_artifact = out.stdout.rsplit("\nartifact ", 1)[1]
    assert last_artifact.startswith("tiny-local-run-summary (markdown)"), out.stdout[-3000:]
    ending = re.fullmatch(r"pretrain flow: Completed; every step's metrics: (\S+)", out.stdout.splitlines()[-1])
    assert ending, out.stdout[-3000:]
    records = [json.loads(line) for line in Path(ending[1]).read_text().splitlines()]
    assert sorted({r["step"] for r in records if "loss" in r}) == list(range(1, 11))
    # no 17-digit floats (the flow's return value had them): what it prints is rounded for reading
    numbers = re.findall(r"\d+\.\d+", out.stdout)
    assert numbers and all(len(n.replace(".", "").strip("0")) <= 6 for n in numbers), \
        [n for n in numbers if len(n.replace(".", "").strip("0")) > 6]


def test_demo_starts_the_ephemeral_server_without_its_telemetry_service():
    """The demo's first output was a SQLAlchemy traceback (``database is locked``): the ephemeral
    API server's telemetry service writing its session to SQLite while the server's other writers
    held the lock. The demo starts that server (a subprocess inheriting its environment) without
    the service, and only without that one."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_ANALYTICS_ENABLED"}  # set by conftest
    script = ("from deployments.ephemeral import configure_ephemeral_server\n"
              "configure_ephemeral_server()\n"
              "import prefect.server.services\n"
              "from prefect.server.services.perpetual_services import get_enabled_perpetual_services\n"
              "print(sorted(s.function.__name__ for s in get_enabled_perpetual_services(ephemeral=True)))\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    services = out.stdout.strip().splitlines()[-1]
    assert "send_telemetry_heartbeat" not in services and "schedule_event_vacuum_tasks" in services, services


def test_demo_prints_markdown_artifacts_whole():
    """The demo printed markdown artifacts without their indented lines (the spec's nested keys,
    the mermaid chart's statements) and dropped the loss curve's image line: every line now
    prints, in order and as it is, with only the image's data URI named instead of spelled out."""
    points = [{"step": s, "loss": 8.0 - s / 10, "val_loss": 7.9 - s / 10 if s % 5 == 0 else None,
               "lr": 0.0024000000000000002} for s in range(1, 21)]
    spec = yaml.safe_dump(load_spec("tiny-local").model_dump(mode="json"), sort_keys=False)
    markdown = f"{loss_curve_markdown(points, 'tiny-local: loss')}\n\n```yaml\n{spec}```"
    printed = artifact_text("markdown", markdown).splitlines()
    assert len(printed) == len(markdown.splitlines())
    for shown, line in zip(printed, markdown.splitlines()):
        if "data:image/png;base64," in line:
            assert re.fullmatch(r"  !\[loss curve\]\(<image/png, \d+ KB: see the Prefect UI>\)", shown), shown
        else:
            assert shown == (f"  {line}" if line else ""), (shown, line)
    assert "      xyChart:" in printed and "  data:" in printed and "    sources:" in printed
    table = artifact_text("table", json.dumps(table_rows(points)))
    assert table.splitlines()[0] == "  step | loss | val_loss | lr | grad_norm | tokens_per_s | mfu_pct"
    assert table.splitlines()[5] == "  5 | 7.5 | 7.4 | 0.0024 | None | None | None"
    assert artifact_text("progress", 100.0) == "  100.0"


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
