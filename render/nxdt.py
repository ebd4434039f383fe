"""NxD Training launch files from the spec: the conf YAML that ``training_orchestrator.py``
reads, the environment that ``train.sh``/``train_setup.sh`` set, and the per-node torchrun line
(``examples/train.sh``, ``examples/train_setup.sh``, ``examples/training_orchestrator.py`` and
``examples/conf/`` in aws-neuron/neuronx-distributed-training; docs/render.md).

The YAML holds every value the runbooks publish, taken from the one spec that also renders the
conversion flags, so the two cannot disagree.
"""

from __future__ import annotations

from typing import Any

from pretrain.spec import PretrainSpec
from render.dataset_files import blend, gpt2_bpe_files

MASTER_PORT = 41000  # train_setup.sh's fixed rendezvous port


def _common(spec: PretrainSpec, init_checkpoint: str | None) -> dict[str, Any]:
    n, t, p = spec.backend.neuron, spec.training, spec.parallel
    trainer: dict[str, Any] = {
        "devices": spec.cluster.devices_per_node, "num_nodes": spec.cluster.nodes, "max_epochs": -1,
        "max_steps": t.train_steps, "log_every_n_steps": n.log_every_n_steps,
        "val_check_interval": t.eval_interval, "check_val_every_n_epoch": None,
        # Lightning reads an int as a number of batches and a float as a fraction of the set:
        # eval_iters batches, or 0.0 (none, as the 70B yamls publish it).
        "num_sanity_val_steps": 0, "limit_val_batches": t.eval_iters or 0.0,
        "limit_test_batches": t.eval_iters or 0.0, "gradient_clip_val": t.grad_clip,
    }
    if n.instance_type == "trn2":
        trainer["lnc"] = n.lnc
        if n.sequential_move_factor:
            trainer["sequential_move_factor"] = n.sequential_move_factor
    strategy: dict[str, Any] = {
        "tensor_model_parallel_size": p.tp, "pipeline_model_parallel_size": p.pp,
        "virtual_pipeline_model_parallel_size": 1, "zero1": p.zero1, "sequence_parallel": p.sequence_parallel,
        "kv_replicator": p.kv_replicator,
    }
    if spec.model.family == "llama":  # the hf_llama3 yamls carry it (1 on trn1), the GPT yaml does not
        strategy["context_parallel_size"] = p.cp
    exp_manager = {
        "log_local_rank_0_only": True, "create_tensorboard_logger": True, "explicit_log_dir": None,
        "exp_dir": None, "name": _name(spec), "resume_if_exists": True, "resume_ignore_no_checkpoint": True,
        "create_checkpoint_callback": True,
        "checkpoint_callback_params": {
            "monitor": "step", "save_top_k": 1, "mode": "max", "save_last": False,
            "filename": n.checkpoint_filename or f"{spec.name}--{{step}}-{{consumed_samples}}",
            "every_n_train_steps": t.checkpoint_interval, "use_master_weights_in_ckpt": False},
        "log_parameter_norm": True, "log_gradient_norm": True, "enable_recovery_time_instrumentation": False,
        "save_xser": n.save_xser, "load_xser": n.save_xser, "save_bf16": False,
        "async_checkpointing": n.async_checkpointing,
        # Continual pre-training: the converted weights (the trailing slash makes the tag "").
        "resume_from_checkpoint": f"{init_checkpoint.rstrip('/')}/" if init_checkpoint else None,
    }
    precision: dict[str, Any] = {"type": n.precision_type}
    if n.parallel_layers_reduce_dtype:
        precision["parallel_layers_reduce_dtype"] = n.parallel_layers_reduce_dtype
    if n.xla_downcast_bf16 is not None:
        precision["xla_downcast_bf16"] = n.xla_downcast_bf16
    return {"name": _name(spec), "model_source": "hf" if spec.model.family == "llama" else "megatron",
            "seed": t.seed, "trainer": trainer, "exp_manager": exp_manager, "distributed_strategy": strategy,
            "precision": precision, "compiler_flags": n.compiler_flags, "compiler_cache_url": n.compiler_cache_url,
            # sic: NxDT spells the key this way
            "aync_exec_max_inflight_requests": n.async_exec_max_inflight_requests,
            "bucket_size_collectives": n.bucket_size_collectives,
            "neuron_rt_exec_timeout": n.neuron_rt_exec_timeout,
            "neuron_experimental_compress_rg": n.neuron_experimental_compress_rg}


def _name(spec: PretrainSpec) -> str:
    return "hf_llama" if spec.model.family == "llama" else "megatron_gpt"


def _optim(spec: PretrainSpec, name: str) -> dict[str, Any]:
    t = spec.training
    return {"name": name, "lr": t.lr, "weight_decay": t.weight_decay, "capturable": False,
            "betas": list(t.adam_betas),
            "sched": {"name": "CosineAnnealing" if t.lr_decay_style == "cosine" else "LinearAnnealing",
                      "warmup_steps": t.warmup_steps, "max_steps": t.train_steps, "min_lr": t.min_lr,
                      "constant_steps": spec.backend.neuron.lr_constant_steps}}


def _llama(spec: PretrainSpec, data_dir: str, init_checkpoint: str | None) -> dict[str, Any]:
    m, n, t = spec.model, spec.backend.neuron, spec.training
    model: dict[str, Any] = {
        "model_config": n.hf_config, "encoder_seq_length": m.seq_length,
        "max_position_embeddings": m.max_position_embeddings, "num_layers": m.num_layers,
        "hidden_size": m.hidden_size, "qkv_linear": m.qkv_linear, "fuse_qkv": m.fuse_qkv, "rope_theta": m.rope_theta,
        "persistent_workers": False, "transformer_engine": False,
        "use_cpu_initialization": init_checkpoint is None, "weight_init_only": init_checkpoint is not None,
        "activations_checkpoint_granularity": "selective",
        "activations_checkpoint_recompute": list(n.activations_checkpoint_recompute),
        "fusions": dict(n.fusions), "do_layer_norm_weight_decay": True, "optim": _optim(spec, "adamw")}
    if spec.parallel.pipeline_cuts:
        model["pipeline_cuts"] = list(spec.parallel.pipeline_cuts)
    data = {"micro_batch_size": t.micro_batch_size, "global_batch_size": t.global_batch_size,
            "train_dir": data_dir, "val_dir": None, "dev_choose_samples": None, "seq_length": m.seq_length,
            "tokenizer": {"type": spec.tokenizer.path}}
    return {"data": data, "model": model}


def _gpt(spec: PretrainSpec, data_prefix: str) -> dict[str, Any]:
    m, t = spec.model, spec.training
    vocab, merges = gpt2_bpe_files(spec, data_prefix)
    data = {"micro_batch_size": t.micro_batch_size, "global_batch_size": t.global_batch_size,
            "data_prefix": [x for pair in blend(spec, data_prefix) for x in pair], "data_impl": "mmap", "splits_string": spec.data.split,
            "seq_length": m.seq_length,
            "tokenizer": {"library": "megatron", "type": "GPT2BPETokenizer", "vocab_file": vocab,
                          "merge_file": merges}}
    model = {"encoder_seq_length": m.seq_length, "max_position_embeddings": m.max_position_embeddings,
             "num_layers": m.num_layers, "hidden_size": m.hidden_size, "ffn_hidden_size": m.ffn_hidden_size,
             "num_attention_heads": m.num_attention_heads, "num_kv_heads": m.kv_heads,
             "position_embedding_type": "learned_absolute", "activation": "gelu", "normalization": "layernorm",
             "has_bias": True, "share_embeddings_and_output_weights": True, "hidden_dropout": 0.1,
             "attention_dropout": 0.1, "init_method_std": 0.021, "make_vocab_size_divisible_by": 8,
             "optim": _optim(spec, "adamw_fp32OptState")}
    return {"data": data, "model": model}


def nxdt_config(spec: PretrainSpec, data: str, init_checkpoint: str | None = None) -> dict[str, Any]:
    """The NxDT conf YAML as a dict. ``data`` is the tokenized dataset (HF Arrow directory for
    Llama, Megatron prefix for GPT); ``init_checkpoint`` the converted weights to continue from."""
    if spec.backend.kind != "neuron" or spec.backend.neuron is None:
        raise ValueError(f"backend.kind={spec.backend.kind}: NxDT configs are for backend.kind=neuron")
    family = _llama(spec, data, init_checkpoint) if spec.model.family == "llama" else _gpt(spec, data)
    config = _common(spec, init_checkpoint)
    config.update(family)
    return config


def train_environment() -> dict[str, str]:
    """What train_setup.sh exports on a Slurm node, NEMO_EXPM_VERSION from the job id."""
    return {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1",
            "XLA_DISABLE_FUNCTIONALIZATION": "0", "HYDRA_FULL_ERROR": "1", "MASTER_PORT": str(MASTER_PORT),
            "MALLOC_ARENA_MAX": "128", "CREATE_TB_LOGGER": "True", "CHECKPOINT_CALLBACK": "True",
            "NEMO_EXPM_VERSION": "$SLURM_JOB_ID", "EXPLICIT_LOGDIR": "null"}


def torchrun_command(spec: PretrainSpec, config_name: str, log_dir: str | None = None) -> list[str]:
    """train.sh's per-node line; $NNODES, $NODE_RANK and $MASTER_ADDR are filled in on each node
    from the Slurm environment. ``log_dir``: exp_manager's explicit_log_dir, where checkpoints go
    (train.sh leaves it null: a directory per Slurm job under the working directory)."""
    devices = spec.cluster.devices_per_node
    return ["torchrun", "--nproc_per_node", str(devices), "--nnodes", "$NNODES", "--node_rank", "$NODE_RANK",
            "--master_addr", "$MASTER_ADDR", "--master_port", str(MASTER_PORT), "training_orchestrator.py",
            "--config-path=conf", f"--config-name={config_name}", f"trainer.devices={devices}",
            "trainer.num_nodes=$NNODES", f"exp_manager.explicit_log_dir={log_dir or 'null'}"]


PRECOMPILE_STEPS = 10  # NxDT forces max_steps=10 under COMPILE=1; enough to trace every graph


def precompile_command(spec: PretrainSpec, config_name: str) -> list[str]:
    """train.sh with COMPILE=1: neuron_parallel_compile around the same torchrun line, the step
    count capped so the trial run only traces the graphs."""
    return ["neuron_parallel_compile", *torchrun_command(spec, config_name), f"trainer.max_steps={PRECOMPILE_STEPS}"]


def precompile_environment(spec: PretrainSpec, per_node_cache: bool, retry_failed: bool) -> dict[str, str]:
    """Environment of the precompile job: results as JSON, the compile cache (one per node when
    the shared filesystem's locks cannot be trusted, e.g. NFS), and on a retry
    ``--retry_failed_compilation`` so only the failed graphs are compiled again."""
    cache = spec.backend.neuron.compiler_cache_url
    env = {**train_environment(), "COMPILE": "1", "NEURON_PARALLEL_COMPILE_DUMP_RESULTS": "1",
           "NEURON_COMPILE_CACHE_URL": f"{cache.rstrip('/')}/node-$NODE_RANK" if per_node_cache else cache}
    if retry_failed:
        env["NEURON_CC_FLAGS"] = "--retry_failed_compilation"
    return env
