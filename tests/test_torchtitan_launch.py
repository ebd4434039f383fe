"""torchtitan launch rendering, checked by torchtitan 0.3.0's own parser: the rendered arguments go
through ``ConfigManager.parse_args`` (the registry function, tyro's overrides, and
``Trainer.Config``'s own validation), and the config it builds is compared with the spec."""

from __future__ import annotations

import pytest

from torchtitan.config import manager as config_manager
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

from pretrain.presets import SpecError, load_spec
from render.torchtitan import metrics_rank, torchrun_command, train_args
from tasks.dry_run import render_files

pytestmark = pytest.mark.pure


def parsed(spec, init_from: str | None = "/fsx/Llama-3.1-8B"):
    return config_manager.ConfigManager().parse_args(train_args(spec, "/fsx/c4", "/fsx/run", init_from))


def test_llama3_8b_gpu_is_torchtitans_published_h100_configuration():
    config = parsed(load_spec("llama3-8b-gpu"))
    p, t, c = config.parallelism, config.training, config.checkpoint
    assert (p.data_parallel_shard_degree, p.data_parallel_replicate_degree, p.tensor_parallel_degree) == (8, 1, 1)
    assert (t.local_batch_size, t.global_batch_size, t.seq_len, t.steps) == (2, 16, 8192, 1000)
    assert config.compile.enable and config.compile.backend == "inductor"
    assert isinstance(config.activation_checkpoint, SelectiveAC.Config)
    assert config.optimizer.param_groups[0].optimizer_kwargs["lr"] == 3e-4
    assert (c.enable, c.folder, c.interval, c.async_mode, c.keep_latest_k) == (True, "/fsx/run/checkpoints", 500, "async", 3)
    # HF weights straight into the model, only while the run has no checkpoint of its own
    assert (c.initial_load_path, c.initial_load_in_hf, c.initial_load_model_only) == ("/fsx/Llama-3.1-8B", True, True)
    assert (config.dataloader.dataset, config.dataloader.dataset_path) == ("c4_test", "/fsx/c4")
    assert not config.validator.enable


def test_llama3_70b_gpu_fsdp_times_tp_and_full_checkpointing():
    config = parsed(load_spec("llama3-70b-gpu"), init_from=None)
    p = config.parallelism
    assert (p.data_parallel_shard_degree, p.tensor_parallel_degree) == (32, 8)
    assert config.training.local_batch_size == 16 and config.training.global_batch_size == 512
    assert isinstance(config.activation_checkpoint, FullAC.Config)
    assert config.checkpoint.initial_load_path is None


def test_the_tiny_shape_renders_as_torchtitans_debug_model_on_one_gpu():
    """torchtitan's own test model (llama3_debugmodel): the shape a first launch on one GPU runs."""
    tiny = ["backend.torchtitan.flavour=debugmodel", "model.num_layers=6", "model.hidden_size=256",
            "model.num_attention_heads=16", "model.num_kv_heads=16", "model.vocab_size=2048", "model.seq_length=2048",
            "cluster.devices_per_node=1", "training.global_batch_size=8", "training.micro_batch_size=8",
            "training.train_steps=10", "backend.torchtitan.compile=false"]
    config = parsed(load_spec("llama3-8b-gpu", tiny), init_from=None)
    model = config.model_spec.model
    assert (config.model_spec.flavor, model.dim, len(model.layers), model.vocab_size) == ("debugmodel", 256, 6, 2048)
    assert model.layers[0].attention.n_heads == 16
    assert (config.parallelism.data_parallel_shard_degree, config.training.local_batch_size,
            config.training.steps, config.compile.enable) == (1, 8, 10, False)
    # a shape the flavour does not have is refused, naming the flavour's
    with pytest.raises(SpecError, match="flavour=debugmodel is a Llama 3 of 6 layers, hidden 256"):
        load_spec("llama3-8b-gpu", [*tiny, "model.num_layers=4"])


def test_hsdp_pipeline_and_context_parallel_degrees():
    spec = load_spec("llama3-70b-gpu", ["backend.torchtitan.data_parallel_replicate=2", "parallel.pp=2", "parallel.cp=2",
                                        "backend.torchtitan.pipeline_schedule=Interleaved1F1B",
                                        "training.global_batch_size=128"])
    p = parsed(spec).parallelism
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree,
            p.pipeline_parallel_degree, p.context_parallel_degree) == (2, 4, 8, 2, 2)
    assert 2 * 4 * 8 * 2 * 2 == spec.world_size and p.pipeline_parallel_schedule == "Interleaved1F1B"
    # the loss is on the last stage: its first rank prints the step lines, local rank 0 of node 16
    assert metrics_rank(spec) == 128
    assert torchrun_command(spec, "/d", "/r")[torchrun_command(spec, "/d", "/r").index("--local-ranks-filter") + 1] == "0"


def test_trn2_torchneuron_renders_a_rank_per_neuroncore_and_the_neuron_compiler():
    spec = load_spec("llama3-70b-trn2-torchneuron")
    line = torchrun_command(spec, "/d", "/r")
    assert line[line.index("--nproc_per_node") + 1] == "64" and spec.world_size == 512
    args = train_args(spec, "/d", "/r")
    assert args[args.index("--module") + 1] == "torchtitan_neuron.models.llama3"
    assert args[args.index("--compile.backend") + 1] == "neuron"
    # the fork is not installed here: its arguments are checked against upstream's llama3 module
    args[args.index("--module") + 1] = "llama3"
    config = config_manager.ConfigManager().parse_args(args)
    assert (config.parallelism.tensor_parallel_degree, config.parallelism.data_parallel_shard_degree) == (4, 128)


@pytest.mark.parametrize("override, message", [
    (["cluster.nodes=3"], "global_batch_size=512 is not divisible"),
    (["cluster.nodes=1", "cluster.devices_per_node=4"], "not a multiple of parallel.tp"),
    (["backend.torchtitan.data_parallel_replicate=3"], "data_parallel_replicate=3 does not divide"),
    (["model.num_layers=40"], "flavour=70B is a Llama 3 of 80 layers"),
    (["backend.torchtitan.checkpoint_keep=1"], "checkpoint_keep=1"),
    (["backend.torchtitan.pipeline_schedule=Zigzag"], "pipeline_schedule='Zigzag'"),
    (["data.json_keys=[body]"], "data.json_keys"),
])
def test_what_torchtitan_would_refuse_fails_before_anything_is_queued(override, message):
    with pytest.raises(SpecError, match=message):
        load_spec("llama3-70b-gpu", override)


def test_dry_run_shows_the_launch():
    files = render_files(load_spec("llama3-8b-gpu", ["model.init_from=hf://meta-llama/Llama-3.1-8B"]))
    assert "-m torchtitan.train --module llama3 --config llama3_8b" in files["torchrun.sh"]
    assert "--checkpoint.initial-load-in-hf" in files["torchrun.sh"] and "sbatch_train.sh" in files
    assert "hf://" not in files["torchrun.sh"]  # fetch brings the Hub's files to the shared disk first


def test_the_trainium_dry_run_renders_no_precompile_job():
    """AWS documents no ahead-of-time compile for TorchNeuron (docs/render.md): the dry run shows
    the training job alone, the plan the reason (tests/test_plan.py)."""
    files = render_files(load_spec("llama3-70b-trn2-torchneuron"))
    assert "sbatch_train.sh" in files and "torchrun.sh" in files
    assert not [name for name in files if "precompile" in name], sorted(files)
