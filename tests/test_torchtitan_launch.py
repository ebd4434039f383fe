"""torchtitan launch rendering, checked by torchtitan 0.3.0's own parser: the rendered arguments go
through ``ConfigManager.parse_args`` (the registry function, tyro's overrides, and
``Trainer.Config``'s own validation), and the config it builds is compared with the spec."""

from __future__ import annotations

import pytest
import torch
from torchtitan.config import manager as config_manager
from torchtitan.distributed.utils import clip_grad_norm_
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.components.quantization.utils import module_filter_fn
from torchtitan.models.common import Linear
from torchtitan.models.llama3 import config_registry, model_registry

from pretrain.presets import SpecError, load_spec
from pretrain.spec import TORCHTITAN_FLAVOURS, TORCHTITAN_PUBLISHED, TORCHTITAN_ROPE_THETA, RopeScaling, flavour_overrides
from trainer import torchtitan_configs
from render.torchtitan import metrics_rank, torchrun_command, train_args
from flows.dry_run import render_files

pytestmark = pytest.mark.pure


# The 70B preset trains in float8, whose converter torchtitan builds as it loads the config: on
# this CPU machine it refuses (test_float8_...), so the other checks parse the preset in bf16.
BF16 = "backend.torchtitan.float8=false"


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
    assert load_spec("llama3-70b-gpu").backend.torchtitan.registry == ("trainer.torchtitan_configs", "llama3_70b_float8")
    config = parsed(load_spec("llama3-70b-gpu", [BF16]), init_from=None)
    p = config.parallelism
    assert (p.data_parallel_shard_degree, p.tensor_parallel_degree) == (32, 8)
    assert config.training.local_batch_size == 16 and config.training.global_batch_size == 512
    assert isinstance(config.activation_checkpoint, FullAC.Config)
    assert config.checkpoint.initial_load_path is None


def test_the_tiny_shape_renders_as_torchtitans_debug_model_on_one_gpu():
    """torchtitan's own test model (llama3_debugmodel): the shape a first launch on one GPU runs."""
    tiny = ["backend.torchtitan.flavour=debugmodel", "model.num_layers=6", "model.hidden_size=256",
            "model.num_attention_heads=16", "model.num_kv_heads=16", "model.vocab_size=2048",
            "model.ffn_hidden_size=768", "model.seq_length=2048",
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


def test_the_flavour_shapes_the_spec_checks_are_torchtitans():
    for flavour, (layers, hidden, heads, kv_heads, vocab, ffn) in TORCHTITAN_FLAVOURS.items():
        model = model_registry(flavour).model
        attention, feed_forward = model.layers[0].attention, model.layers[0].feed_forward
        assert (len(model.layers), model.dim, attention.n_heads, attention.n_kv_heads or attention.n_heads,
                model.vocab_size, feed_forward.w1.out_features) == (layers, hidden, heads, kv_heads, vocab, ffn), flavour
        # the RoPE the spec insists on: base 500,000 with Llama 3.1's scaling at RopeScaling's factors
        rope, scaling = attention.rope, RopeScaling()
        assert (rope.theta, rope.scaling, rope.scaling_factor, rope.low_freq_factor, rope.high_freq_factor,
                rope.original_max_position_embeddings) == (
            TORCHTITAN_ROPE_THETA, "llama", scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
            scaling.original_max_position_embeddings), flavour
    # the functions the spec takes from torchtitan are there, and this project's shadow none of them
    assert all(callable(getattr(config_registry, name)) for name in TORCHTITAN_PUBLISHED)
    own = [name for name in vars(torchtitan_configs) if name.startswith("llama3_")]
    assert own and not [name for name in own if hasattr(config_registry, name)]


def test_the_1b_flavour_has_no_torchtitan_function_and_trains_through_this_projects():
    """The ~1B Llama the MFU target is set for: torchtitan 0.3.0 has its model (Llama 3.2 1B's
    shape) but no config function, so the launch names trainer/torchtitan_configs.py's, which is
    torchtitan's llama3_8b with that model; the spec's settings apply on top."""
    spec = load_spec("llama3-8b-gpu", [*flavour_overrides("1B"), "cluster.devices_per_node=1", "training.global_batch_size=4",
                                       "training.micro_batch_size=4", "model.seq_length=2048"])
    assert spec.backend.torchtitan.registry == ("trainer.torchtitan_configs", "llama3_1b")
    config = parsed(spec, init_from=None)
    assert (config.model_spec.flavor, config.model_spec.model.dim, len(config.model_spec.model.layers)) == ("1B", 2048, 16)
    assert config.loss.loss_fn.global_vocab_size == 128256
    assert (config.training.local_batch_size, config.training.seq_len, config.parallelism.data_parallel_shard_degree) == (4, 2048, 1)
    with torch.device("meta"):
        model = config.model_spec.model.build()
    # 1.24 billion: the output projection shares the embedding's weights
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 1.24
    # the published flavours keep torchtitan's own function
    assert load_spec("llama3-8b-gpu").backend.torchtitan.registry == ("llama3", "llama3_8b")


def test_float8_goes_through_torchtitans_float8_converter_and_only_where_it_runs():
    assert load_spec("llama3-8b-gpu", ["backend.torchtitan.float8=true"]).backend.torchtitan.registry == (
        "trainer.torchtitan_configs", "llama3_8b_float8")
    tiny = load_spec("llama3-8b-gpu", [*flavour_overrides("debugmodel"), "backend.torchtitan.float8=true"])
    assert tiny.backend.torchtitan.registry == ("llama3", "llama3_debugmodel_float8")  # torchtitan's own
    # what torchtitan's converter would swap, by its own filter: every Linear of the decoder's
    # layers, not the output projection
    linears = torchtitan_configs.float8_linears()
    assert linears.recipe_name == "rowwise"
    converted = {fqn.split(".")[-1] if fqn.startswith("layers.") else fqn
                 for fqn, config, _, _ in model_registry("8B").model.traverse(Linear.Config)
                 if module_filter_fn(config, fqn, linears.filter_fqns)}
    assert converted == {"wqkv", "wo", "w1", "w2", "w3"}, converted
    # torchtitan builds the converter as it loads the function: on this CPU machine it refuses,
    # in its own words, for want of torchao or of a GPU of compute capability 8.9
    with pytest.raises((ImportError, ValueError), match="torchao is not installed|SM89"):
        parsed(load_spec("llama3-8b-gpu", ["backend.torchtitan.float8=true"]))
    with pytest.raises(SpecError, match="float8 needs device=cuda"):
        load_spec("llama3-70b-trn2-torchneuron", ["backend.torchtitan.float8=true"])


def test_hsdp_pipeline_and_context_parallel_degrees():
    spec = load_spec("llama3-70b-gpu", [BF16, "backend.torchtitan.data_parallel_replicate=2", "parallel.pp=2", "parallel.cp=2",
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
    # what torchtitan would train otherwise, silently: its model comes from the flavour (or the
    # config function)
    (["model.ffn_hidden_size=20000"], "feed-forward 28672"),
    (["model.rope_theta=10000"], "every torchtitan Llama 3 flavour has RoPE base 500000 with Llama 3.1's scaling"),
    (["model.rope_scaling=null"], "set model.rope_theta=500000 and model.rope_scaling"),
    (["backend.torchtitan.config=llama3_8b"], "config='llama3_8b' with float8=true: the config function decides"),
    ([BF16, "backend.torchtitan.config=llama3_8b"], "config='llama3_8b' trains a 8b model, not flavour=70B"),
    # validation reads the held-out share of data.split (test_evaluation_...); there is no test set
    (["training.eval_iters=10"], "data.split='100,0,0' has no validation data .* torchtitan has no held-out files"),
    (["data.split=90,9,1"], "torchtitan trains and validates, and has no test set; set the test weight to 0, "
                            "e.g. data.split='90,10,0'"),
    (["tokenizer.append_eod=false"], "torchtitan's loader ends every document with the tokenizer's end-of-text"),
    # pipeline schedules, as torchtitan and torch.distributed.pipelining refuse them at the first step
    (["parallel.pp=2", "training.micro_batch_size=1"], "1F1B needs at least pp microbatches a step"),
    (["parallel.pp=2", "backend.torchtitan.pipeline_schedule=Interleaved1F1B", "training.micro_batch_size=5",
      "training.global_batch_size=80"], "Interleaved1F1B needs the 5 microbatches a step to split evenly into its 2 rounds"),
    (["parallel.pp=2", "training.micro_batch_size=6", "training.global_batch_size=96",
      "backend.torchtitan.pipeline_microbatch_size=4"], "micro_batch_size=6 is not divisible"),
    (["parallel.tp=1", "parallel.pp=64", "backend.torchtitan.pipeline_schedule=Interleaved1F1B",
      "training.micro_batch_size=128", "training.global_batch_size=512"], "128 stages .2 a rank. for 80 layers"),
])
def test_what_torchtitan_would_refuse_fails_before_anything_is_queued(override, message):
    with pytest.raises(SpecError, match=message):
        load_spec("llama3-70b-gpu", override)


def test_evaluation_renders_torchtitans_validator_on_the_held_out_files():
    """training.eval_interval and eval_iters as torchtitan 0.3.0's validator reads them (freq and
    steps of ``Validator.Config`` in torchtitan/components/validate.py), on the folder the train task
    holds the split's validation files out into, read by the loader entry training reads with."""
    config = parsed(load_spec("llama3-8b-gpu", ["data.split=95,5,0", "training.eval_interval=250",
                                                "training.eval_iters=20"]))
    v = config.validator
    assert (v.enable, v.freq, v.steps) == (True, 250, 20)
    assert (v.dataloader.dataset, v.dataloader.dataset_path) == ("c4_test", "/fsx/run/validation")
    assert config.dataloader.dataset_path == "/fsx/c4"
    # benchmark mode validates nothing (training.eval_batches); nor does a held-out share without
    # eval_iters: its files are still held out
    for overrides in (["training.eval_iters=20", "training.benchmark=true"], []):
        assert not parsed(load_spec("llama3-8b-gpu", ["data.split=95,5,0", *overrides])).validator.enable


def test_dry_run_shows_the_launch():
    files = render_files(load_spec("llama3-8b-gpu", ["model.init_from=hf://meta-llama/Llama-3.1-8B"]))
    assert "-m torchtitan.train --module llama3 --config llama3_8b" in files["torchrun.sh"]
    assert "--checkpoint.initial-load-in-hf" in files["torchrun.sh"] and "sbatch_train.sh" in files
    assert "hf://" not in files["torchrun.sh"]  # fetch brings the Hub's files to the shared disk first
    # a job sees only the GPUs it asks Slurm for; TorchNeuron's ranks are NeuronCores, no GRES
    assert "#SBATCH --gpus-per-node=8" in files["sbatch_train.sh"]
    assert "--gpus-per-node" not in render_files(load_spec("llama3-70b-trn2-torchneuron"))["sbatch_train.sh"]


def test_torchtitan_cuts_uneven_pipeline_stages_itself():
    """80 layers over 3 stages of 1F1B: torchtitan weighs the embedding and the output as a layer
    each and cuts 82 into 27, 27 and 28, so the spec takes a pp that does not divide the layers."""
    spec = load_spec("llama3-70b-gpu", [BF16, "cluster.nodes=3", "parallel.tp=8", "parallel.pp=3", "training.micro_batch_size=4",
                                        "training.global_batch_size=32"])
    p = parsed(spec, init_from=None).parallelism
    assert (p.pipeline_parallel_degree, p.pipeline_parallel_schedule, p.pipeline_parallel_microbatch_size) == (3, "1F1B", 1)


def test_the_trainium_dry_run_renders_no_precompile_job():
    """AWS documents no ahead-of-time compile for TorchNeuron (docs/render.md): the dry run shows
    the training job alone, the plan the reason (tests/test_plan.py)."""
    files = render_files(load_spec("llama3-70b-trn2-torchneuron"))
    assert "sbatch_train.sh" in files and "torchrun.sh" in files
    assert not [name for name in files if "precompile" in name], sorted(files)


def test_the_training_settings_reach_torchtitan_as_the_other_backends_read_them():
    """A gradient clip of 0 means none, as for the other backends (torchtitan clips at every step,
    and a max norm of 0 would zero every gradient); the Adam betas and the precision are the spec's."""
    config = parsed(load_spec("llama3-8b-gpu", ["training.grad_clip=0", "training.adam_betas=[0.9, 0.999]",
                                                "training.precision=fp32"]))
    assert config.training.max_norm == float("inf")
    assert config.optimizer.param_groups[0].optimizer_kwargs["betas"] == (0.9, 0.999)
    assert config.training.mixed_precision_param == "float32"
    published = parsed(load_spec("llama3-8b-gpu"))
    assert published.training.max_norm == 1.0 and published.training.mixed_precision_param == "bfloat16"
    assert published.optimizer.param_groups[0].optimizer_kwargs["betas"] == (0.9, 0.95)
    # and a clip of 0 leaves gradients as they are, through torchtitan's own clipping
    grads = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.full((2,), 2.0))]
    for param in grads:
        param.grad = param.detach().clone()
    norm = clip_grad_norm_(grads, config.training.max_norm, foreach=True)
    assert norm.item() == pytest.approx(11 ** 0.5)  # reported, as under a real clip
    assert grads[0].grad.tolist() == [1.0, 1.0, 1.0] and grads[1].grad.tolist() == [2.0, 2.0]
