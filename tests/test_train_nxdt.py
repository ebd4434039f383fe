"""The neuron backend's train stage, built on NxDT's documented launch, checkpoint layout and log
lines (aws-neuron/neuronx-distributed src/neuronx_distributed/trainer/checkpoint.py;
aws-neuron/neuronx-distributed-training examples/train.sh and
src/neuronx_distributed_training/lightning_modules/model/base.py) and tested by rendering and parsing: no
Trainium and no Neuron SDK here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from flows.pretrain import run_stages
from pretrain.presets import load_spec
from render.nxdt import ModelConfigMismatch, check_model_config, torchrun_command
from render.nxdt_scripts import precompile_script, train_config, train_script
from render.shell import shell_line
from tasks.attempts import MetricsFollower
from pretrain.checkpoints import nxdt_newest, nxdt_step
from tasks.train_nxdt import compile_rows
from test_formats import ASSETS

CONVERTED = "/fsx/converted/checkpoint"
# NxDT's regex for the data position in a checkpoint path (lightning_modules/data/base.py)
CONSUMED = re.compile(r"consumed_samples\=([0-9]+.[0-9]+)")


@pytest.fixture
def spec():
    return load_spec("llama3-70b", ["model.init_from=/fsx/Meta-Llama-3-70B"])


def lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line and not line.startswith("#")]


def test_every_node_runs_the_precompiled_launch_against_the_same_cache(spec, tmp_path):
    precompile = precompile_script(spec, "/fsx/pc/conf", "/fsx/pc/attempt-1", retry_failed=False)
    script = train_script(spec, tmp_path, cache_url=None)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # the per-node cache the precompile job filled, not a fresh one
    cache = next(line for line in lines(precompile) if line.startswith("export NEURON_COMPILE_CACHE_URL="))
    assert cache == 'export NEURON_COMPILE_CACHE_URL="/home/ubuntu/neuron_cache/node-$NODE_RANK"'
    assert cache in lines(script)
    assert "export COMPILE=1" not in lines(script) and "export NEMO_EXPM_VERSION=\"$SLURM_JOB_ID\"" in lines(script)
    # the same torchrun line as precompile, without neuron_parallel_compile and the 10-step cap,
    # and with checkpoints in the run directory every node and every attempt shares
    launch = lines(script)[-1]
    assert launch == (f"{shell_line(torchrun_command(spec, 'nxdt_config', str(tmp_path / 'exp')))} "
                      "2>&1 | tee -a train.log")
    trained = shell_line(torchrun_command(spec, "nxdt_config")).replace("exp_manager.explicit_log_dir=null", "")
    assert lines(precompile)[-1].startswith(f"neuron_parallel_compile {trained}")
    assert f"exp_manager.explicit_log_dir={tmp_path / 'exp'}" in launch
    assert f'node_dir="{tmp_path}/node-$NODE_RANK"' in lines(script)


def nxd_checkpoint(root: Path, step: int, done: bool) -> Path:
    """A checkpoint as NxD's save_checkpoint leaves it: `checkpoint` first, `done` once every rank saved."""
    tag = root / f"llama3-70b--step={step}-consumed_samples={step * 1024}.0.ckpt"
    (tag / "model").mkdir(parents=True)
    (tag / "checkpoint").write_text("1")
    (tag / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.pt").write_bytes(b"\0" * 16)
    (tag / "user_content.pt").write_bytes(b"\0")
    if done:
        (tag / "done").write_text("1")
    return tag


def test_a_resubmitted_job_resumes_from_the_newest_complete_checkpoint(spec, tmp_path):
    checkpoints = tmp_path / "exp" / "checkpoints"
    assert nxdt_newest(checkpoints) is None and nxdt_step(checkpoints) == 0
    first = train_config(spec, "/fsx/data", CONVERTED, resume=None)
    # the first attempt starts from the converted weights, without their optimizer state
    assert first["exp_manager"]["resume_from_checkpoint"] == f"{CONVERTED}/"
    assert first["model"]["weight_init_only"] is True

    nxd_checkpoint(checkpoints, 10, done=True)
    step_20 = nxd_checkpoint(checkpoints, 20, done=True)
    nxd_checkpoint(checkpoints, 30, done=False)  # the job died while saving it
    assert nxdt_newest(checkpoints) == step_20 and nxdt_step(checkpoints) == 20  # what the chain of jobs counts
    resumed = train_config(spec, "/fsx/data", CONVERTED, resume=step_20)
    assert resumed["exp_manager"]["resume_from_checkpoint"] == str(step_20)  # no slash: tag = the step's directory
    assert resumed["model"]["weight_init_only"] is False
    assert CONSUMED.search(resumed["exp_manager"]["resume_from_checkpoint"]).group(1) == "20480.0"
    # nothing else changes, so the precompiled graphs still match
    for config in (first, resumed):
        config["exp_manager"].pop("resume_from_checkpoint"), config["model"].pop("weight_init_only")
    assert first == resumed


NXDT = ("Epoch 0:   3%|▎         | {step}/91 [16:05<7:52:06, 321.89s/it, loss=6.7, v_num=2, "
        "reduced_train_loss={loss}, lr=7.5e-9, parameter_norm=5536.0, global_step={global_step}.000, "
        "consumed_samples={samples}.0]")


def test_node_zeros_progress_bar_is_the_metrics_stream_as_it_grows(spec, tmp_path):
    """Lightning rewrites its bar with carriage returns: a step counts once its update is complete."""
    log = tmp_path / "node-0" / "train.log"
    log.parent.mkdir()
    follower = MetricsFollower(spec, log, total_steps=91, hang_timeout_s=60)
    follower.read()  # no log yet: the job is still queued
    with open(log, "w") as out:
        out.write("Compiler status PASS\n" + NXDT.format(step=1, global_step=0, loss=13.40, samples=1024) + "\r")
        half = NXDT.format(step=2, global_step=1, loss=12.10, samples=2048)
        out.write(half[:40])
        out.flush()
        follower.read()
        assert [p["step"] for p in follower.stream.as_list()] == [1]
        out.write(half[40:] + "\r")
        out.flush()
        follower.read()
    points = follower.stream.as_list()
    assert [(p["step"], p["loss"], p["consumed_samples"]) for p in points] == [(1, 13.4, 1024.0), (2, 12.1, 2048.0)]
    assert follower.stream.skipped == 0


def test_graphs_compiled_during_training_are_counted_per_node(tmp_path):
    for rank, (host, compiled) in enumerate([("trn1-1", 0), ("trn1-2", 2)]):
        node = tmp_path / f"node-{rank}"
        node.mkdir()
        (node / "host").write_text(host + "\n")
        (node / "train.log").write_text(
            "Using a cached neff at /home/ubuntu/neuron_cache/neuronxcc-2.15/MODULE_1/model.neff\n" * 3
            + "Compiler status PASS\n" * compiled)
    assert compile_rows(tmp_path, 3) == [
        {"node": "trn1-1", "compiled": 0, "from cache": 3}, {"node": "trn1-2", "compiled": 2, "from cache": 3},
        {"node": "node-2", "compiled": 0, "from cache": 0}]  # a node that never started


def test_megatron_lm_nodes_log_beside_the_run_and_resume_from_their_own_checkpoints(tmp_path):
    """Megatron-LM: --save and --load are the run's checkpoint directory, so a resubmitted job
    resumes by itself; the last rank prints the iteration lines, hence the last node's log."""
    from render.megatron_lm import node_command
    from render.megatron_lm import torchrun_command as megatron_torchrun

    spec = load_spec("gpt3-7.5b-gpu")
    command = node_command(spec, "/fsx/data/oscar_text_document", tmp_path)
    assert command.argv[:2] == ["bash", "-c"]
    script = command.argv[2]
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    line = shell_line(megatron_torchrun(spec, "/fsx/data/oscar_text_document", str(tmp_path / "checkpoints")))
    log = f"{tmp_path}/node-$NODE_RANK.log"
    # first a check that the image holds pretrain_gpt.py: a missing script is not worth a second job
    guard, _, launch = script.removeprefix("set -o pipefail; ").partition(" exit 127; }; ")
    assert guard.startswith("[ -e /workspace/Megatron-LM/pretrain_gpt.py ] || {") and f"| tee -a {log} >&2;" in guard
    assert launch == f"{line} 2>&1 | tee -a {log}"
    argv = line.split()
    assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1] == str(tmp_path / "checkpoints")


def test_every_backend_runs_the_device_sampler_beside_its_launch_on_each_node(spec, tmp_path):
    """NxDT's train.sh and Megatron-LM's torchrun line carry the same sampler as the native
    trainer: run by the job's own Python (in the image when the job runs in one), every
    ``training.monitor_interval_s``, into the run's devices/ and TensorBoard."""
    from render.megatron_lm import node_command as megatron_node_command
    from render.nxdt_scripts import node_command as nxdt_node_command

    expected = ["-m", "trainer", "monitor", "--dir", str(tmp_path / "devices"),
                "--tensorboard", str(tmp_path / "tensorboard"), "--interval", "2.0"]
    nxdt = load_spec("llama3-70b", ["model.init_from=/fsx/Meta-Llama-3-70B", "training.monitor_interval_s=2"])
    command = nxdt_node_command(nxdt, tmp_path / "train.sh", tmp_path)
    assert command.argv == ["bash", str(tmp_path / "train.sh")] and command.sidecar == expected
    megatron = load_spec("gpt3-7.5b-gpu", ["training.monitor_interval_s=2"])
    assert megatron_node_command(megatron, "/fsx/data/oscar_text_document", tmp_path).sidecar == expected


# The config.json of Meta's Llama 3 70B and 8B on the Hugging Face Hub (meta-llama/Meta-Llama-3-70B,
# meta-llama/Meta-Llama-3-8B), the fields of their shape.
LLAMA3_70B_CONFIG = {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                     "num_hidden_layers": 80, "num_key_value_heads": 8, "vocab_size": 128256}
LLAMA3_8B_CONFIG = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}


def test_a_config_json_of_another_model_is_refused_before_any_stage_runs(tmp_path, filesystem):
    """NxDT's Llama takes its heads, KV heads, feed-forward width and vocabulary from hf_config's
    config.json, only layers and hidden size from the YAML: the 8B's config.json under the 70B
    spec would train neither. The flow refuses it, naming each field, before fetch."""
    seventy, eight = tmp_path / "70b" / "config.json", tmp_path / "8b" / "config.json"
    for path, config in ((seventy, LLAMA3_70B_CONFIG), (eight, LLAMA3_8B_CONFIG)):
        path.parent.mkdir()
        path.write_text(json.dumps({**config, "model_type": "llama", "rope_theta": 500000.0}))
    # paths.root on a filesystem with room for the 70B's checkpoint (988 GB), which the preflight asks
    root = filesystem(2 * 10**12) / "root"
    one_node = ["cluster.nodes=1", "cluster.devices_per_node=32", "parallel.pp=1", "parallel.pipeline_cuts=[]",
                f"tokenizer.path={ASSETS / 'hf'}", f"paths.root={root}"]
    check_model_config(load_spec("llama3-70b", [*one_node, f"backend.neuron.hf_config={seventy}"]))
    spec = load_spec("llama3-70b", [*one_node, f"backend.neuron.hf_config={eight}"])
    with pytest.raises(ModelConfigMismatch, match=re.escape(
            f"backend.neuron.hf_config={eight} does not describe the model of the spec, and NxDT builds the model "
            "from it: num_hidden_layers is 32, the spec says 80; hidden_size is 4096, the spec says 8192; "
            "intermediate_size is 14336, the spec says 28672; num_attention_heads is 32, the spec says 64")):
        run_stages(spec, ["fetch", "tokenize", "train"])
    assert not root.exists()  # nothing fetched
    with pytest.raises(ModelConfigMismatch, match="no such file on this machine"):
        check_model_config(load_spec("llama3-70b", [*one_node, f"backend.neuron.hf_config={tmp_path / 'none.json'}"]))
