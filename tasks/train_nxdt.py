"""train (neuron backend): NxD Training's ``training_orchestrator.py`` under torchrun on every
node, with the conf YAML and the compile cache of the precompile stage (``examples/train.sh`` in
aws-neuron/neuronx-distributed-training; docs/stages.md, "train, neuron backend").

Each node runs train.sh's line, the one precompile ran inside ``neuron_parallel_compile``, in
``<run>/node-<rank>/`` and logs to ``train.log`` there; node 0's log (NxDT's Lightning progress
bar) is the metrics stream for the loss curve. Checkpoints go to ``<run>/exp/checkpoints/``
(``exp_manager.explicit_log_dir`` on the shared filesystem: one directory for every node and
every attempt). A resubmitted job resumes from the newest complete checkpoint, the one with its
``done`` marker: the conf is rendered again with ``resume_from_checkpoint`` pointing at it and
``weight_init_only`` off, as otherwise the converted weights the first attempt started from
would be loaded again.

Nothing here runs on this machine's CPU: the task is built on NxDT's documented launch,
checkpoint layout and log lines, and tested by rendering and parsing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.logging import get_run_logger

from tasks.executor import cluster_for, on_nodes
from jobs.contract import JobRequest, ends_cancelled, stage_request
from pretrain.checkpoints import nxdt_newest, nxdt_step
from pretrain.neuron_compile import training_compiles
from pretrain.spec import PretrainSpec
from render.nxdt import config_yaml
from render.nxdt_scripts import CONFIG_NAME, TRAIN_LOG, log_dir, node_command, node_name, train_config, train_script
from tasks.artifacts import retryable
from tasks.attempts import AppendedLog, MetricsFollower, finish_run, run_attempts
from tasks.runs import run_dir
from trainer.run_layout import checkpoint_dir

def compile_rows(run: Path, nodes: int) -> list[dict]:
    """Per node: graphs training still compiled (0 when precompile covered them) and graphs it
    loaded from the cache, from each node's log."""
    rows = []
    for rank in range(nodes):
        node_dir = run / f"node-{rank}"
        log = node_dir / TRAIN_LOG
        counts = training_compiles(log.read_text(errors="replace")) if log.exists() else {}
        rows.append({"node": node_name(node_dir), "compiled": counts.get("compiled", 0),
                     "from cache": counts.get("from_cache", 0)})
    return rows


@task(name="train", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def train_nxdt(spec: PretrainSpec, dataset: str, checkpoint: str | None = None,
               precompiled: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with NxDT until ``training.train_steps`` (or ``train_samples``); ``checkpoint`` the
    converted weights to start from, ``precompiled`` the precompile stage's result (its nodes and
    compile cache)."""
    logger = get_run_logger()
    n = spec.backend.neuron
    run = run_dir(spec, f"{dataset}|{checkpoint}")
    (run / "conf").mkdir(parents=True, exist_ok=True)
    cluster = cluster_for(spec)
    if precompiled and precompiled.get("nodes"):
        cluster = on_nodes(cluster, precompiled["nodes"])
    script = run / "train.sh"
    script.write_text(train_script(spec, run, precompiled and precompiled.get("compile_cache_url")))
    follower = MetricsFollower(spec, run / "node-0" / TRAIN_LOG, spec.training.steps,
                               n.hang_timeout_min * 60, devices_dir=run / "devices")

    def request(launch: PretrainSpec) -> JobRequest:
        resume = nxdt_newest(checkpoint_dir(log_dir(run)))
        if resume is not None:
            logger.info("the train job resumes from %s", resume)
        config = train_config(launch, dataset, checkpoint, resume)
        (run / "conf" / f"{CONFIG_NAME}.yaml").write_text(config_yaml(config))
        return stage_request(spec, f"{spec.name}-train", node_command(spec, script, run))

    # Every attempt appends to node 0's log (train.sh's tee -a): a failed attempt is named by the
    # error its ranks printed there, where the job's end says only that train.sh exited non-zero.
    appended = AppendedLog(run / "node-0" / TRAIN_LOG)
    attempts = run_attempts(spec, cluster, follower, n.max_attempts_without_checkpoint, appended.submitting(request),
                            run, lambda: nxdt_step(checkpoint_dir(log_dir(run))), explain=appended.explain)
    final = nxdt_newest(checkpoint_dir(log_dir(run)))
    return finish_run(spec, follower, attempts, attempts.finished,
                      compile_rows(run, spec.cluster.nodes), status="finished",
                      step=max(follower.stream.points, default=0), run_dir=str(run),
                      checkpoint=str(final) if final else None)
