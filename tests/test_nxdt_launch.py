"""NxDT launch rendering: continual pre-training, the spec's NxD rules, the environment train.sh
sets and the per-node torchrun line (aws-neuron/neuronx-distributed-training examples/train.sh and
examples/train_setup.sh). The confs against the published examples: tests/test_nxdt_upstream.py."""

from __future__ import annotations

import re

import pytest

from pretrain.presets import SpecError, load_spec
from render.nxdt import nxdt_config, torchrun_command, train_environment

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it


def test_continual_pretraining_loads_the_converted_weights_only():
    config = nxdt_config(load_spec("llama3-70b"), "/data", init_checkpoint="/fsx/pretrained_weight")
    assert config["exp_manager"]["resume_from_checkpoint"] == "/fsx/pretrained_weight/"
    assert config["model"]["weight_init_only"] is True and config["model"]["use_cpu_initialization"] is False
    # from scratch, as the example ships: initialised on the CPU, and no weight_init_only at all
    scratch = nxdt_config(load_spec("llama3-70b"), "/data")["model"]
    assert scratch["use_cpu_initialization"] is True and "weight_init_only" not in scratch


def test_a_spec_without_recompute_or_fusions_gets_its_familys_published_ones():
    # megatron_gpt_config.yaml recomputes CoreAttention and fuses softmax only; the Llama 3
    # examples also recompute LlamaMLP and use flash attention
    gpt, llama = load_spec("megatron-gpt-6.7b").backend.neuron, load_spec("llama3-70b").backend.neuron
    assert (gpt.activations_checkpoint_recompute, gpt.fusions) == (["CoreAttention"],
                                                                    {"softmax": True, "flash_attention": False})
    assert (llama.activations_checkpoint_recompute, llama.fusions) == (["CoreAttention", "LlamaMLP"],
                                                                        {"softmax": True, "flash_attention": True})
    # a spec that sets them keeps its own
    trn2 = load_spec("llama3-70b-trn2").backend.neuron
    assert (trn2.activations_checkpoint_recompute, trn2.fusions) == (["LlamaRMSNorm", "ActivationMultiplyMLP"],
                                                                      {"flash_attention": True})


@pytest.mark.parametrize("preset, override, message", [
    ("llama3-70b", "training.eval_iters=5", "training.eval_iters=5: NxDT's Llama configs validate on a separate"),
    ("megatron-gpt-6.7b", "parallel.zero1=false", "parallel.zero1=false: NxDT's Megatron GPT model refuses"),
    ("megatron-gpt-6.7b", "training.lr_decay_style=linear", "training.lr_decay_style=linear: NxDT's published"),
    ("llama3-70b", "backend.neuron.precision_type=bf16", "backend.neuron.precision_type"),
    ("llama3-70b", "backend.neuron.fusions={ring_attention: true}", "NxDT's Llama model reads fusions.flash_attention"),
    # NxDT reads only precision_type: an fp32 run the YAML would train in mixed precision
    ("llama3-70b", "training.precision=fp32", "training.precision=fp32 and backend.neuron.precision_type="
                                              "mixed_precision disagree, and NxDT reads only precision_type"),
    ("megatron-gpt-6.7b", "backend.neuron.precision_type=fp32", "training.precision=mixed_precision and "
                                                                "backend.neuron.precision_type=fp32 disagree"),
    # what NxDT's GPT model never reads
    ("megatron-gpt-6.7b", "parallel.kv_replicator=2", "parallel.kv_replicator=2: NxDT replicates KV heads in its "
                                                      "Llama attention only"),
    ("megatron-gpt-6.7b", "parallel.pipeline_cuts=[model.layers.10]", "only NxDT's Llama model places its stages"),
])
def test_what_nxdt_would_refuse_is_refused_with_the_field_named(preset, override, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(preset, [override])


def test_gpt_with_context_parallelism_is_refused_on_nxdt():
    # ring attention is NxDT's Llama model's; cp 2 halves dp, so the global batch still divides
    with pytest.raises(SpecError, match=r"parallel.cp=2: NxDT's Megatron GPT model has no context parallelism"):
        load_spec("megatron-gpt-6.7b", ["parallel.cp=2", "backend.neuron.fusions={ring_attention: true}"])


def test_context_parallel_without_ring_attention_is_rejected():
    with pytest.raises(SpecError, match="ring_attention"):
        load_spec("llama3-70b", ["parallel.cp=2", "training.global_batch_size=1024"])


@pytest.mark.parametrize("cuts, message", [
    ("[model.layers.18, layers.39, model.layers.60]", "'layers.39' is not a layer name of the form model.layers.N"),
    ("[model.layers.39, model.layers.18, model.layers.60]", "model.layers.18 does not come after model.layers.39"),
    ("[model.layers.18, model.layers.18, model.layers.60]", "model.layers.18 does not come after model.layers.18"),
    ("[model.layers.18, model.layers.39, model.layers.80]",
     "model.layers.80 is beyond the last layer, model.layers.79"),
])
def test_pipeline_cuts_nxd_cannot_place_are_rejected(cuts, message):
    with pytest.raises(SpecError, match=f"parallel.pipeline_cuts: {message}"):
        load_spec("llama3-70b-trn2", [f"parallel.pipeline_cuts={cuts}"])


def test_layers_not_divisible_by_pp_are_left_to_nxds_automatic_partition():
    # NxD puts the remainder on the last stages (``create_partitions`` in aws-neuron/neuronx-distributed
    # src/neuronx_distributed/pipeline/partition.py), the converter too.
    spec = load_spec("llama3-70b", ["parallel.pp=3", "cluster.nodes=12"])   # 80 layers = 26 + 27 + 27
    assert "pipeline_cuts" not in nxdt_config(spec, "/data")["model"]
    # Megatron-LM needs equal stages, and pipeline_cuts are NxDT's: they do not excuse uneven ones.
    for extra in ([], ["parallel.pipeline_cuts=[model.layers.20]"]):
        with pytest.raises(SpecError, match="model.num_layers=35 is not divisible by parallel.pp=2: change pp"):
            load_spec("gpt3-7.5b-gpu", ["model.num_layers=35", "parallel.pp=2", *extra])


def test_train_sh_environment_and_torchrun_line():
    # train_setup.sh's Slurm branch and what it sets in all branches (aws-neuron/neuronx-distributed-training
    # examples/train_setup.sh)
    assert train_environment() == {
        "FI_EFA_USE_DEVICE_RDMA": "1", "FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1",
        "XLA_DISABLE_FUNCTIONALIZATION": "0", "HYDRA_FULL_ERROR": "1", "MASTER_PORT": "41000",
        "MALLOC_ARENA_MAX": "128", "CREATE_TB_LOGGER": "True", "CHECKPOINT_CALLBACK": "True",
        "NEMO_EXPM_VERSION": "$SLURM_JOB_ID", "EXPLICIT_LOGDIR": "null"}
    line = torchrun_command(load_spec("llama3-70b-trn2"), "hf_llama3_70B_trn2_config")
    assert line[:12] == ["torchrun", "--nproc_per_node", "64", "--nnodes", "$NNODES", "--node_rank", "$NODE_RANK",
                         "--master_addr", "$MASTER_ADDR", "--master_port", "41000", "training_orchestrator.py"]
    assert "--config-name=hf_llama3_70B_trn2_config" in line and "trainer.devices=64" in line


def test_precompile_wraps_the_same_launch_with_per_node_cache_and_retry():
    from render.nxdt import precompile_command, precompile_environment

    spec = load_spec("llama3-70b")
    line = precompile_command(spec, "hf_llama3_70B_config")
    assert line[0] == "neuron_parallel_compile" and line[1:-1] == torchrun_command(spec, "hf_llama3_70B_config")
    assert line[-1] == "trainer.max_steps=10"
    shared = precompile_environment(spec, per_node_cache=False, retry_failed=False)
    assert shared["NEURON_COMPILE_CACHE_URL"] == "/home/ubuntu/neuron_cache" and shared["COMPILE"] == "1"
    assert shared["NEURON_PARALLEL_COMPILE_DUMP_RESULTS"] == "1" and "NEURON_CC_FLAGS" not in shared
    retry = precompile_environment(spec, per_node_cache=True, retry_failed=True)
    assert retry["NEURON_COMPILE_CACHE_URL"] == "/home/ubuntu/neuron_cache/node-$NODE_RANK"
    assert retry["NEURON_CC_FLAGS"] == "--retry_failed_compilation"


def test_the_16_node_gpt3_preset_renders_the_tutorial_scripts_values():
    # aws-neuron/aws-neuron-reference-for-megatron-lm examples/pretrain_gpt3_6.7B_32layers_bf16_bs1024_slurm.sh;
    # docs/gpt3-6.7b-tutorial.md
    spec = load_spec("gpt3-6.7b-trn1-16node")
    assert (spec.world_size, spec.dp, spec.grad_accumulation) == (512, 64, 16)
    config = nxdt_config(spec, "/data/my-gpt2_text_document")
    model, optim, trainer = config["model"], config["model"]["optim"], config["trainer"]
    assert config["distributed_strategy"]["tensor_model_parallel_size"] == 8 and trainer["num_nodes"] == 16
    assert (trainer["max_steps"], trainer["gradient_clip_val"], trainer["limit_val_batches"]) == (143051, 1.0, 0.0)
    assert (optim["lr"], optim["weight_decay"], optim["betas"]) == (1.2e-4, 0.1, [0.9, 0.95])
    # cosine to 1.2e-5 over --lr-decay-iters 123977: NeMo decays over max_steps - constant - warm-up
    sched = optim["sched"]
    assert (sched["name"], sched["min_lr"], sched["warmup_steps"]) == ("CosineAnnealing", 1.2e-5, 155)
    assert trainer["max_steps"] - sched["constant_steps"] == 123977
    assert model["init_method_std"] == 0.006
    assert model["hidden_dropout"] == model["attention_dropout"] == model["ffn_dropout"] == 0.0
    assert config["precision"]["type"] == "bf16SR" and config["neuron_rt_exec_timeout"] == 600
    checkpoints = config["exp_manager"]["checkpoint_callback_params"]
    assert (checkpoints["every_n_train_steps"], checkpoints["save_top_k"]) == (2000, 1)
    assert config["data"]["splits_string"] == "100,0,0"


def test_gpt_init_std_and_dropout_default_to_the_published_config_and_llama_refuses_them():
    model = nxdt_config(load_spec("megatron-gpt-6.7b"), "/data")["model"]
    assert (model["init_method_std"], model["hidden_dropout"], model["ffn_dropout"]) == (0.021, 0.1, 0.1)
    model = nxdt_config(load_spec("megatron-gpt-6.7b", ["backend.neuron.dropout=0.05"]), "/data")["model"]
    assert model["attention_dropout"] == 0.05
    with pytest.raises(SpecError, match=re.escape("backend.neuron.init_method_std: NxDT's Llama model takes its "
                                                  "init std and dropout from the config.json")):
        load_spec("llama3-70b", ["backend.neuron.init_method_std=0.01"])
    assert load_spec("llama3-70b").backend.neuron.dropout is None
