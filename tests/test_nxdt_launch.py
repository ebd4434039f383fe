"""NxDT launch rendering: every value the runbooks publish for the five Trainium presets
(aws-neuron/neuronx-distributed-training examples/conf/), the environment train.sh sets, and the
per-node torchrun line (its examples/train.sh and examples/train_setup.sh)."""

from __future__ import annotations

import pytest

from pretrain.presets import SpecError, load_spec
from render.nxdt import nxdt_config, torchrun_command, train_environment

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it


def at(config: dict, path: str):
    for part in path.split("."):
        config = config[part]
    return config


LLAMA3_70B_TRN1 = {
    "trainer.devices": 32, "trainer.num_nodes": 16, "trainer.max_steps": 30000, "trainer.log_every_n_steps": 10,
    "trainer.gradient_clip_val": 1.0, "trainer.val_check_interval": 30001, "trainer.limit_val_batches": 0.0,
    "trainer.num_sanity_val_steps": 0,
    "distributed_strategy.tensor_model_parallel_size": 32, "distributed_strategy.pipeline_model_parallel_size": 8,
    "distributed_strategy.virtual_pipeline_model_parallel_size": 1, "distributed_strategy.zero1": True,
    "distributed_strategy.sequence_parallel": True, "distributed_strategy.kv_replicator": 4,
    "distributed_strategy.context_parallel_size": 1,
    "data.micro_batch_size": 1, "data.global_batch_size": 1024,
    "data.train_dir": "/home/ubuntu/examples_datasets/wikicorpus_llama3_tokenized_8k",
    "model.model_config": "/home/ubuntu/config.json", "model.encoder_seq_length": 8192,
    "model.max_position_embeddings": 8192, "model.num_layers": 80, "model.hidden_size": 8192,
    "model.rope_theta": 500000.0, "model.qkv_linear": True, "model.fuse_qkv": True,
    "model.activations_checkpoint_granularity": "selective",
    "model.activations_checkpoint_recompute": ["CoreAttention", "LlamaMLP"],
    "model.fusions": {"softmax": True, "flash_attention": True},
    "model.optim.name": "adamw", "model.optim.lr": 1.5e-5, "model.optim.weight_decay": 0.1,
    "model.optim.betas": [0.9, 0.95], "model.optim.sched.name": "CosineAnnealing",
    "model.optim.sched.warmup_steps": 2000, "model.optim.sched.min_lr": 1e-6, "model.optim.sched.constant_steps": 0,
    "precision.type": "mixed_precision",
    "exp_manager.name": "hf_llama", "exp_manager.resume_if_exists": True,
    "exp_manager.resume_ignore_no_checkpoint": True, "exp_manager.checkpoint_callback_params.save_top_k": 1,
    "exp_manager.checkpoint_callback_params.monitor": "step", "exp_manager.checkpoint_callback_params.mode": "max",
    "exp_manager.checkpoint_callback_params.every_n_train_steps": 10,
    "exp_manager.checkpoint_callback_params.filename": "hf_llama3_70B--{step}-{consumed_samples}",
    "exp_manager.save_xser": True, "exp_manager.load_xser": True, "exp_manager.async_checkpointing": False,
    "exp_manager.log_parameter_norm": True, "exp_manager.log_gradient_norm": True,
    "exp_manager.resume_from_checkpoint": None, "exp_manager.log_local_rank_0_only": True,
    "compiler_flags": "--model-type transformer", "compiler_cache_url": "/home/ubuntu/neuron_cache",
    "aync_exec_max_inflight_requests": 5, "bucket_size_collectives": 1024, "neuron_rt_exec_timeout": 100,
    "neuron_experimental_compress_rg": False,
}
TRN2 = {**LLAMA3_70B_TRN1, "trainer.devices": 64, "trainer.num_nodes": 8, "trainer.lnc": 2,
        "trainer.sequential_move_factor": 32, "trainer.max_steps": 10000,
        "distributed_strategy.pipeline_model_parallel_size": 4,
        "model.pipeline_cuts": ["model.layers.18", "model.layers.39", "model.layers.60"],
        "model.activations_checkpoint_recompute": ["LlamaRMSNorm", "ActivationMultiplyMLP"],
        "model.fusions": {"flash_attention": True}, "precision.parallel_layers_reduce_dtype": "bf16",
        "exp_manager.checkpoint_callback_params.every_n_train_steps": 1000,
        "compiler_cache_url": "/workspace/neuron_cache"}
CP = {**LLAMA3_70B_TRN1, "distributed_strategy.context_parallel_size": 2,
      "model.fusions": {"softmax": True, "flash_attention": False, "ring_attention": True}}
GPT = {
    "model_source": "megatron", "trainer.devices": 32, "trainer.num_nodes": 1, "trainer.max_steps": 20000,
    "trainer.log_every_n_steps": 1, "trainer.val_check_interval": 20000, "trainer.limit_val_batches": 1,
    "trainer.limit_test_batches": 1, "distributed_strategy.tensor_model_parallel_size": 8,
    "distributed_strategy.pipeline_model_parallel_size": 1, "distributed_strategy.zero1": True,
    "distributed_strategy.sequence_parallel": True, "data.micro_batch_size": 1, "data.global_batch_size": 1024,
    "data.data_prefix": [1.0, "/data/my-gpt2_text_document"], "data.data_impl": "mmap",
    "data.splits_string": "980,10,10", "data.seq_length": 2048, "data.tokenizer.type": "GPT2BPETokenizer",
    "data.tokenizer.library": "megatron", "data.tokenizer.vocab_file": "/data/gpt2-vocab.json",
    "data.tokenizer.merge_file": "/data/gpt2-merges.txt", "model.attention_dropout": 0.1,
    "model.num_layers": 32, "model.hidden_size": 4096, "model.ffn_hidden_size": 16384,
    "model.num_attention_heads": 32, "model.num_kv_heads": 32, "model.position_embedding_type": "learned_absolute",
    "model.activation": "gelu", "model.normalization": "layernorm", "model.has_bias": True,
    "model.share_embeddings_and_output_weights": True, "model.hidden_dropout": 0.1, "model.init_method_std": 0.021,
    "model.make_vocab_size_divisible_by": 8, "model.optim.name": "adamw_fp32OptState", "model.optim.lr": 1.5e-4,
    "model.optim.weight_decay": 0.01, "model.optim.sched.name": "CosineAnnealing",
    "model.optim.sched.warmup_steps": 750, "model.optim.sched.constant_steps": 80000,
    "model.optim.sched.min_lr": 1e-5, "precision.type": "mixed_precision",
}
GPT_16NODE = {**GPT, "trainer.num_nodes": 16, "distributed_strategy.tensor_model_parallel_size": 32}


@pytest.mark.parametrize("preset, data, published", [
    ("llama3-70b", "/home/ubuntu/examples_datasets/wikicorpus_llama3_tokenized_8k", LLAMA3_70B_TRN1),
    ("llama3-70b-trn2", "/home/ubuntu/examples_datasets/wikicorpus_llama3_tokenized_8k", TRN2),
    ("llama3-70b-cp", "/home/ubuntu/examples_datasets/wikicorpus_llama3_tokenized_8k", CP),
    ("megatron-gpt-6.7b", "/data/my-gpt2_text_document", GPT),
    ("gpt3-6.7b-trn1-16node", "/data/my-gpt2_text_document", GPT_16NODE),
])
def test_rendered_config_holds_every_published_value(preset, data, published):
    config = nxdt_config(load_spec(preset), data)
    # The type counts too: Lightning reads limit_val_batches 1 as one batch and 1.0 as the whole set.
    wrong = {path: (at(config, path), value) for path, value in published.items()
             if (type(at(config, path)), at(config, path)) != (type(value), value)}
    assert wrong == {}
    if preset.startswith("gpt3") or preset.startswith("megatron"):
        assert "context_parallel_size" not in config["distributed_strategy"]


def test_continual_pretraining_loads_the_converted_weights_only():
    config = nxdt_config(load_spec("llama3-70b"), "/data", init_checkpoint="/fsx/pretrained_weight")
    assert config["exp_manager"]["resume_from_checkpoint"] == "/fsx/pretrained_weight/"
    assert config["model"]["weight_init_only"] is True and config["model"]["use_cpu_initialization"] is False


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
