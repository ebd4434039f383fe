"""train (native backend): ``python -m trainer train`` under torchrun on N nodes (Slurm or Kubernetes), followed
and resubmitted by the shared attempt loop (:mod:`tasks.attempts`): a run whose metrics stop
advancing is cancelled and resubmitted, and a node that Slurm reports failed is excluded from the
next submission. Each attempt resumes from the run's newest complete checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from prefect import task

from jobs.node import Command
from tasks.executor import cluster_for, on_nodes
from jobs.contract import JobRequest, ends_cancelled, stage_request
from pretrain.checkpoints import native_step
from pretrain.spec import PretrainSpec
from render import native
from render.job_end import signal_delay_s
from render.dataset_files import eod_id
from render.monitor import monitor_command
from tasks.artifacts import native_compile_rows, retryable
from tasks.attempts import MetricsFollower, finish_run, run_attempts
from tasks.runs import run_dir
from trainer.run_layout import checkpoint_dir, metrics_path


def write_config(path: Path, config: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2))
    os.replace(tmp, path)


@task(name="train", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def train(spec: PretrainSpec, dataset: str, data_dir: str, nodelist: list[str] | None = None) -> dict[str, Any]:
    """Train until the configured step; returns the trainer's final record with the job history."""
    n = spec.backend.native
    directory = run_dir(spec, dataset)
    directory.mkdir(parents=True, exist_ok=True)
    config_path, record_path = directory / "train.json", directory / "record.json"
    eod = eod_id(spec, data_dir)
    cluster = cluster_for(spec)
    if nodelist:
        cluster = on_nodes(cluster, nodelist)
    command = Command(native.torchrun_command(spec, str(config_path), str(record_path), python=sys.executable),
                      env=native.environment(spec),
                      sidecar=monitor_command(spec, str(directory)))
    follower = MetricsFollower(spec, metrics_path(directory), spec.training.steps, n.hang_timeout_min * 60,
                               devices_dir=directory / "devices")

    def prepare(attempt: int, launch: PretrainSpec) -> JobRequest:
        # the config of this job: its checkpoint interval re-derived where the spec says auto
        write_config(config_path, native.train_config(launch, dataset=dataset, run_dir=str(directory), eod_id=eod))
        for stale in [record_path, *directory.glob(f"{record_path.name}.compile-*.json")]:
            stale.unlink(missing_ok=True)
        return stage_request(spec, f"{spec.name}-train", command, signal_delay_s=signal_delay_s(spec))

    def record() -> dict[str, Any] | None:
        return json.loads(record_path.read_text()) if record_path.exists() else None

    def explain(outcome: str) -> str:
        # What the job's end does not say: torchrun forwards a stop signal, then exits 1 with its
        # own SignalException whatever its ranks did, so Slurm says FAILED (exit code 1) for a
        # run that saved a checkpoint and stopped as asked, ahead of its time limit say.
        stopped = record() or {}
        if stopped.get("status") != "stopped":
            return outcome
        return f"{outcome} -- the trainer stopped on {stopped['signal']} at step {stopped['step']} and saved a checkpoint"

    # A failed record ends the attempts too: a resubmission would meet the same failure.
    attempts = run_attempts(spec, cluster, follower, n.max_attempts_without_checkpoint, prepare, directory,
                            lambda: native_step(checkpoint_dir(directory)),
                            finished=lambda outcome: (record() or {}).get("status") in ("finished", "failed"),
                            explain=explain)
    final = record() or {}
    if final.get("status") == "failed":
        attempts.reason = f"the trainer stopped: {final['reason']} (not resubmitted: a new attempt would meet it again)"
    return finish_run(spec, follower, attempts, final.get("status") == "finished",
                      native_compile_rows(record_path) if n.compile else [], **final, run_dir=str(directory))
