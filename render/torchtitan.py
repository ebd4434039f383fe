"""torchtitan launch from the spec: the ``python -m torchtitan.train`` arguments and the per-node
torchrun line (torchtitan's run_train.sh and multinode_trainer.slurm).

torchtitan 0.3.0 has no TOML job file any more: ``torchtitan/config/manager.py`` builds the
config from a registry function (``--module llama3 --config llama3_8b``) and applies
``--section.key value`` overrides with tyro. The spec's values are rendered as those overrides,
so the published configuration is the base and the spec says only what it changes.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from jobs.node import Command
from pretrain import manifest
from pretrain.spec import DataSpec, PretrainSpec
from render.monitor import monitor_command
from render.native import compile_cache_dir
from render.shell import shell_line
from trainer.run_layout import checkpoint_dir

MASTER_PORT = 29500
# torchtitan's c4_test entry is ``load_dataset(path, split="train")`` over its "text" field: given
# the fetch stage's directory of JSONL files it reads them as a local JSON dataset.
LOCAL_TEXT_DATASET = "c4_test"


def loader_dir(run: Path) -> Path:
    """The directory torchtitan's loader reads: the fetched files, linked there by the train task
    (:func:`loader_view`)."""
    return run / "dataset"


def validation_dir(run: Path) -> Path:
    """The directory torchtitan's validator reads: the fetched files held out of :func:`loader_dir`
    (:func:`loader_view` again). Beside it, not in it: the loader reads every file under its directory."""
    return run / "validation"


class SplitRefused(ValueError):
    """The fetched files cannot be split as data.split asks: a retry finds the same files."""

    retryable = False


def loader_view(data_dir: Path, run: Path, data: DataSpec) -> Path:
    """:func:`loader_dir` of ``run``: the fetched files without the fetch stage's manifest, each a link. The
    loader torchtitan's ``c4_test`` entry uses, ``load_dataset(path, split="train")``, reads every
    JSON file of a directory as data, and fails on MANIFEST.json ("An error occurred while
    generating the dataset"); it reads no single file or glob. Made again for every run, so it
    follows the fetch output the spec names now.

    With a validation weight in ``data.split``, the last files by name go to :func:`validation_dir`
    instead, that share of the files (at least one, and one left to train on): that loader splits no
    file, so whole files are the held-out set, and none of them is trained on."""
    files = sorted(path.relative_to(data_dir) for path in data_dir.rglob("*")
                   if path.is_file() and path.name != manifest.MANIFEST
                   and not any(p.startswith(".") for p in path.relative_to(data_dir).parts))
    held_out = _held_out(len(files), data_dir, data)
    for view in (loader_dir(run), validation_dir(run)):
        shutil.rmtree(view, ignore_errors=True)
    for index, relative in enumerate(files):
        link = (loader_dir(run) if index < len(files) - held_out else validation_dir(run)) / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        # relative, so the link holds wherever a node mounts the shared disk
        link.symlink_to(os.path.relpath(data_dir / relative, link.parent))
    return loader_dir(run)


def _held_out(files: int, data_dir: Path, data: DataSpec) -> int:
    """How many of the ``files`` fetched files :func:`loader_view` holds out for validation. The spec
    has refused a test weight for torchtitan already (it has no test set)."""
    _, valid, _ = data.split_weights
    if not valid:
        return 0
    if files < 2:
        raise SplitRefused(f"data.split={data.split!r} holds whole files out for torchtitan's validation, and the fetch "
                           f"output {data_dir} has {files} file(s): one to train on and one to validate on are the "
                           "least; add a data.sources entry, or set data.split='100,0,0' and training.eval_iters=0")
    return min(files - 1, max(1, round(files * valid / sum(data.split_weights))))


def train_args(spec: PretrainSpec, data_dir: str, run_dir: str, init_from: str | None = None) -> list[str]:
    """The overrides, in the order of torchtitan's sections. ``data_dir``: the fetched JSONL, without
    the fetch stage's manifest (:func:`loader_dir`);
    ``init_from``: a local HF checkpoint directory (config.json + safetensors)."""
    m, p, t, titan = spec.model, spec.parallel, spec.training, spec.backend.torchtitan
    shard = spec.dp // titan.data_parallel_replicate
    module, function = titan.registry
    args = ["--module", module, "--config", function,
            "--hf-assets-path", str(spec.tokenizer.path), "--dump-folder", run_dir,
            "--training.steps", str(spec.training.steps), "--training.seq-len", str(m.seq_length),
            "--training.local-batch-size", str(t.micro_batch_size),
            "--training.global-batch-size", str(t.global_batch_size),
            # torchtitan clips at every step: a max norm of 0 would zero every gradient, where the
            # spec's 0 means no clipping (as for the other backends); infinity scales by 1
            "--training.max-norm", str(t.grad_clip or "inf"),
            # the FSDP compute dtype; the master weights stay float32 (training.dtype)
            "--training.mixed-precision-param", "float32" if t.precision == "fp32" else "bfloat16",
            "--debug.seed", str(t.seed),
            "--optimizer.param-groups.0.optimizer-kwargs.lr", str(t.lr),
            "--optimizer.param-groups.0.optimizer-kwargs.betas", *(str(beta) for beta in t.adam_betas),
            "--optimizer.param-groups.0.optimizer-kwargs.weight-decay", str(t.weight_decay),
            "--lr-scheduler.warmup-steps", str(t.warmup_steps), "--lr-scheduler.decay-type", t.lr_decay_style,
            "--lr-scheduler.min-lr-factor", str(t.min_lr / t.lr),
            "--parallelism.data-parallel-replicate-degree", str(titan.data_parallel_replicate),
            "--parallelism.data-parallel-shard-degree", str(shard),
            "--parallelism.tensor-parallel-degree", str(p.tp), "--parallelism.pipeline-parallel-degree", str(p.pp),
            "--parallelism.pipeline-parallel-schedule", titan.pipeline_schedule,
            "--parallelism.pipeline-parallel-microbatch-size", str(titan.pipeline_microbatch_size),
            "--parallelism.context-parallel-degree", str(p.cp),
            "--dataloader.dataset", LOCAL_TEXT_DATASET, "--dataloader.dataset-path", data_dir,
            "--checkpoint.enable", "--checkpoint.folder", str(checkpoint_dir(run_dir)),
            "--checkpoint.interval", str(t.checkpoint_steps), "--checkpoint.async-mode", titan.async_checkpoint,
            "--checkpoint.keep-latest-k", str(titan.checkpoint_keep),
            "--compile.enable" if titan.compile else "--compile.no-enable",
            "--compile.backend", "neuron" if titan.device == "neuron" else "inductor",
            "--metrics.log-freq", str(titan.log_freq)]
    if t.eval_batches:
        # torchtitan's own validation set is c4_validation from the Hub, which no stage fetches: it
        # reads the held-out files instead, through the loader entry training reads with
        args += ["--validator.enable", "--validator.freq", str(t.eval_interval), "--validator.steps", str(t.eval_batches),
                 "--validator.dataloader.dataset", LOCAL_TEXT_DATASET,
                 "--validator.dataloader.dataset-path", str(validation_dir(Path(run_dir)))]
    else:
        args.append("--validator.no-enable")
    if p.pp > 1:
        # torchtitan's Trainer.Config refuses its default CUDA graphs under pipeline parallelism
        args.append("--training.disable-cuda-graphs")
    if init_from:
        # read only while checkpoint.folder has no step-N: a resumed run loads its own newest
        args += ["--checkpoint.initial-load-path", init_from, "--checkpoint.initial-load-in-hf"]
    # tyro's subcommand for the activation checkpointing variant comes after the flags
    return args + [f"activation-checkpoint:{titan.activation_checkpointing}"]


def metrics_rank(spec: PretrainSpec) -> int:
    """The rank that prints the step lines (``_get_metrics_rank`` in torchtitan/components/metrics.py):
    0, or under pipeline parallelism the first rank of the last stage, which holds the loss."""
    pp = spec.parallel.pp
    if pp == 1 or spec.backend.torchtitan.pipeline_schedule == "ZBVZeroBubble":
        return 0
    return spec.world_size // pp * (pp - 1)


def environment(spec: PretrainSpec) -> dict[str, str]:
    """On Trainium the Neuron compiler's persistent cache on the shared disk, where a later run would
    find the graphs an earlier one compiled: no precompile job fills it, and whether TorchNeuron
    reads this torch-xla-era variable is not documented (docs/render.md)."""
    if spec.backend.torchtitan.device == "neuron":
        return {"NEURON_COMPILE_CACHE_URL": compile_cache_dir(spec)}
    return {}


def torchrun_command(spec: PretrainSpec, data_dir: str, run_dir: str, init_from: str | None = None) -> list[str]:
    """One line per node; $NNODES, $NODE_RANK and $MASTER_ADDR come from the Slurm environment.
    A rank per GPU, or per (logical) NeuronCore on Trainium. As run_train.sh does, every node
    shows one local rank's output, prefixed ``[rankN]:``: the one whose node holds the metrics rank
    prints the step lines."""
    return ["torchrun", "--nnodes", "$NNODES", "--nproc_per_node", str(spec.cluster.devices_per_node),
            "--node_rank", "$NODE_RANK", "--rdzv_id", spec.name, "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"$MASTER_ADDR:{MASTER_PORT}", "--local-ranks-filter", str(metrics_rank(spec) % spec.cluster.devices_per_node), "--role", "rank",
            "--tee", "3", "-m", "torchtitan.train", *train_args(spec, data_dir, run_dir, init_from)]


def node_command(spec: PretrainSpec, data_dir: str, run: Path, init_from: str | None = None) -> Command:
    """Each node's torchrun line, its output kept in the run directory (pipefail: the line's
    exit status is torchrun's, not tee's), the device sampler beside it."""
    line = shell_line(torchrun_command(spec, data_dir, str(run), init_from))
    return Command(["bash", "-c", f"set -o pipefail; {line} 2>&1 | tee -a {shlex.quote(str(run))}/node-$NODE_RANK.log"],
                   env=environment(spec), sidecar=monitor_command(spec, str(run)))
