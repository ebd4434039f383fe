"""Dry runs: `pretrain render` writes every file a run would launch, and the flow's dry_run
publishes the same as artifacts, submitting nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from flows.pretrain import pretrain


def test_render_writes_config_conversion_and_sbatch(tmp_path):
    out = tmp_path / "rendered"
    done = subprocess.run([sys.executable, "-m", "cli.main", "render", "llama3-70b-trn2", "--set",
                           "model.init_from=/fsx/Meta-Llama-3-70B", "--set", f"paths.root={tmp_path}",
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "convert.sh", "hub_downloads.txt", "nxdt_config.yaml", "precompile.sh", "sbatch_convert.sh",
        "sbatch_precompile.sh", "sbatch_tokenize.sh", "sbatch_train.sh", "spec.yaml", "tokenize.sh", "torchrun.sh",
        "train.sh", "train_env.sh"]
    config = yaml.safe_load((out / "nxdt_config.yaml").read_text())
    convert = (out / "convert.sh").read_text()
    # The conversion and the training config come from one spec: they agree on every shared value.
    assert config["model"]["fuse_qkv"] is True and "--fuse-qkv" in convert
    assert " ".join(config["model"]["pipeline_cuts"]) in convert and "--hw-backend trn2" in convert
    assert config["model"]["weight_init_only"] is True
    # Precompile traces the very launch that training runs, on each node with its own cache.
    precompile = (out / "precompile.sh").read_text()
    assert f"neuron_parallel_compile {(out / 'torchrun.sh').read_text().strip()} trainer.max_steps=10" in precompile
    assert 'export NEURON_COMPILE_CACHE_URL="/workspace/neuron_cache/node-$NODE_RANK"' in precompile
    # Training runs the same line with the same per-node cache, its checkpoints in the run directory.
    train = (out / "train.sh").read_text()
    # train_setup.sh's node set-up, in both: the rendezvous port reserved, Lustre's dirty cache capped
    for script in (precompile, train):
        assert "sysctl -w net.ipv4.ip_local_reserved_ports=41000" in script
        assert "lctl set_param 'osc.*.max_dirty_mb=64'" in script
    assert 'export NEURON_COMPILE_CACHE_URL="/workspace/neuron_cache/node-$NODE_RANK"' in train
    launch = (out / "torchrun.sh").read_text().strip().removesuffix(" exp_manager.explicit_log_dir=null")
    assert f"{launch} 'exp_manager.explicit_log_dir=<train-run>/exp' 2>&1 | tee -a train.log" in train
    # NxDT's Llama configs read Arrow blocks of the sequence length: one unsharded job writes them.
    assert "--format nxd-arrow --seq-length 8192" in (out / "tokenize.sh").read_text()
    sbatch = (out / "sbatch_train.sh").read_text()
    assert "#SBATCH --nodes=8" in sbatch and "#SBATCH --time=4320" in sbatch
    # Every job the run submits has its batch script: the conversion and the tokenizer on one
    # node, neuron_parallel_compile on the nodes training will use.
    for stage, nodes in (("convert", 1), ("tokenize", 1), ("precompile", 8)):
        script = (out / f"sbatch_{stage}.sh").read_text()
        assert f"#SBATCH --nodes={nodes}\n" in script and "#SBATCH --time=4320" in script, stage
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_render_lists_the_hub_downloads_of_llama3_70b(tmp_path, capsys):
    """`pretrain render llama3-70b`: the tokenizer's files without the 140 GB of weights and one
    config.json from meta-llama's gated repository, and wikicorpus read with datasets, each at
    the revision the fetch stage resolves to its commit; the token named by its block, never shown."""
    from cli.main import main

    out = tmp_path / "rendered"
    assert main(["render", "llama3-70b", "--set", f"paths.root={tmp_path}", "--out", str(out)]) == 0
    assert f"{out}/hub_downloads.txt" in capsys.readouterr().out.splitlines()
    header, access, *lines = (out / "hub_downloads.txt").read_text().splitlines()
    assert header.startswith("# Hugging Face Hub downloads of the fetch stage (huggingface_hub.snapshot_download")
    assert access == "# access: the token of Secret block 'huggingface-token', read on the control plane only"
    assert lines == [
        "tokenizer.path: model meta-llama/Meta-Llama-3-70B @ main, files tokenizer.json, tokenizer_config.json, "
        "special_tokens_map.json, tokenizer.model -> <hub-output:tokenizer.path>",
        "backend.neuron.hf_config: model meta-llama/Meta-Llama-3-70B @ main, files config.json -> "
        "<hub-output:backend.neuron.hf_config>/config.json",
        "data.sources[0]: dataset wikicorpus @ main, files all, read with datasets (config raw_en, split train) "
        "and written as JSONL shards -> <fetch-output>"]
    # the stages after fetch read what fetch downloaded, never the URI
    config = yaml.safe_load((out / "nxdt_config.yaml").read_text())
    assert "hf://" not in json.dumps(config) and "hf://" not in (out / "tokenize.sh").read_text()


def test_flow_dry_run_publishes_rendered_files_and_submits_nothing(tmp_path):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    state = pretrain(preset="gpt3-7.5b-gpu", overrides=[f"paths.root={tmp_path}"], dry_run=True, return_state=True)
    assert state.is_completed(), state.message
    assert "torchrun.sh" in state.result()["rendered"]
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    by_key = {a.key: a.data for a in artifacts if a.key}
    assert "--container-image=<image-output>/image.sqsh" in by_key["gpt3-7-5b-gpu-render-sbatch-train"]
    assert "FROM nvcr.io/nvidia/pytorch:24.09-py3" in by_key["gpt3-7-5b-gpu-render-containerfile"]
    assert "--global-batch-size 288" in by_key["gpt3-7-5b-gpu-render-torchrun"]
    assert not (tmp_path / "fetch").exists() and not (tmp_path / "jobs").exists()


def test_a_deployments_named_parameters_survive_the_users_overrides_and_an_override_wins(tmp_path):
    """A deployment's cluster block and checkpoint are named parameters: passing `overrides`
    (which replaces the deployment's whole list) keeps them, and an explicit override wins."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    def rendered(**parameters):
        state = pretrain(preset="llama3-70b", dry_run=True, return_state=True, **parameters)
        assert state.is_completed(), state.message
        with get_client(sync_client=True) as client:
            artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
        return {a.key: a for a in artifacts if a.key}

    deployment = {"cluster_block": "trn1-cluster", "init_from": "/fsx/Meta-Llama-3-70B"}
    by_key = rendered(**deployment, overrides=[f"paths.root={tmp_path}", "training.train_steps=10"])
    assert "hf-to-nxdt --input /fsx/Meta-Llama-3-70B" in by_key["llama3-70b-render-convert"].data
    assert "weight_init_only: true" in by_key["llama3-70b-render-nxdt-config"].data
    assert "max_steps: 10" in by_key["llama3-70b-render-nxdt-config"].data
    assert "cluster.block='trn1-cluster'" in by_key["llama3-70b-render-sbatch-train"].description

    by_key = rendered(**deployment, overrides=[f"paths.root={tmp_path}", "cluster.block=trn1-other",
                                               "model.init_from=/fsx/llama3-70b-step-1000"])
    assert "hf-to-nxdt --input /fsx/llama3-70b-step-1000" in by_key["llama3-70b-render-convert"].data
    assert "cluster.block='trn1-other'" in by_key["llama3-70b-render-sbatch-train"].description

    # without the checkpoint, the 70B preset trains from scratch, as the runbook's yaml ships
    by_key = rendered(overrides=[f"paths.root={tmp_path}"])
    assert "llama3-70b-render-convert" not in by_key
    assert "resume_from_checkpoint: null" in by_key["llama3-70b-render-nxdt-config"].data


def test_render_native_writes_the_trainer_config_the_node_program_accepts(tmp_path):
    """The dry run of the native backend renders the very config `python -m trainer train` reads,
    and one torchrun line for every node, with Slurm's stop signals forwarded to the ranks."""
    import json

    from trainer.train.config import TrainConfig

    out = tmp_path / "rendered"
    done = subprocess.run([sys.executable, "-m", "cli.main", "render", "tiny-local", "--set",
                           f"paths.root={tmp_path}", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {"train.json", "torchrun.sh", "train_env.sh", "sbatch_train.sh", "sbatch_precompile.sh",
            "sbatch_tokenize.sh"} <= {p.name for p in out.iterdir()}
    # Slurm sends USR2 ahead of the time limit, so the trainer checkpoints before it is killed.
    assert "#SBATCH --signal=USR2@90" in (out / "sbatch_train.sh").read_text()
    config = TrainConfig.from_file(out / "train.json")
    assert (config.steps, config.global_batch_size, config.seq_length) == (400, 16, 128)
    assert config.parallel.compile and config.model.num_kv_heads == 2
    torchrun = (out / "torchrun.sh").read_text()
    assert "--nproc_per_node 2" in torchrun and "--node_rank \"$NODE_RANK\"" in torchrun
    assert "SIGUSR2" in torchrun and "-m trainer train --config" in torchrun
    assert f"TORCHINDUCTOR_CACHE_DIR={tmp_path}/compile-cache/inductor" in (out / "train_env.sh").read_text()
    assert json.loads((out / "train.json").read_text())["checkpoint"]["dir"].endswith("/checkpoints")


def test_every_launch_puts_its_checkpoints_where_its_train_stage_looks(tmp_path):
    """One function (trainer/run_layout.py) names a run's checkpoint directory: the native trainer's
    config, Megatron-LM's --save/--load and the directory the train stages resume from or report;
    NxDT's exp_manager names it the same under its log directory, where the NxDT stage looks."""
    from pretrain.presets import load_spec
    from render import megatron_lm, native
    from render.nxdt_scripts import log_dir, train_script
    from trainer.run_layout import checkpoint_dir

    run = tmp_path / "run"
    assert checkpoint_dir(run) == run / "checkpoints"
    config = native.train_config(load_spec("tiny-local"), dataset="/d/x_text_document", run_dir=str(run), eod_id=0)
    assert config["checkpoint"]["dir"] == str(checkpoint_dir(run))
    line = megatron_lm.node_command(load_spec("gpt3-7.5b-gpu"), "/d/x_text_document", run).argv[-1]
    assert f"--save {checkpoint_dir(run)} --load {checkpoint_dir(run)}" in line
    assert f"exp_manager.explicit_log_dir={log_dir(run)} " in train_script(load_spec("llama3-70b"), run, None)


def test_a_blend_reaches_every_megatron_format_reader_as_weights_and_prefixes(tmp_path):
    """data.blend mixes other tokenized datasets into training by weight: the native trainer's
    paths and weights (a config it accepts), Megatron-LM's --data-path W P ..., NxDT GPT's data_prefix."""
    import json

    from pretrain.presets import SpecError, load_spec
    from render import megatron_lm, native, nxdt
    from trainer.train.config import TrainConfig

    mix = ["data.weight=0.7", "data.blend=[{prefix: /fsx/code_text_document, weight: 0.3}]"]
    config = native.train_config(load_spec("tiny-local", mix), dataset="/fsx/own_text_document",
                                 run_dir=str(tmp_path), eod_id=0)
    (tmp_path / "train.json").write_text(json.dumps(config))
    data = TrainConfig.from_file(tmp_path / "train.json").data
    assert (data.paths, data.weights) == (["/fsx/own_text_document", "/fsx/code_text_document"], [0.7, 0.3])
    args = megatron_lm.pretrain_gpt_args(load_spec("gpt3-7.5b-gpu", mix), "/fsx/own_text_document", "/ckpt")
    at = args.index("--data-path")
    assert args[at + 1:at + 6] == ["0.7", "/fsx/own_text_document", "0.3", "/fsx/code_text_document", "--split"]
    gpt = nxdt.nxdt_config(load_spec("megatron-gpt-6.7b", mix), "/fsx/own_text_document")
    assert gpt["data"]["data_prefix"] == [0.7, "/fsx/own_text_document", 0.3, "/fsx/code_text_document"]
    # without a blend, each reads its one dataset as before
    assert native.train_config(load_spec("tiny-local"), dataset="/d", run_dir=str(tmp_path), eod_id=0)["data"]["weights"] is None
    with pytest.raises(SpecError, match="data.blend: NxDT's Llama configs read one HF Arrow dataset"):
        load_spec("llama3-70b", mix)


def test_torchrun_waits_the_whole_stop_signal_lead_before_killing_the_ranks(monkeypatch):
    """torchrun forwards Slurm's stop signal and kills its ranks after a shutdown timeout (30 s by
    default): the checkpoint the signal asks for gets the whole lead Slurm was asked for."""
    from torch.distributed.run import config_from_args, get_args_parser

    from pretrain.presets import load_spec
    from render import native

    spec = load_spec("tiny-local", ["backend.native.save_before_limit_s=300"])
    for name, value in native.environment(spec).items():
        monkeypatch.setenv(name, value)
    args = get_args_parser().parse_args(["--nproc_per_node", "2", "-m", "trainer", "train"])
    assert config_from_args(args)[0].shutdown_timeout == 300


def test_each_rank_gets_its_share_of_the_tasks_cpus_as_threads_whatever_the_shell_exported(monkeypatch):
    from pretrain.presets import load_spec
    from render import native

    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the worker's shell: no job inherits it
    assert native.environment(load_spec("tiny-local"))["OMP_NUM_THREADS"] == "1"  # 2 CPUs, 2 ranks
    assert native.environment(load_spec("tiny-local", ["cluster.devices_per_node=1"]))["OMP_NUM_THREADS"] == "2"
    assert native.environment(load_spec("tiny-local", ["cluster.cpus_per_task=null"]))["OMP_NUM_THREADS"] == "1"


def test_the_warm_up_config_compiles_evaluation_and_writes_no_checkpoint(tmp_path):
    """precompile's short run: evaluation once (its graphs get compiled too), no checkpoint and no
    export (nothing resumes from it), a config the node program accepts."""
    import json

    from pretrain.presets import load_spec
    from render import native
    from trainer.train.config import TrainConfig

    spec = load_spec("tiny-local", [f"paths.root={tmp_path}", "training.checkpoint_interval=1"])
    warm = native.train_config(spec, dataset="/data/ds", run_dir=str(tmp_path / "warm"), eod_id=0, steps=2,
                               warmup_only=True)
    (tmp_path / "warm.json").write_text(json.dumps(warm))
    config = TrainConfig.from_file(tmp_path / "warm.json")
    assert not config.checkpoint.final and config.checkpoint.interval >= config.steps == 2
    assert config.export_hf is None and config.eval_interval == 2
    full = native.train_config(spec, dataset="/data/ds", run_dir=str(tmp_path / "run"), eod_id=0)
    assert full["checkpoint"] == {**full["checkpoint"], "final": True, "interval": 1}
