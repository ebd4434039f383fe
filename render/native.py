"""The native trainer's launch from the spec: its config file and the per-node torchrun line.

The config is everything ``python -m trainer train`` reads; the torchrun line takes the
rendezvous address and node rank from the Slurm environment ($MASTER_ADDR, $NODE_RANK, filled
in on each node by the job layer), so one line serves every node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pretrain.spec import PretrainSpec
from render.dataset_files import blend
from trainer.run_layout import checkpoint_dir, metrics_path

# torchrun forwards these to the ranks; Slurm sends USR2 ahead of the time limit (--signal).
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


def compile_cache_dir(spec: PretrainSpec) -> str:
    return str(Path(spec.backend.native.compile_cache_dir or Path(spec.paths.root) / "compile-cache").expanduser())


def train_config(spec: PretrainSpec, *, dataset: str, run_dir: str, eod_id: int, init_from: str | None = None,
                 steps: int | None = None, warmup_only: bool = False) -> dict[str, Any]:
    """The trainer config for the run in ``run_dir``. ``warmup_only``: the precompile stage's
    short run, which fills the compile cache and exports nothing; it evaluates once when
    training will, so the evaluation graphs are compiled too."""
    m, t, n = spec.model, spec.training, spec.backend.native
    run = Path(run_dir)
    steps = steps or spec.training.steps
    datasets = blend(spec, dataset)
    return {
        "model": {"family": m.family, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                  "ffn_hidden_size": m.ffn_hidden_size, "num_attention_heads": m.num_attention_heads,
                  "num_kv_heads": m.num_kv_heads, "vocab_size": m.vocab_size,
                  "max_position_embeddings": m.max_position_embeddings, "rope_theta": m.rope_theta or 10000.0,
                  "rope_scaling": m.rope_scaling.model_dump() if m.rope_scaling else None,
                  "init_from": init_from if init_from is not None else m.init_from},
        # Megatron's sample index cache, per run: by default it would go inside the tokenize
        # stage's content-addressed output, and a killed write there would poison later runs.
        "data": {"paths": [prefix for _, prefix in datasets],
                 "weights": [weight for weight, _ in datasets] if spec.data.blend else None,
                 "split": spec.data.split, "cache_dir": str(run / "index-cache")},
        "optim": {"lr": t.lr, "min_lr": t.min_lr, "warmup_steps": t.warmup_steps, "decay_style": t.lr_decay_style,
                  "weight_decay": t.weight_decay, "betas": list(t.adam_betas), "grad_clip": t.grad_clip,
                  "max_nan_steps_in_a_row": n.max_nan_steps_in_a_row},
        # the warm-up's short run writes no checkpoint: nothing resumes from it
        "checkpoint": {"dir": str(checkpoint_dir(run)), "keep": n.checkpoint_keep, "async_save": n.async_checkpoint,
                       "interval": max(t.checkpoint_steps, steps) if warmup_only else t.checkpoint_steps,
                       "final": not warmup_only},
        "metrics": {"jsonl_path": str(metrics_path(run)), "tensorboard_dir": str(run / "tensorboard")},
        "parallel": {"tp": spec.parallel.tp, "activation_checkpointing": n.activation_checkpointing,
                     "compile": n.compile, "float8": n.float8},
        "device": n.device,
        "steps": steps,
        "micro_batch_size": t.micro_batch_size,
        "global_batch_size": t.global_batch_size,
        "seq_length": m.seq_length,
        "seed": t.seed,
        "precision": "fp32" if t.precision == "fp32" else "bf16",
        "eval_interval": steps if warmup_only else t.eval_interval,
        "eval_iters": min(t.eval_iters, 1) if warmup_only else t.eval_iters,
        "benchmark": t.benchmark,
        "export_hf": None if warmup_only or not n.export_hf else str(run / "hf"),
        "eod_id": eod_id,
    }


def environment(spec: PretrainSpec) -> dict[str, str]:
    """Every rank compiles into, and reads from, the shared compile cache. torchrun gives its
    ranks 30 s after forwarding a stop signal before it kills them; they get the whole time Slurm
    was asked to signal ahead of the limit, or the checkpoint that signal asks for is cut off.
    Each rank's intra-op threads are its share of the task's CPUs (one without
    ``cluster.cpus_per_task``), set here rather than inherited from the submitting shell: the same
    spec runs with the same threads in every job of its chain."""
    cache = compile_cache_dir(spec)
    c = spec.cluster
    return {"OMP_NUM_THREADS": str(max(c.cpus_per_task // c.devices_per_node, 1) if c.cpus_per_task else 1),
            "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "NEURON_COMPILE_CACHE_URL": f"{cache}/neuron",
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
            # read by torchrun's launcher on every version that has the timeout, ignored before
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(max(30, spec.backend.native.save_before_limit_s))}


def torchrun_command(spec: PretrainSpec, config_path: str, record_path: str, python: str = "python") -> list[str]:
    return [python, "-m", "torch.distributed.run", "--nnodes", "$NNODES", "--node_rank", "$NODE_RANK",
            "--nproc_per_node", str(spec.cluster.devices_per_node), "--master_addr", "$MASTER_ADDR",
            "--master_port", "$MASTER_PORT", "--max_restarts", "0", "--signals_to_handle", FORWARDED_SIGNALS,
            "-m", "trainer", "train", "--config", config_path, "--record", record_path]
