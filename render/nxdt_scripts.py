"""The script each node of an NxDT job runs, as NxDT's ``train.sh`` does: the precompile
stage's (``neuron_parallel_compile`` around the training launch, ``COMPILE=1``) and the train
stage's (the same torchrun line and conf). Both load one conf, ``conf/<CONFIG_NAME>.yaml``, and use
one compile cache, so training finds every graph precompile compiled."""

from __future__ import annotations

from pathlib import Path

from jobs.node import Command
from pretrain.spec import PretrainSpec
from render import nxdt
from render.monitor import monitor_command
from render.shell import node_path, require_program, shell_line, shell_word

CONFIG_NAME = "nxdt_config"  # conf/<name>.yaml; train's torchrun line names the same config
NPC_LOG = "npc.log"  # precompile's log in each node's directory
TRAIN_LOG = "train.log"  # training's log in each node's directory
HOST_FILE = "host"  # each node's Slurm name, written by its script


def per_node_cache(spec: PretrainSpec) -> bool:
    """NFS's file locks are the problem per-node caches work around; S3 has none to share."""
    neuron = spec.backend.neuron
    return neuron.per_node_compile_cache and not neuron.compiler_cache_url.startswith("s3://")


def compile_environment(spec: PretrainSpec, retry_failed: bool) -> dict[str, str]:
    """The precompile job's environment. ``NEURON_COMPILE_CACHE_URL`` is also what the train job
    must export: NxDT takes yaml ``compiler_cache_url`` only when the variable is unset, and the
    yaml holds the shared root, not the per-node directory."""
    env = nxdt.precompile_environment(spec, per_node_cache(spec), retry_failed)
    return {name: node_path(value) for name, value in env.items()}


def node_script(spec: PretrainSpec, what: str, env: dict[str, str], config_dir: str, work_dir: str,
                command: list[str], log: str) -> str:
    """What each node of an NxDT job runs, as train.sh does (NODE_RANK, NNODES and MASTER_ADDR
    come from the job layer): ``command`` in ``<work_dir>/node-<rank>``, its output in ``log`` there."""
    examples = node_path(spec.backend.neuron.examples_dir)
    lines = [
        "#!/usr/bin/env bash",
        f"# {what}",
        "set -eo pipefail",
        "# train_setup.sh raises the open-file limit for a node's ranks; a lower hard limit set by the site stays",
        'ulimit -n 65535 2>/dev/null || ulimit -n "$(ulimit -Hn)"',
        "# and, where sudo needs no password, keeps the rendezvous port out of the ephemeral range (another",
        "# process taking it fails the launch) and caps Lustre's dirty cache per OST client as FSx advises",
        f"sudo -n sysctl -w net.ipv4.ip_local_reserved_ports={nxdt.MASTER_PORT} >/dev/null 2>&1 || true",
        "if command -v lctl >/dev/null; then sudo -n lctl set_param 'osc.*.max_dirty_mb=64' >/dev/null 2>&1 || true; fi",
        *(f"export {name}={shell_word(value)}" for name, value in env.items()),
        "# a directory per node for its log (neuron_parallel_compile also writes its results JSON to the working",
        "# directory)",
        f"node_dir={shell_word(work_dir + '/node-$NODE_RANK')}",
        'mkdir -p "$node_dir"',
        "# the scheduler's name for this node (Slurm's, or the Kubernetes node the pod's NODE_NAME names), the",
        "# one the node list takes when training is pinned to these nodes",
        f'echo "${{SLURMD_NODENAME:-${{NODE_NAME:-$(hostname)}}}}" > "$node_dir/{HOST_FILE}"',
        "# Python resolves the link, so the orchestrator imports NxDT's modules beside its target, while",
        "# Hydra looks for conf/ beside the link: the rendered config, not the examples' own",
        f'ln -sfn {shell_word(examples + "/training_orchestrator.py")} "$node_dir/training_orchestrator.py"',
        f'ln -sfn {shell_word(config_dir)} "$node_dir/conf"',
        'cd "$node_dir"',
        require_program(examples + "/training_orchestrator.py",
                        "backend.neuron.examples_dir names the examples/ of NxD Training's checkout on the nodes", log),
        f"{shell_line(command)} 2>&1 | tee -a {log}",
    ]
    return "\n".join(lines) + "\n"


def precompile_script(spec: PretrainSpec, config_dir: str, attempt_dir: str, retry_failed: bool) -> str:
    return node_script(spec, "neuron_parallel_compile around the training launch on this node (NxDT train.sh "
                       "with COMPILE=1)", compile_environment(spec, retry_failed), config_dir, attempt_dir,
                       nxdt.precompile_command(spec, CONFIG_NAME), NPC_LOG)


def node_name(node_dir: Path) -> str:
    """The node's Slurm name; the directory name when the node never got to write it."""
    host = node_dir / HOST_FILE
    return host.read_text().strip() if host.exists() else node_dir.name


def train_config(spec: PretrainSpec, dataset: str, init_checkpoint: str | None, resume: Path | None) -> dict:
    """The conf precompile compiled for; resuming, from the run's own checkpoint. NxDT splits the
    path into directory and tag and reads consumed_samples from the tag, so no trailing slash."""
    config = nxdt.nxdt_config(spec, dataset, init_checkpoint)
    if resume is not None:
        config["exp_manager"]["resume_from_checkpoint"] = str(resume)
        if "weight_init_only" in config["model"]:
            config["model"]["weight_init_only"] = False  # the optimizer state comes back too
    return config


def train_environment(spec: PretrainSpec, cache_url: str | None) -> dict[str, str]:
    """What train.sh exports, and the compile cache precompile filled: the same per-node
    directory it used, or NxDT would compile every graph again. ``COMPILE=0`` too: NxDT's
    training_orchestrator.py reads it, and under ``COMPILE=1`` (precompile's, or one left in the
    environment a job starts from) runs 10 steps of graph extraction instead of training."""
    cache = cache_url or compile_environment(spec, retry_failed=False)["NEURON_COMPILE_CACHE_URL"]
    return {**nxdt.train_environment(), "COMPILE": "0", "NEURON_COMPILE_CACHE_URL": cache}


def log_dir(run: Path) -> Path:
    """exp_manager's explicit_log_dir for the run in ``run``; its checkpoints go to
    ``trainer.run_layout.checkpoint_dir`` of it."""
    return run / "exp"


def train_script(spec: PretrainSpec, run: Path, cache_url: str | None) -> str:
    return node_script(spec, "NxDT training on this node (train.sh)", train_environment(spec, cache_url),
                       str(run / "conf"), str(run), nxdt.torchrun_command(spec, CONFIG_NAME, str(log_dir(run))),
                       TRAIN_LOG)


def node_command(spec: PretrainSpec, script: Path, run: Path) -> Command:
    """Each node's train.sh (one task per node), the device sampler beside it."""
    return Command(["bash", str(script)], sidecar=monitor_command(spec, str(run)))
