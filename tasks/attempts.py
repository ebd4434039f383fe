"""The attempt loop every training backend's train task shares: submit the job, follow its
metrics (progress and loss-curve artifacts, hang detection), resubmit it when it dies, leaving
out the nodes a node failure left suspect (going on with fewer, down to ``cluster.min_nodes``, when
the partition has no others), and end with the run's summary or a failure naming every attempt.
It runs on Slurm and on Kubernetes alike, through :mod:`tasks.executor`.

The run directory is keyed by the spec, the dataset and the flow run, so a retry of a train task,
or a resubmission after the job died, resumes from the run's newest complete checkpoint while a
new flow run trains afresh.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from prefect.runtime import flow_run

from tasks.executor import (NODE_STATES, Cluster, excluded_after, failure_nodes, job_folder, job_nodes, job_running,
                           on_nodes, run_job, shrinks_by_resubmission, usable_nodes, wait_gone)
from jobs.slurm import JobRequest, SlurmJobFailed, _logger
from pretrain import manifest
from pretrain.device_samples import DeviceSamples
from pretrain.log_parsers import MetricsStream, parse_log, rank_error
from pretrain.loss_curve import metrics_summary
from pretrain.spec import PretrainSpec
from tasks.train_artifacts import publish_devices, publish_loss_curve, publish_progress

LOSS_CURVE_EVERY_S = 30.0


class TrainingFailed(RuntimeError):
    # The task's own loop has already spent backend.native.max_restarts on resubmissions; a
    # Prefect retry would spend the budget a second time.
    retryable = False
    # For the run summary: what the run measured before it failed, and each attempt's outcome.
    metrics: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] | None = None


class RunHung(RuntimeError):
    pass


def run_dir(spec: PretrainSpec, dataset: str) -> Path:
    key = manifest.stable_hash({"spec": spec.model_dump(mode="json"), "dataset": dataset,
                                "flow_run": flow_run.get_id() or "no-flow-run"})
    return manifest.output_dir(spec.paths.root, "train", key)


class MetricsFollower:
    """Reads the metrics JSONL as it grows; publishes progress and the loss curve; notices a hang."""

    def __init__(self, spec: PretrainSpec, path: Path, total_steps: int, hang_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, devices_dir: Path | None = None):
        self.spec, self.path, self.total = spec, path, total_steps
        # the device sampler's files, one per node (python -m trainer monitor), read as they grow
        self.devices_dir = devices_dir
        self.devices = DeviceSamples()
        self.device_offsets: dict[Path, int] = {}
        self.hang_timeout_s = hang_timeout_s
        self.clock = clock  # seconds; a test passes its own to age the run without waiting
        self.offset = 0
        self.inode: int | None = None
        self.partial = ""
        self.stream = MetricsStream()
        self.progress_id = None
        self.last_seen = (-1, 0)  # (the last step, events) the previous poll saw
        self.last_advance = self.clock()
        self.last_curve = 0.0

    def read(self) -> None:
        self.read_devices()
        try:
            with open(self.path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                if inode != self.inode:
                    # A resumed attempt rewrote the file (a new one) without the steps after
                    # its checkpoint: read it from the start.
                    self.inode, self.offset, self.partial, self.stream = inode, 0, "", MetricsStream()
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        text = self.partial + data.decode(errors="replace")
        # A progress bar (NxDT's) ends its updates with a carriage return, not a newline.
        end = max(text.rfind("\n"), text.rfind("\r")) + 1
        parse_log(text[:end], self.stream)
        self.partial = text[end:]

    def read_devices(self) -> None:
        """New complete lines of every node's device file; a sampler's torn last line waits."""
        if self.devices_dir is None or not self.devices_dir.is_dir():
            return
        for path in sorted(self.devices_dir.glob("*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self.device_offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.device_offsets[path] = self.device_offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                try:
                    self.devices.add(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue  # not a device record: evidence elsewhere, never a reason to stop following

    def summary(self) -> dict[str, Any]:
        """What the run measured so far: the metrics stream's summary, its throughput in tokens/s
        whatever form the backend prints it in (the spec gives the sequence length and the world
        size), and the device samples' figures."""
        self.read_devices()
        return {**metrics_summary(self.stream.as_list(), self.spec.model.seq_length, self.spec.world_size),
                **self.devices.figures()}

    def restart(self) -> None:
        """A new attempt: its start-up (and resume) is not a hang, and the steps it reports again
        replace the earlier attempt's."""
        self.last_advance = self.clock()
        self.stream.new_attempt()

    def poll(self, started: bool = True) -> None:
        """``started``: whether the job has left the queue; only then can the run hang."""
        self.read()
        step = max(self.stream.points, default=0)
        now = self.clock()
        if not started:
            self.last_advance = now
        # Events count as progress too: after the last step, the final checkpoint and the HF
        # export log theirs while no step advances.
        if (step, self.stream.events) != self.last_seen:
            self.last_advance = now
        if step != self.last_seen[0]:
            self.progress_id = publish_progress(self.spec.name, step, self.total, self.progress_id)
        self.last_seen = (step, self.stream.events)
        if now - self.last_curve > LOSS_CURVE_EVERY_S and self.stream.points:
            self.last_curve = now
            publish_loss_curve(self.spec.name, self.stream.as_list())
            if self.devices.nodes:
                publish_devices(self.spec.name, self.devices)
        if now - self.last_advance > self.hang_timeout_s:
            raise RunHung(f"no new metrics for {self.hang_timeout_s / 60:.1f} min (last step {step}); "
                          "cancelled as hung")


@dataclass
class Attempts:
    """What the attempts of one training run submitted, and the nodes left out after a node failure."""

    history: list[dict[str, Any]] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)
    reason: str = ""  # why the attempts stopped short, in the trainer's words or the job layer's

    def failure(self) -> TrainingFailed:
        outcomes = "; ".join(a["outcome"] for a in self.history)
        if self.reason:
            return TrainingFailed(f"{self.reason}. Attempts: {outcomes}")
        return TrainingFailed(f"training did not finish after {len(self.history)} attempt(s): {outcomes}")


COMPLETED = "completed"  # the outcome of an attempt whose job ended well


class AppendedLog:
    """A node log that every attempt appends to (torchrun's output through ``tee -a``, as the
    torchtitan and Megatron-LM launches keep it). The outcome of an attempt that failed names the
    first error a rank printed during that attempt (``log_parsers.rank_error``), where the job's
    end says only that torchrun exited 1. :meth:`submitting` and :meth:`explain` are
    ``run_attempts``' ``prepare`` and ``explain``."""

    def __init__(self, path: Path):
        self.path, self.start = path, 0

    def submitting(self, request: JobRequest) -> Callable[[int], JobRequest]:
        """Each attempt submits ``request``, its lines starting where the log ends now."""
        def prepare(attempt: int) -> JobRequest:
            self.start = self.path.stat().st_size if self.path.exists() else 0
            return request
        return prepare

    def explain(self, outcome: str) -> str:
        if outcome == COMPLETED or not self.path.exists():
            return outcome
        with open(self.path, "rb") as f:
            f.seek(self.start)
            error = rank_error(f.read().decode(errors="replace"))
        return f"{outcome} -- {error}" if error else outcome


def job_completed(outcome: str) -> bool:
    """A run is finished when its job ended well (NxDT, Megatron-LM: they exit 0 at the last step)."""
    return outcome == COMPLETED


def run_attempts(spec: PretrainSpec, cluster: Cluster, follower: MetricsFollower, max_restarts: int,
                 prepare: Callable[[int], JobRequest],
                 finished: Callable[[str], bool] = job_completed,
                 explain: Callable[[str], str] = str) -> Attempts:
    """Submit the training job, follow its metrics, and resubmit it when it dies, up to
    ``max_restarts`` times. ``prepare(attempt)`` readies the run directory and returns the request
    (the loop adds the excluded nodes and, for a run that may shrink, asks for the nodes left);
    ``finished(outcome)`` says whether the run is done, ``outcome`` being :data:`COMPLETED` when
    the job ended well; ``explain(outcome)`` is the attempt's outcome as the history records it, in
    the trainer's words where it left any. Every backend's train task uses this loop; each resumes
    from its own newest checkpoint."""
    logger = _logger()  # the task's log, or a plain one where a test calls the loop itself
    attempts = Attempts()
    for attempt in range(max_restarts + 1):
        if attempts.excluded and cluster.nodelist:
            cluster = on_nodes(cluster, [h for h in cluster.nodelist if h not in attempts.excluded])
        request = replace(prepare(attempt), exclude=tuple(sorted(attempts.excluded)))
        if attempt and spec.cluster.fewest_nodes < request.nodes and shrinks_by_resubmission(cluster):
            # A run allowed to shrink goes on with the healthy nodes left rather than wait for a
            # lost or drained one to come back; the trainer resumes with fewer data-parallel ranks.
            left = usable_nodes(cluster) - attempts.excluded
            request = replace(request, nodes=spec.cluster.nodes_with(len(left)))
            if cluster.nodelist:  # the nodes precompile warmed, as many as are left
                cluster = on_nodes(cluster, [h for h in cluster.nodelist if h in left])
        follower.restart()
        started = time.monotonic()
        submitted: list[Any] = []
        # The nodes a failure names, as the job ended, for a job whose newest accounting record has
        # none: one that Slurm requeued after a node failure and the job layer cancelled.
        failed_on: list[str] = []
        try:
            # Time spent waiting in the queue, first or again after a requeue, is no hang.
            run_job(request, cluster, job_folder(spec, cluster), on_submit=submitted.append,
                    on_poll=lambda: follower.poll(started=job_running(submitted[0])))
            outcome = COMPLETED
        except SlurmJobFailed as failure:
            failed_on = failure_nodes(failure, cluster)
            follower.read_devices()
            faulty = {node: errors for node, errors in follower.devices.faulty_nodes().items()
                      if node not in attempts.excluded}
            if failure.state in NODE_STATES or faulty:
                bad = excluded_after(failure, cluster, faulty)
                logger.warning("job %s failed on nodes %s; left out of the next attempt: %s", failure.job_id,
                               failure.nodes, ", ".join(sorted(bad)) or "none (all of them are healthy now)")
                attempts.excluded |= bad
            outcome = f"{failure.state}: {str(failure).splitlines()[0]}"
            if faulty:
                outcome += " -- device errors on " + "; ".join(f"{node} ({errors})" for node, errors in faulty.items())
            if not failure.retryable:  # a resubmission would meet the same: a missing tool, a job Slurm never starts
                attempts.reason = f"not resubmitted: {str(failure).splitlines()[0]}"
        except RunHung as hung:
            outcome = f"hung: {hung}"  # run_job has cancelled the job
        if outcome != COMPLETED and submitted:
            # Slurm and Kubernetes record a cancelled, preempted or timed-out job as ended while
            # its ranks still save a checkpoint into the run directory on the way out (SIGTERM):
            # the next attempt must not start beside them, nor be judged by a record they have
            # not yet written.
            lead = spec.backend.native.stop_signal_delay_s + 60
            if not wait_gone(submitted[0], timeout_s=lead):
                logger.warning("job %s is still listed %d s after it ended; resubmitting anyway",
                               submitted[0].job_id, lead)
        follower.read()
        described = explain(outcome)  # reads what the trainer left: once per attempt
        attempts.history.append({"attempt": attempt + 1, "job": submitted[0].job_id if submitted else None,
                                 "nodes": ",".join((job_nodes(submitted[0]) if submitted else []) or failed_on),
                                 "outcome": described,
                                 "seconds": round(time.monotonic() - started, 1),
                                 "step": max(follower.stream.points, default=0)})
        if finished(outcome) or attempts.reason:
            break
        logger.warning("train attempt %d ended without finishing (%s); %s", attempt + 1, described,
                       "resubmitting; the run resumes from its newest checkpoint" if attempt < max_restarts
                       else "no restarts left")
    return attempts


def finish_run(spec: PretrainSpec, follower: MetricsFollower, attempts: Attempts, finished: bool,
               compiled: list[dict], **result: Any) -> dict[str, Any]:
    """The end of every backend's train stage: the final loss curve; a failure naming every
    attempt's outcome, or ``result`` with the job history, the metrics summary and the graphs
    training still compiled."""
    if any(row["compiled"] for row in compiled):
        _logger().warning("training compiled graphs the precompile stage did not cover: %s", compiled)
    points = follower.stream.as_list()
    if points:
        publish_loss_curve(spec.name, points)
    measured = follower.summary()
    if follower.devices.nodes:
        publish_devices(spec.name, follower.devices)
    if not finished:
        failure = attempts.failure()
        failure.metrics, failure.attempts = measured, attempts.history
        raise failure
    return {**result, "attempts": attempts.history, "excluded_nodes": sorted(attempts.excluded),
            "metrics": measured, "skipped_log_lines": follower.stream.skipped,
            "compiled_during_training": compiled}
