"""The chain of jobs every training backend's train task shares: submit the job, follow its
metrics (progress and loss-curve artifacts, hang detection), and when it ends short of the last
step submit the next, leaving out the nodes a node failure left suspect (going on with fewer, down
to ``cluster.min_nodes``, when the partition has no others); end with the run's summary or a
failure naming every job's error. It runs on Slurm and on Kubernetes alike, through
:mod:`tasks.executor`.

A job that advanced the run's newest checkpoint spends no failure budget, whatever ended it (its
time limit, a preemption, a requeue, a crash): the next job goes out at once. The budget,
``backend.<kind>.max_attempts_without_checkpoint``, counts the jobs in a row that did not. Each job
is recorded in the run's chain (pretrain/run_chain.py), published as the ``<spec>-chain`` artifact.

The run directory is keyed by what the run trains, not by the flow run (:mod:`tasks.runs`): a
retry, the next job and a new flow run of the same spec all continue the run from its newest
complete checkpoint, one flow run at a time (:class:`tasks.runs.RunClaim`).
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
                           node_mtbf_h, on_nodes, run_job, shrinks_by_resubmission, usable_nodes, wait_gone)
from jobs.contract import ClusterMismatch, JobFailed, JobRequest, run_logger
from pretrain import checkpoint_interval, run_chain
from pretrain.checkpoint_room import room_refusal
from pretrain.checkpoint_advice import FailureInputs
from pretrain.device_samples import DeviceSamples
from pretrain.log_parsers import MetricsStream, parse_log, rank_error
from pretrain.loss_curve import metrics_summary
from pretrain.spec import PretrainSpec
from tasks.runs import RunClaim
from trainer.run_layout import checkpoint_dir
from tasks.train_artifacts import publish_chain, publish_devices, publish_loss_curve, publish_progress

LOSS_CURVE_EVERY_S = 30.0


class TrainingFailed(RuntimeError):
    # The task's own loop has already spent the backend's failure budget on resubmissions; a
    # Prefect retry would spend it a second time.
    retryable = False
    # For the run summary: what the run measured before it failed, and each attempt's outcome.
    metrics: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] | None = None


class RunHung(RuntimeError):
    pass


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
    finished: bool = False  # the run reached its last step

    def failure(self) -> TrainingFailed:
        outcomes = "; ".join(f"job {a['job']}: {a['outcome']}" for a in self.history)
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

    def submitting(self, request: Callable[[PretrainSpec], JobRequest]) -> Callable[[int, PretrainSpec], JobRequest]:
        """Each attempt submits ``request(launch)``, its lines starting where the log ends now."""
        def prepare(attempt: int, launch: PretrainSpec) -> JobRequest:
            self.start = self.path.stat().st_size if self.path.exists() else 0
            return request(launch)
        return prepare

    def explain(self, outcome: str) -> str:
        if outcome == COMPLETED or not self.path.exists():
            return outcome
        with open(self.path, "rb") as f:
            f.seek(self.start)
            error = rank_error(f.read().decode(errors="replace"))
        return f"{outcome} -- {error}" if error else outcome


def job_completed(outcome: str) -> bool:
    """Whether the job ended well (NxDT, Megatron-LM and torchtitan exit 0 at the last step, and
    Megatron-LM also after saving at its exit duration: :func:`run_attempts` asks for both)."""
    return outcome == COMPLETED


def advice_inputs(spec: PretrainSpec, cluster: Cluster, follower: MetricsFollower, chain: list[run_chain.Record],
                  interval: int | None) -> FailureInputs:
    """The checkpoint advice's inputs as the run has measured them so far: the cluster block's
    per-node MTBF updated by the chain's failures, its restarts, step time and the save stall at
    ``interval``, the checkpoint interval its jobs ran with (None before the first)."""
    if interval is None and spec.training.checkpoint_interval != "auto":
        interval = spec.training.checkpoint_interval  # what an earlier flow run's jobs of this run ran with
    stall = checkpoint_interval.measured_stall_s(follower.stream.as_list(), interval) if interval else None
    return checkpoint_interval.failure_inputs(spec, node_mtbf_h(cluster), chain,
                                              follower.summary().get("step_time_ms"), stall)


def run_attempts(spec: PretrainSpec, cluster: Cluster, follower: MetricsFollower, budget: int,
                 prepare: Callable[[int, PretrainSpec], JobRequest], run: Path, checkpoint_step: Callable[[], int],
                 finished: Callable[[str], bool] | None = None,
                 explain: Callable[[str], str] = str) -> Attempts:
    """Submit the training job, follow its metrics, and submit the next job whenever one ends short
    of the last step, until ``budget`` jobs in a row have ended without advancing the newest
    checkpoint (``checkpoint_step()``, the step of the newest complete checkpoint in ``run``).
    ``prepare(attempt, launch)`` readies the run directory and returns the request for ``launch``,
    the spec with ``training.checkpoint_interval: auto`` resolved from what the run has measured so
    far (the loop adds the excluded nodes and, for a run that may shrink, asks for the nodes left); ``finished(outcome)``
    says whether the run is done, ``outcome`` being :data:`COMPLETED` when the job ended well;
    by default, whether the job ended well at the spec's last step (by its checkpoint or its metrics);
    ``explain(outcome)`` is the job's outcome as the history records it, in the trainer's words
    where it left any. Every job is appended to the run's chain (``run/chain.jsonl``) and the chain
    artifact published. Every backend's train task uses this loop, under the run's
    :class:`RunClaim`; each resumes from its own newest checkpoint."""
    if finished is None:
        def finished(outcome: str) -> bool:
            reached = max(checkpoint_step(), max(follower.stream.points, default=0))
            return job_completed(outcome) and reached >= spec.training.steps
    if refused := room_refusal(spec, checkpoint_dir(run)):
        raise ClusterMismatch(f"train {spec.name}: {refused}; nothing was queued")
    with RunClaim(run, cluster):
        return _chain_of_jobs(spec, cluster, follower, budget, prepare, run, checkpoint_step, finished, explain)


@dataclass
class JobEnd:
    """How one job of the chain ended: the job layer's outcome, the job (None if it was never
    submitted), the nodes its failure named, and when the run first got past the highest step
    reached before it."""

    outcome: str = COMPLETED
    job: Any = None
    failed_on: list[str] = field(default_factory=list)
    caught_up_at: float | None = None


def _follow_job(spec: PretrainSpec, cluster: Cluster, request: JobRequest, follower: MetricsFollower,
                attempts: Attempts, reached_before: int) -> JobEnd:
    """Submit one job of the chain and follow it to its end, leaving out the nodes a node failure
    (or the devices' errors) left suspect; a failure no resubmission can fix sets the reason."""
    logger = run_logger()
    end = JobEnd()
    submitted: list[Any] = []

    def on_poll() -> None:
        follower.poll(started=job_running(submitted[0]))
        if end.caught_up_at is None and max(follower.stream.points, default=0) > reached_before:
            end.caught_up_at = time.time()

    try:
        # Time spent waiting in the queue, first or again after a requeue, is no hang.
        run_job(request, cluster, job_folder(spec, cluster), on_submit=submitted.append, on_poll=on_poll)
    except JobFailed as failure:
        # The nodes a failure names, as the job ended, for a job whose newest accounting record has
        # none: one that Slurm requeued after a node failure and the job layer cancelled.
        end.failed_on = failure_nodes(failure, cluster)
        follower.read_devices()
        faulty = {node: errors for node, errors in follower.devices.faulty_nodes().items()
                  if node not in attempts.excluded}
        if failure.state in NODE_STATES or faulty:
            bad = excluded_after(failure, cluster, faulty)
            logger.warning("job %s failed on nodes %s; left out of the next attempt: %s", failure.job_id,
                           failure.nodes, ", ".join(sorted(bad)) or "none (all of them are healthy now)")
            attempts.excluded |= bad
        end.outcome = f"{failure.state}: {str(failure).splitlines()[0]}"
        if faulty:
            end.outcome += " -- device errors on " + "; ".join(f"{node} ({errors})" for node, errors in faulty.items())
        if not failure.retryable:  # a resubmission would meet the same: a missing tool, a job Slurm never starts
            attempts.reason = f"not resubmitted: {str(failure).splitlines()[0]}"
    except RunHung as hung:
        end.outcome = f"hung: {hung}"  # run_job has cancelled the job
    end.job = submitted[0] if submitted else None
    if end.outcome != COMPLETED and end.job is not None:
        # Slurm and Kubernetes record a cancelled, preempted or timed-out job as ended while
        # its ranks still save a checkpoint into the run directory on the way out (SIGTERM):
        # the next attempt must not start beside them, nor be judged by a record they have
        # not yet written.
        lead = spec.restarts.save_before_limit_s + 60
        if not wait_gone(end.job, timeout_s=lead):
            logger.warning("job %s is still listed %d s after it ended; resubmitting anyway", end.job.job_id, lead)
    return end


def _chain_of_jobs(spec: PretrainSpec, cluster: Cluster, follower: MetricsFollower, budget: int,
                   prepare: Callable[[int, PretrainSpec], JobRequest], run: Path, checkpoint_step: Callable[[], int],
                   finished: Callable[[str], bool], explain: Callable[[str], str]) -> Attempts:
    logger = run_logger()  # the task's log, or a plain one where a test calls the loop itself
    attempts = Attempts()
    chain_path = run / run_chain.CHAIN_FILE
    chain = run_chain.read(chain_path)  # the jobs earlier flow runs of this run submitted
    attempt, launched = 0, None
    while True:
        if attempts.excluded and cluster.nodelist:
            cluster = on_nodes(cluster, [h for h in cluster.nodelist if h not in attempts.excluded])
        launch = checkpoint_interval.resolved(spec, advice_inputs(spec, cluster, follower, chain, launched))
        launched = launch.training.checkpoint_steps
        request = replace(prepare(attempt, launch), exclude=tuple(sorted(attempts.excluded)))
        if attempt and spec.cluster.fewest_nodes < request.nodes and shrinks_by_resubmission(cluster):
            # A run allowed to shrink goes on with the healthy nodes left rather than wait for a
            # lost or drained one to come back; the trainer resumes with fewer data-parallel ranks.
            left = usable_nodes(cluster) - attempts.excluded
            request = replace(request, nodes=spec.cluster.nodes_with(len(left)))
            if cluster.nodelist:  # the nodes precompile warmed, as many as are left
                cluster = on_nodes(cluster, [h for h in cluster.nodelist if h in left])
        follower.restart()
        started, submitted_at, checkpoint_before = time.monotonic(), time.time(), checkpoint_step()
        end = _follow_job(spec, cluster, request, follower, attempts,
                          reached_before=max([*follower.stream.points, *(r["step"] for r in chain)], default=0))
        follower.read()
        described = explain(end.outcome)  # reads what the trainer left: once per attempt
        step = max(follower.stream.points, default=0)
        nodes = (job_nodes(end.job) if end.job else []) or end.failed_on
        job_id = end.job.job_id if end.job else None
        attempts.history.append({"attempt": attempt + 1, "job": job_id, "nodes": ",".join(nodes),
                                 "outcome": described, "seconds": round(time.monotonic() - started, 1), "step": step})
        done = attempts.finished = finished(end.outcome)
        chain.append({"flow_run": str(flow_run.get_id() or ""), "job": job_id, "nodes": ",".join(nodes),
                      "node_count": len(nodes) or request.nodes, "submitted": submitted_at,
                      "caught_up_at": end.caught_up_at, "ended": time.time(), "checkpoint_before": checkpoint_before,
                      "checkpoint_after": checkpoint_step(), "step": step, "outcome": described, "completed": done})
        run_chain.append(chain_path, chain[-1])
        inputs = advice_inputs(spec, cluster, follower, chain, launched)
        publish_chain(spec.name, chain, budget, inputs.step_s,
                      checkpoint_interval.advice_lines(launch, inputs, measured=True))
        attempt += 1
        if done or attempts.reason:
            break
        without = run_chain.attempts_without_checkpoint(chain)
        if without > budget:
            attempts.reason = (f"{without} jobs in a row ended without advancing the newest checkpoint (step "
                               f"{chain[-1]['checkpoint_after']}): the failure budget, "
                               f"backend.{spec.backend.kind.replace('-', '_')}.max_attempts_without_checkpoint={budget}, "
                               "is spent")
            break
        if without:
            logger.warning("train job %d ended without advancing the newest checkpoint (%s); %d of %d jobs in a row "
                           "allowed; submitting the next, which resumes from the newest checkpoint", attempt,
                           described, without, budget)
        else:
            logger.info("train job %d ended at step %d (%s) after the newest checkpoint advanced to step %d: a "
                        "continuation, the next job goes out now", attempt, step, run_chain.why_ended(chain[-1]),
                        chain[-1]["checkpoint_after"])
    return attempts


def finish_run(spec: PretrainSpec, follower: MetricsFollower, attempts: Attempts, finished: bool,
               compiled: list[dict], **result: Any) -> dict[str, Any]:
    """The end of every backend's train stage: the final loss curve; a failure naming every
    attempt's outcome, or ``result`` with the job history, the metrics summary and the graphs
    training still compiled."""
    if any(row["compiled"] for row in compiled):
        run_logger().warning("training compiled graphs the precompile stage did not cover: %s", compiled)
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
