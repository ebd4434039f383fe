"""NxD Training launch files from the spec: the conf YAML that ``training_orchestrator.py``
reads, the environment that ``train.sh``/``train_setup.sh`` set, and the per-node torchrun line
(``examples/train.sh``, ``examples/train_setup.sh``, ``examples/training_orchestrator.py`` and
``examples/conf/`` in aws-neuron/neuronx-distributed-training; docs/render.md).

The conf is the published example of the model family with the spec's values in it:
``megatron_gpt_config.yaml`` for GPT, ``hf_llama3_70B_config.yaml`` (with the trn2 keys of
``hf_llama3_70B_trn2_config.yaml``) for Llama, at the commit docs/nxdt-upstream.md names. Every
key those set is rendered, with their value wherever the spec has no field for it; the keys in
which a preset's conf differs from its example, and why, are listed there. The same spec
renders the conversion flags, so the two cannot disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pretrain.spec import PretrainSpec
from render.convert_command import expected_config
from trainer.model_shape import config_mismatches
from render.dataset_files import blend, gpt2_bpe_files
from render.job_end import nxdt_max_time

MASTER_PORT = 41000  # train_setup.sh's fixed rendezvous port
# exp_manager's model_parallel_size as the examples write it; NeMo registers the resolver
# (OmegaConf "multiply" in NVIDIA/NeMo nemo/core/classes/modelPT.py), and the value follows a
# command line that overrides tp or pp
MODEL_PARALLEL_SIZE = ("${multiply:${distributed_strategy.tensor_model_parallel_size}, "
                       "${distributed_strategy.pipeline_model_parallel_size}}")


def _trainer(spec: PretrainSpec) -> dict[str, Any]:
    n, t = spec.backend.neuron, spec.training
    trainer: dict[str, Any] = {"devices": spec.cluster.devices_per_node}
    if n.instance_type == "trn2":
        trainer["lnc"] = n.lnc
    trainer.update({
        "num_nodes": spec.cluster.nodes, "max_epochs": -1, "max_steps": spec.training.steps,
        "log_every_n_steps": n.log_every_n_steps, "val_check_interval": t.eval_interval,
        "check_val_every_n_epoch": None, "num_sanity_val_steps": 0,
        # Lightning reads an int as a number of batches and a float as a fraction of the set:
        # eval_iters batches, or 0.0 (none, as the 70B yamls publish it, and in benchmark mode).
        "limit_val_batches": t.eval_batches or 0.0, "limit_test_batches": t.eval_batches or 0.0,
        "gradient_clip_val": t.grad_clip,
        # stop after a step, saving the last checkpoint, before the job's time limit (render/job_end.py)
        "max_time": nxdt_max_time(spec)})
    if n.instance_type == "trn2" and n.sequential_move_factor:
        trainer["sequential_move_factor"] = n.sequential_move_factor
    return trainer


def _exp_manager(spec: PretrainSpec, init_checkpoint: str | None) -> dict[str, Any]:
    n, t = spec.backend.neuron, spec.training
    return {
        "log_local_rank_0_only": True, "create_tensorboard_logger": True, "explicit_log_dir": None,
        "exp_dir": None, "name": _name(spec), "resume_if_exists": True, "resume_ignore_no_checkpoint": True,
        "create_checkpoint_callback": True,
        "checkpoint_callback_params": {
            # save_last: the checkpoint trainer.max_time's stop saves on the way out; NxDT's examples
            # leave it off, and a job at its time limit would end without one
            "monitor": "step", "save_top_k": 1, "mode": "max", "save_last": True,
            "filename": n.checkpoint_filename or f"{spec.name}--{{step}}-{{consumed_samples}}",
            "model_parallel_size": MODEL_PARALLEL_SIZE, "every_n_train_steps": t.checkpoint_steps,
            "use_master_weights_in_ckpt": False},
        "log_parameter_norm": True, "log_gradient_norm": True, "enable_recovery_time_instrumentation": False,
        "save_xser": n.save_xser, "load_xser": n.save_xser, "save_bf16": False,
        "async_checkpointing": n.async_checkpointing,
        # Continual pre-training: the converted weights (the trailing slash makes the tag "").
        "resume_from_checkpoint": f"{init_checkpoint.rstrip('/')}/" if init_checkpoint else None,
    }


def _strategy(spec: PretrainSpec) -> dict[str, Any]:
    p = spec.parallel
    strategy: dict[str, Any] = {"tensor_model_parallel_size": p.tp, "pipeline_model_parallel_size": p.pp,
                                "virtual_pipeline_model_parallel_size": 1}
    if spec.model.family == "llama":
        # the Llama examples' keys: ring attention's cp and the KV heads' replication, which only
        # the Llama model uses (the GPT example sets neither; the spec keeps GPT's cp at 1)
        strategy["context_parallel_size"] = p.cp
    strategy.update({"zero1": p.zero1, "sequence_parallel": p.sequence_parallel})
    if spec.model.family == "llama":
        strategy["kv_replicator"] = p.kv_replicator
    return strategy


def _precision(spec: PretrainSpec) -> dict[str, Any]:
    n = spec.backend.neuron
    # the examples' block; NxDT reads the flags after type only when type is manual
    precision: dict[str, Any] = {"type": n.precision_type, "master_weights": False, "fp32_grad_acc": False,
                                 "xla_use_bf16": "0", "xla_downcast_bf16": n.xla_downcast_bf16,
                                 "neuron_rt_stochastic_rounding_en": "0"}
    if n.parallel_layers_reduce_dtype:
        precision["parallel_layers_reduce_dtype"] = n.parallel_layers_reduce_dtype
    return precision


def _name(spec: PretrainSpec) -> str:
    return "hf_llama" if spec.model.family == "llama" else "megatron_gpt"


def _optim(spec: PretrainSpec) -> dict[str, Any]:
    """The examples' optimizer: AdamW with fp32 optimizer state and capturable for GPT, plain
    AdamW for Llama, whose schedule also names max_steps (NxDT sets it from the trainer anyway)."""
    t, gpt = spec.training, spec.model.family == "gpt"
    sched: dict[str, Any] = {"name": "CosineAnnealing", "warmup_steps": t.warmup_steps}
    if gpt:
        sched.update({"constant_steps": spec.backend.neuron.lr_constant_steps, "min_lr": t.min_lr})
    else:
        sched.update({"max_steps": "${trainer.max_steps}", "min_lr": t.min_lr,
                      "constant_steps": spec.backend.neuron.lr_constant_steps})
    return {"name": "adamw_fp32OptState" if gpt else "adamw", "lr": t.lr, "weight_decay": t.weight_decay,
            "capturable": gpt, "betas": list(t.adam_betas), "sched": sched}


def _checkpointing_and_fusions(spec: PretrainSpec) -> dict[str, Any]:
    n = spec.backend.neuron
    return {"activations_checkpoint_granularity": "selective",
            "activations_checkpoint_recompute": list(n.activations_checkpoint_recompute),
            "fusions": dict(n.fusions)}


class ModelConfigMismatch(ValueError):
    retryable = False  # the same file says the same thing next time


def check_model_config(spec: PretrainSpec) -> None:
    """NxDT's Llama model takes its heads, KV heads, feed-forward width and vocabulary from
    ``backend.neuron.hf_config`` (``model_config``), and from the YAML only what it overrides
    (layers, hidden size, positions, RoPE base): a config.json of another shape would train
    another model than the spec, checks and all, describes. Read where the flow reads it (after
    fetch brought an hf:// one), before any job is queued."""
    if not spec.backend.neuron.hf_config:
        raise ModelConfigMismatch("backend.neuron.hf_config is not set, and NxDT builds its Llama model from a "
                                  "config.json: name the model's (a path, or hf://ORG/NAME)")
    path = Path(spec.backend.neuron.hf_config).expanduser()
    if not path.is_file():
        raise ModelConfigMismatch(f"backend.neuron.hf_config={path}: no such file on this machine; give the "
                                  "config.json of the model the spec describes")
    if wrong := config_mismatches(json.loads(path.read_text()), list(expected_config(spec).items())):
        raise ModelConfigMismatch(f"backend.neuron.hf_config={path} does not describe the model of the spec, and "
                                  f"NxDT builds the model from it: {'; '.join(wrong)}. Point hf_config at the "
                                  "config.json of the model the spec describes, or fix the spec's model section")


def _llama(spec: PretrainSpec, data_dir: str, init_checkpoint: str | None) -> dict[str, Any]:
    m, n, t = spec.model, spec.backend.neuron, spec.training
    model: dict[str, Any] = {
        "model_config": n.hf_config, "encoder_seq_length": m.seq_length,
        "max_position_embeddings": m.max_position_embeddings, "num_layers": m.num_layers,
        "hidden_size": m.hidden_size, "qkv_linear": m.qkv_linear, "fuse_qkv": m.fuse_qkv, "rope_theta": m.rope_theta}
    if spec.parallel.pipeline_cuts:
        model["pipeline_cuts"] = list(spec.parallel.pipeline_cuts)
    # Continual pre-training loads the converted weights instead of initialising on the CPU, and
    # not their optimizer state (docs/tutorials/hf_llama3_70B_pretraining.rst, "Continual
    # Pre-training"); NxDT reads weight_init_only as false when absent.
    model["use_cpu_initialization"] = init_checkpoint is None
    if init_checkpoint is not None:
        model["weight_init_only"] = True
    model.update({**_checkpointing_and_fusions(spec), "do_layer_norm_weight_decay": True, "optim": _optim(spec)})
    data = {"micro_batch_size": t.micro_batch_size, "global_batch_size": t.global_batch_size, "train_dir": data_dir}
    return {"data": data, "model": model}


def _gpt(spec: PretrainSpec, data_prefix: str) -> dict[str, Any]:
    m, t, n = spec.model, spec.training, spec.backend.neuron
    vocab, merges = gpt2_bpe_files(spec, data_prefix)
    data = {"micro_batch_size": t.micro_batch_size, "global_batch_size": t.global_batch_size,
            "data_prefix": [x for pair in blend(spec, data_prefix) for x in pair], "index_mapping_dir": None,
            "data_impl": "mmap", "splits_string": spec.data.split, "seq_length": "${model.encoder_seq_length}",
            "skip_warmup": True, "num_workers": 1, "dataloader_type": "single", "reset_position_ids": False,
            "reset_attention_mask": False, "eod_mask_loss": False, "validation_drop_last": True,
            "no_seqlen_plus_one_input_tokens": False, "pad_samples_to_global_batch_size": False,
            "tokenizer": {"library": "megatron", "type": "GPT2BPETokenizer", "model": None, "vocab_file": vocab,
                          "merge_file": merges, "delimiter": None, "sentencepiece_legacy": False,
                          "use_fast": False}}
    model = {"encoder_seq_length": m.seq_length, "max_position_embeddings": m.max_position_embeddings,
             "num_layers": m.num_layers, "hidden_size": m.hidden_size, "ffn_hidden_size": m.ffn_hidden_size,
             "num_attention_heads": m.num_attention_heads, "num_kv_heads": m.kv_heads,
             "init_method_std": n.init_method_std, "use_scaled_init_method": True, "hidden_dropout": n.dropout,
             "attention_dropout": n.dropout, "ffn_dropout": n.dropout,
             "apply_query_key_layer_scaling": True, "normalization": "layernorm", "layernorm_epsilon": 1e-5,
             "do_layer_norm_weight_decay": False, "make_vocab_size_divisible_by": 8, "persist_layer_norm": False,
             "share_embeddings_and_output_weights": True, "position_embedding_type": "learned_absolute",
             "rotary_percentage": 1, "activation": "gelu", "transformer_block_type": "pre_ln", "has_bias": True,
             "use_cpu_initialization": True, **_checkpointing_and_fusions(spec), "optim": _optim(spec)}
    return {"data": data, "model": model}


def nxdt_config(spec: PretrainSpec, data: str, init_checkpoint: str | None = None) -> dict[str, Any]:
    """The NxDT conf YAML as a dict, in the examples' order. ``data`` is the tokenized dataset
    (HF Arrow directory for Llama, Megatron prefix for GPT); ``init_checkpoint`` the converted
    weights to continue from."""
    if spec.backend.kind != "neuron" or spec.backend.neuron is None:
        raise ValueError(f"backend.kind={spec.backend.kind}: NxDT configs are for backend.kind=neuron")
    n = spec.backend.neuron
    family = _llama(spec, data, init_checkpoint) if spec.model.family == "llama" else _gpt(spec, data)
    return {"name": _name(spec), "model_source": "hf" if spec.model.family == "llama" else "megatron",
            "seed": spec.training.seed, "trainer": _trainer(spec), "exp_manager": _exp_manager(spec, init_checkpoint),
            "distributed_strategy": _strategy(spec), **family, "precision": _precision(spec),
            "compiler_flags": n.compiler_flags, "compiler_cache_url": n.compiler_cache_url,
            # sic: NxDT spells the key this way
            "aync_exec_max_inflight_requests": n.async_exec_max_inflight_requests,
            "bucket_size_collectives": n.bucket_size_collectives,
            "neuron_rt_exec_timeout": n.neuron_rt_exec_timeout,
            "neuron_experimental_compress_rg": n.neuron_experimental_compress_rg}


def config_yaml(config: dict[str, Any]) -> str:
    """The conf file's text, keys in the examples' order."""
    return yaml.safe_dump(config, sort_keys=False)


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
