"""`pretrain plan` on the local stack: after fetch and tokenize ran (tokenize as Slurm jobs), a
checkout at another commit that changed no writer (only the README) plans to reuse both; a
changed tokenizer field plans tokenize again and says which field moved its key. Without the
stack: the torchtitan backend's plan has the flow's stages, and says why it has no precompile job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prefect import flow

from cli.main import main
from deployments import stack
from flows.plan import plan, plan_table
from flows.pretrain import run_stages
from pretrain.presets import load_spec
from flows.stages import BACKEND_STAGES, STAGE_NAMES, to_run
from test_formats import ASSETS

ROOT = Path(__file__).resolve().parent.parent


@flow
def fetch_and_tokenize(spec):
    return run_stages(spec, ["fetch", "tokenize"])[0]


def checkout_at_a_readme_commit(directory: Path) -> Path:
    """This working tree's files as a git checkout of their own, then a commit that edits only the README."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    for name in listed:
        if (ROOT / name).is_file():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, directory / name)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run([*git, "init", "-q"], cwd=directory, check=True)
    subprocess.run([*git, "add", "-A"], cwd=directory, check=True)
    subprocess.run([*git, "commit", "-qm", "as the working tree"], cwd=directory, check=True)
    with open(directory / "README.md", "a") as readme:
        readme.write("\nAn edit that changes no output.\n")
    subprocess.run([*git, "commit", "-qam", "README only"], cwd=directory, check=True)
    return directory


def plan_in(checkout: Path, *overrides: str) -> str:
    argv = [sys.executable, "-m", "cli.main", "plan", "tiny-local", *(f"--set={o}" for o in overrides)]
    out = subprocess.run(argv, cwd=checkout, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(checkout)})
    assert out.returncode == 0, out.stderr
    return out.stdout


def actions(plan: str) -> dict[str, str]:
    """Each stage's action, from the table (the checkpoint advice after it, past a blank line, is no stage)."""
    table = plan.split("\n\n")[0]
    return {line.split()[0]: line.split()[1] for line in table.splitlines() if line and not line.startswith(" ")}


def test_a_commit_that_changes_no_writer_reuses_every_finished_stage(local_stack, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = (ASSETS / "corpus.jsonl").read_text().splitlines(keepends=True)
    (corpus / "corpus.jsonl").write_text("".join(line for line in lines if '""' not in line))
    overrides = [f"paths.root={tmp_path / 'root'}", f"data.sources=[{{uri: {corpus}/}}]",
                 f"tokenizer.path={ASSETS / 'hf'}", "cluster.executor=slurm"]
    outputs = fetch_and_tokenize(load_spec("tiny-local", overrides))
    assert Path(outputs["tokenize"] + ".bin").exists()

    checkout = checkout_at_a_readme_commit(tmp_path / "checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout
    assert head.strip() and head.strip() not in subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                                              capture_output=True, text=True).stdout
    plan = plan_in(checkout, *overrides)
    assert actions(plan) == {"fetch": "REUSE", "tokenize": "REUSE", "convert": "SKIP", "precompile": "RUN",
                             "image": "SKIP", "train": "RUN"}, plan
    assert str(Path(outputs["tokenize"]).parent) in plan  # the output path the flow handed on

    replanned = plan_in(checkout, *overrides, "tokenizer.append_eod=false")
    assert actions(replanned)["tokenize"] == "RUN" and actions(replanned)["fetch"] == "REUSE", replanned
    assert "changed since the newest output: tokenizer.append_eod: true -> false" in replanned


def local_inputs(tmp_path: Path) -> list[str]:
    """A local corpus and tokenizer, so that planning asks neither S3 nor the Hub."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(ASSETS / "corpus.jsonl", corpus)
    return [f"paths.root={tmp_path / 'root'}", f"data.sources=[{{uri: {corpus}/}}]", f"tokenizer.path={ASSETS / 'hf'}"]


@pytest.mark.pure
@pytest.mark.parametrize("preset, overrides, why", [
    ("llama3-70b-trn2-torchneuron", [],
     "device=neuron: AWS documents no ahead-of-time compile for TorchNeuron (docs/render.md); "
     "torch.compile(backend=neuron) compiles each graph at its first call, so the first training run fills"),
    ("llama3-70b-trn2-torchneuron", ["backend.torchtitan.compile=false"],
     "backend.torchtitan.compile=false: torch.compile is off"),
    ("llama3-8b-gpu", [],
     "device=cuda: nothing to compile ahead; torch.compile (inductor) compiles each graph in the training job"),
])
def test_torchtitan_plans_the_flows_stages_and_says_who_compiles(tmp_path, preset, overrides, why):
    """The flow runs no tokenize and no precompile job for torchtitan: the plan shows fetch and
    train to run, and the other stages skipped, precompile with where the graphs get compiled instead."""
    table = plan_table(plan(load_spec(preset, [*local_inputs(tmp_path), *overrides])))
    assert actions(table) == {"fetch": "RUN", "tokenize": "SKIP", "convert": "SKIP", "precompile": "SKIP",
                              "image": "SKIP", "train": "RUN"}, table
    assert why in " ".join(table.split()), table


@pytest.mark.pure
@pytest.mark.parametrize("preset, overrides, stages, refused", [
    ("llama3-8b-gpu", [], ["fetch", "precompile"], "precompile does not run for spec 'llama3-8b-gpu': device=cuda"),
    ("tiny-local", ["backend.native.compile=false"], ["precompile", "train"],
     "precompile does not run for spec 'tiny-local': backend.native.compile=false"),
    ("tiny-local", [], ["image"], "image does not run for spec 'tiny-local': backend.kind=native"),
    ("gpt3-7.5b-gpu", ["backend.megatron_lm.image=null", "backend.megatron_lm.container_image=nvcr.io/nvidia/pytorch:25.01-py3"],
     ["image", "train"], "image does not run for spec 'gpt3-7.5b-gpu': backend.megatron_lm.image is not set"),
])
def test_a_stage_named_that_the_backend_has_no_job_for_is_refused_before_anything_runs(
        tmp_path, preset, overrides, stages, refused):
    """Asked by name for a stage the flow would skip, the run is refused at once, with the
    reason the plan gives and the stages that do run, instead of ending green having done
    nothing of it. Nothing is fetched."""
    spec = load_spec(preset, [*local_inputs(tmp_path), *overrides])
    with pytest.raises(ValueError, match=f"stages: {refused}") as raised:
        run_stages(spec, stages)
    assert "Leave " in str(raised.value) and "the stages that run here: fetch" in str(raised.value)
    assert not (tmp_path / "root").exists()
    skipped = {row.stage: row.reason for row in plan(spec) if row.action == "skip"}
    assert skipped[refused.split()[0]] in str(raised.value)  # the plan's reason, word for word


@pytest.mark.pure
def test_every_backend_runs_the_runbooks_stages_in_one_order_each_a_whole_value():
    """The flow, the plan and render walk each backend's list: all six stages, in the runbook's
    order, and every stage that can run has its task, its plan, (but fetch, whose sources the
    spec lists) its files and its Kubernetes objects; a stage the backend has no job for says what
    does its work."""
    for kind, stages in BACKEND_STAGES.items():
        assert tuple(stage.name for stage in stages) == STAGE_NAMES, kind
        for stage in stages:
            if stage.run is None:
                assert stage.plan is None and stage.render is None and stage.objects is None, (kind, stage.name)
            else:
                assert stage.plan is not None and (stage.render is not None or stage.name == "fetch"), (kind, stage.name)
                # on Kubernetes every job but the image build (Slurm's: a pod pulls a registry image)
                assert (stage.objects is not None) == (stage.name not in ("fetch", "image")), (kind, stage.name)
            assert set(stage.needs) <= set(STAGE_NAMES[:STAGE_NAMES.index(stage.name)]), (kind, stage.name)


@pytest.mark.pure
@pytest.mark.parametrize("preset, overrides, selected, runs", [
    # a stage left out but read by one that runs hands on its output (reuse-only); others do not run
    ("tiny-local", [], {"fetch"}, [("fetch", False)]),
    ("tiny-local", [], {"precompile"}, [("fetch", True), ("tokenize", True), ("precompile", False)]),
    ("tiny-local", [], {"train"}, [("fetch", True), ("tokenize", True), ("train", False)]),
    ("llama3-70b", ["model.init_from=/ckpt"], {"train"}, [("fetch", True), ("tokenize", True), ("convert", True),
                                                      ("train", False)]),
    ("llama3-70b", [], {"precompile", "train"}, [("fetch", True), ("tokenize", True), ("precompile", False),
                                                ("train", False)]),
    ("gpt3-7.5b-gpu", [], {"image"}, [("image", False)]),
    ("gpt3-7.5b-gpu", [], {"train"}, [("fetch", True), ("tokenize", True), ("image", True), ("train", False)]),
    ("llama3-8b-gpu", [], set(STAGE_NAMES), [("fetch", False), ("train", False)]),
])
def test_a_run_of_some_stages_runs_them_and_hands_on_what_they_read(tmp_path, preset, overrides, selected, runs):
    spec = load_spec(preset, [*local_inputs(tmp_path), *overrides])
    assert [(stage.name, reuse_only) for stage, reuse_only in to_run(spec, selected)] == runs


def test_a_plan_without_the_hub_tokens_secret_block_says_so_in_one_line(tmp_path, capsys):
    """llama3-70b's tokenizer and checkpoint come from a gated Hub repository, read with the token
    of the Secret block hub.token_block names: without that block the plan printed a traceback.
    It prints the one line that names the field, the API it asked and the fix, and exits 2, as a
    bad spec does."""
    assert main(["plan", "llama3-70b", f"--set=paths.root={tmp_path}"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: hub.token_block='huggingface-token': no Secret block of that name in the "
                          "Prefect API at http"), err
    assert "Secret(value=<a Hugging Face token>).save('huggingface-token')" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    # the checkpoint advice needs nothing from the Hub: printed, with its inputs (docs/checkpoints.md)
    assert ("checkpoint interval: 16 nodes at a node MTBF of 6,335 h (the run's: 16.5 days), save stall 62 s, "
            "restart 21 min, 320 s a step") in out
    assert "  spec: every 10 steps (53 min), expected goodput 97.9 %" in out
    assert "set training.checkpoint_interval=41" in out
    assert (f"checkpoint room: about 987.7 GB a checkpoint (70.55 B parameters x 14 bytes); backend.kind=neuron "
            f"deletes none of its own; ") in out and f" free under paths.root={tmp_path}\n" in out, out


def test_plan_of_tiny_local_with_no_api_set_reads_its_block_without_an_error_line(local_stack, tmp_path):
    """tiny-local lists its S3 corpus with the credentials of the block `local-s3`, so with no
    PREFECT_API_URL the plan starts Prefect's ephemeral server to read it, as the demo does (a
    plan that reads no block starts none). That server's telemetry logged an ERROR line offline
    ("Failed to send telemetry"); it is off, and nothing else says ERROR."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PREFECT_API_URL", "PREFECT_SERVER_ANALYTICS_ENABLED")}  # as on a fresh shell
    env |= {"HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect"),
            "PRETRAIN_STACK_DIR": str(stack.stack_dir())}
    pretrain = str(Path(sys.executable).with_name("pretrain"))
    inputs = subprocess.run([pretrain, "demo", "--inputs-only"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert inputs.returncode == 0, inputs.stdout[-3000:] + inputs.stderr[-3000:]
    out = subprocess.run([pretrain, "plan", "tiny-local", f"--set=paths.root={tmp_path / 'root'}"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert actions(out.stdout)["fetch"] == "RUN", out.stdout
    printed = out.stdout + out.stderr + inputs.stdout + inputs.stderr
    assert "ERROR" not in printed and "Traceback" not in printed, printed[-3000:]
