"""Whether a run's filesystem can hold the checkpoints it will write, asked before its first job
is queued: on small real filesystems (tmpfs mounts), and the size per parameter measured on the
native trainer's own checkpoints (tests/test_train_loop.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow

from blocks.cluster import SlurmCluster
from jobs.contract import ClusterMismatch
from pretrain.checkpoint_room import checkpoint_bytes, room_refusal
from pretrain.presets import load_spec
from tasks.attempts import MetricsFollower, run_attempts
from tasks.preflight import PreflightFailed, preflight
from tests.model_that_fits import MODEL_THAT_FITS


def native(root: Path, keep: int):
    return load_spec("tiny-local", [f"paths.root={root}", f"backend.native.checkpoint_keep={keep}"])


@pytest.mark.pure
def test_a_native_run_needs_room_for_the_checkpoints_it_keeps_and_the_next(filesystem):
    size = checkpoint_bytes(native(Path("/"), 3))
    root = filesystem(size * 7 // 2)  # room for three checkpoints and a half
    checkpoints = root / "pretrain" / "train" / "run" / "checkpoints"  # not made yet
    refused = room_refusal(native(root, 3), checkpoints)
    assert refused is not None and refused.startswith(f"{checkpoints}: its filesystem has ")
    assert "the run needs 85.1 MB: 4 checkpoints at once (backend.native.checkpoint_keep=3" in refused, refused
    assert "lower backend.native.checkpoint_keep" in refused
    assert room_refusal(native(root, 2), checkpoints) is None  # three fit

    # a run that resumes: the checkpoints it kept already take their room
    checkpoints.mkdir(parents=True)
    for step in (10, 20):
        (checkpoints / f"step-{step:08d}").mkdir()
        (checkpoints / f"step-{step:08d}" / "__0_0.distcp").write_bytes(b"\0" * size)
    refused = room_refusal(native(root, 3), checkpoints)  # two more to write: 1.5 free
    assert refused is not None and f"less the 42.6 MB already in {checkpoints}" in refused, refused
    assert room_refusal(native(root, 2), checkpoints) is None  # one more


@pytest.mark.pure
def test_a_backend_that_keeps_every_checkpoint_needs_room_for_one_more(filesystem):
    spec = load_spec("gpt3-7.5b-gpu", MODEL_THAT_FITS)  # Megatron-LM: --save deletes nothing
    root = filesystem(checkpoint_bytes(spec) // 2)
    refused = room_refusal(spec, root / "checkpoints")
    assert refused is not None and "the run needs 808.6 MB: one more checkpoint, of about 808.6 MB each" in refused
    assert "57.75 M parameters x 14 bytes" in refused and "checkpoint_keep" not in refused


@pytest.mark.pure
def test_the_train_task_queues_nothing_for_a_run_whose_checkpoints_cannot_fit(filesystem):
    spec = native(Path("/"), 3)
    root = filesystem(checkpoint_bytes(spec) * 3)
    spec = native(root / "pretrain", 3)
    run = root / "pretrain" / "train" / "run"

    def prepare(attempt, launch):
        raise AssertionError("a job was prepared for a run that cannot save")

    with pytest.raises(ClusterMismatch, match=r"train tiny-local: .* free, and the run needs .*; nothing was queued"):
        run_attempts(spec, SlurmCluster(), MetricsFollower(spec, run / "metrics.jsonl", 10, 600), budget=1,
                     prepare=prepare, run=run, checkpoint_step=lambda: 0)
    assert not run.exists()  # not even claimed


def test_the_flows_preflight_refuses_a_run_that_could_not_save_one_checkpoint(filesystem):
    """Before fetch and tokenize, whose outputs may take hours: the run's directory is not known
    yet, so what it already holds is not either, and the preflight asks for room for one."""
    root = filesystem(checkpoint_bytes(native(Path("/"), 3)) // 2)
    spec = native(root / "pretrain", 3)

    @flow
    def check(stages: list[str]):
        return preflight(spec, stages)

    state = check(["fetch", "tokenize", "train"], return_state=True)
    assert state.is_failed() and isinstance(state.result(raise_on_failure=False), PreflightFailed)
    assert "the run needs 21.3 MB: one more checkpoint" in state.message and "nothing was queued" in state.message
    assert check(["fetch", "tokenize"], return_state=True).is_completed()  # a run that does not train saves none
