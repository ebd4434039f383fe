"""The train stage's Prefect artifacts: the loss curve and its points, live progress, the chain of
jobs, and the run summary. The content comes from ``pretrain.loss_curve``; this module only publishes it.

These are plain functions, not tasks: the train task calls them while it polls its Slurm job,
and a task run per chart refresh would bury the run's real tasks in the UI.

Within one flow run, publishing a key again updates that run's artifact in place, so a run
shows one live loss curve, its last state surviving a retry of the train task; each flow run adds
one version under the key, which is the history the UI keeps. Prefect's public helpers update
only progress artifacts in place (``update_progress_artifact``), but that helper is a thin call
of the client's ``update_artifact`` (``PATCH /artifacts/{id}``), which takes any type: the server
rewrites the row's data and description, and the key's latest-version entry when it points at
that row (``prefect.server.models.artifacts.update_artifact``).

The Prefect calls go through the synchronous client, so these functions behave the same when
the calling task is ``async def`` (where Prefect's ``create_*_artifact`` helpers return
coroutines).
"""

from __future__ import annotations

import json
import time
from typing import Iterable
from uuid import UUID

from prefect import get_client
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort
from prefect.utilities.context import get_task_and_flow_run_ids

from pretrain import run_chain
from pretrain.device_samples import DeviceSamples
from pretrain.loss_curve import RunSummary, loss_curve_markdown, run_summary_markdown, table_rows
from tasks.artifacts import artifact_key

LOSS_TABLE_ROWS = 200


def _publish(key: str, kind: str, data: str, description: str) -> UUID:
    """Update this flow run's artifact under ``key``, or create one (a new version of the key)."""
    task_run_id, flow_run_id = get_task_and_flow_run_ids()
    with get_client(sync_client=True) as client:
        this_run = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]),
                                           flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])),
            sort=ArtifactSort.CREATED_DESC, limit=1) if flow_run_id else []
        if this_run:
            client.update_artifact(this_run[0].id, ArtifactUpdate(data=data, description=description))
            return this_run[0].id
        return client.create_artifact(ArtifactCreate(
            key=key, type=kind, data=data, description=description,
            flow_run_id=flow_run_id, task_run_id=task_run_id)).id


def publish_loss_curve(spec_name: str, points: list[dict]) -> None:
    """The loss curve (``<spec>-loss-curve``, markdown: PNG, summary, mermaid chart) and its downsampled
    points (``<spec>-loss-points``, table) from the metrics stream so far.

    Each call renders a PNG (about 0.1 s) and sends some tens of KB, so call it every few
    minutes of training or every few hundred steps, and once at the end, not on every poll.
    """
    logged = f"{len(points)} steps logged" + (f", up to step {max(p['step'] for p in points)}" if points else "")
    _publish(artifact_key(spec_name, "loss-curve"), "markdown",
             loss_curve_markdown(points, f"{spec_name}: loss"), f"training loss, {logged}")
    rows = table_rows(points, LOSS_TABLE_ROWS)
    # allow_nan=False: a NaN here would be invalid JSON; table_rows spells them out as text.
    _publish(artifact_key(spec_name, "loss-points"), "table", json.dumps(rows, allow_nan=False),
             f"{len(rows)} of {logged}: per step range the lowest and highest loss, and the evaluations")


def publish_devices(spec_name: str, samples: DeviceSamples) -> None:
    """The device samples (``<spec>-devices``, markdown): utilization and memory per node over
    time, and per node the means, peaks and errors. Published with the loss curve, not per poll."""
    nodes = len(samples.nodes)
    _publish(artifact_key(spec_name, "devices"), "markdown", samples.markdown(f"{spec_name}: devices"),
             f"device utilization, memory and errors of {nodes} node{'s' if nodes != 1 else ''}")


def publish_chain(spec_name: str, chain: list[run_chain.Record], budget: int, step_s: float | None,
                  advice: Iterable[str] = ()) -> None:
    """The run's chain of jobs (``<spec>-chain``, markdown), once per job: each job's steps, why it
    ended, the time lost before it, the goodput so far and the checkpoint advice."""
    _publish(artifact_key(spec_name, "chain"), "markdown",
             run_chain.markdown(f"{spec_name}: chain of jobs", chain, budget, step_s, time.time(), list(advice)),
             f"{len(chain)} job{'s' if len(chain) != 1 else ''}, newest checkpoint at step "
             f"{chain[-1]['checkpoint_after'] if chain else 0}")


def publish_run_summary(spec_name: str, summary: RunSummary) -> None:
    """The run summary (``<spec>-run-summary``, markdown); ``RunSummary`` lists its keys."""
    _publish(artifact_key(spec_name, "run-summary"), "markdown", run_summary_markdown(summary),
             "results, Slurm jobs, stage durations, versions and the resolved spec")


def publish_progress(spec_name: str, steps_done: int, total_steps: int, artifact_id: UUID | None = None) -> UUID:
    """Training progress (``<spec>-progress``) as a percentage of ``total_steps``: created on the
    first call (``artifact_id`` None), updated in place on later calls with the id it returned."""
    if total_steps <= 0:
        raise ValueError(f"total_steps={total_steps}: must be positive (the spec's train steps)")
    progress = 100.0 * min(max(steps_done, 0), total_steps) / total_steps
    description = f"step {steps_done} of {total_steps}"
    # _sync=True: the helpers' documented switch to their synchronous path, which they would
    # otherwise leave inside an async task (see the module docstring).
    if artifact_id is None:
        return create_progress_artifact(progress, key=artifact_key(spec_name, "progress"), description=description,
                                        _sync=True)
    return update_progress_artifact(artifact_id, progress, description=description, _sync=True)
