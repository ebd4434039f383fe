"""Where a training run lives, and which flow run drives it.

A run's directory is keyed by what it trains, not by the flow run that started it: a retry of the
train task, the next job of its chain and a new flow run of the same spec all continue it from its
newest complete checkpoint (``training.continue_run: false``, or another ``name``, trains afresh).
One flow run at a time drives a run (:class:`RunClaim`), so two jobs of one run never train side by
side into the same checkpoints.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from prefect.runtime import flow_run

from jobs.contract import run_logger
from pretrain import manifest, run_chain
from pretrain.spec import PretrainSpec
from tasks.executor import Cluster, still_queued


# Settings that change how a run is driven, not what it trains: changed between two flow runs of
# a spec, the second still continues the first's run (a longer time limit, a larger budget, a
# checkpoint interval the chain re-derived, another site's block).
_DRIVING = {"description": (), "cluster": ("block", "executor", "min_nodes", "cpus_per_task", "mem_gb", "time_limit_min",
                                            "startup_min"),
            "training": ("checkpoint_interval", "step_time_s", "monitor_interval_s", "continue_run")}
_DRIVING_BACKEND = ("max_attempts_without_checkpoint", "hang_timeout_min", "save_before_limit_s", "checkpoint_keep",
                    "async_checkpoint")


def run_key_inputs(spec: PretrainSpec, dataset: str) -> dict[str, Any]:
    """What a run's directory is keyed by: the spec without the settings that only drive it, the
    dataset, and the flow run when ``training.continue_run`` is false or the run is a benchmark
    (each flow run trains afresh: a benchmark resumed at its last step would measure nothing)."""
    settings = spec.model_dump(mode="json")
    for section, fields in _DRIVING.items():
        if not fields:
            settings.pop(section, None)
        for name in fields:
            settings[section].pop(name, None)
    for backend in settings["backend"].values():
        for name in _DRIVING_BACKEND if isinstance(backend, dict) else ():
            backend.pop(name, None)
    inputs = {"spec": settings, "dataset": dataset}
    if not spec.training.continue_run or spec.training.benchmark:
        inputs["flow_run"] = flow_run.get_id() or "no-flow-run"
    return inputs


def run_dir(spec: PretrainSpec, dataset: str) -> Path:
    return manifest.output_dir(spec.paths.root, "train", manifest.stable_hash(run_key_inputs(spec, dataset)))


class RunClaim:
    """One flow run at a time drives a run: it holds ``<run>/owner.json`` (its flow run's id,
    renewed every ``renew_s`` by a thread while it drives the run) and removes it at the end. A
    second flow run of the same run waits while another flow run's claim is fresh, then while the
    chain's newest job is still queued (its flow process died: the job's lease stops it), and only
    then submits: two jobs of one run never train side by side into the same checkpoints."""

    OWNER = "owner.json"

    def __init__(self, run: Path, cluster: Cluster, renew_s: float = 10.0, stale_s: float = 60.0,
                 poll_s: float = 10.0):
        self.path, self.cluster = run / self.OWNER, cluster
        self.renew_s, self.stale_s, self.poll_s = renew_s, stale_s, poll_s
        self.me = str(flow_run.get_id() or f"pid-{os.getpid()}")
        self.stop = threading.Event()

    def other_owner(self) -> str | None:
        """Another flow run that renewed its claim within ``stale_s``, if any."""
        try:
            owner = json.loads(self.path.read_text())["flow_run"]
            age = time.time() - self.path.stat().st_mtime
        except (FileNotFoundError, ValueError, KeyError):
            return None
        return owner if owner != self.me and age < self.stale_s else None

    def __enter__(self) -> RunClaim:
        logger = run_logger()
        said = None
        while (owner := self.other_owner()) is not None:
            if owner != said:
                logger.warning("flow run %s is training this run (%s); waiting until it is done", owner,
                               self.path.parent)
                said = owner
            time.sleep(self.poll_s)
        chain = run_chain.read(self.path.parent / run_chain.CHAIN_FILE)
        job = chain[-1]["job"] if chain else None
        if job and still_queued(self.cluster, job):
            logger.warning("job %s of this run, submitted by flow run %s, is still queued; waiting for it to end "
                           "before the next job", job, chain[-1]["flow_run"])
            while still_queued(self.cluster, job):
                time.sleep(self.poll_s)
        self.path.write_text(json.dumps({"flow_run": self.me}))
        threading.Thread(target=self._renew, name="run-claim", daemon=True).start()
        return self

    def _renew(self) -> None:
        while not self.stop.wait(self.renew_s):
            try:
                os.utime(self.path)
            except FileNotFoundError:
                return

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.path.unlink(missing_ok=True)
