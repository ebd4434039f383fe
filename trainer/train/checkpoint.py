"""Sharded checkpoints with torch.distributed.checkpoint: written in the background, complete
only when their marker exists, the last K kept, resume from the newest complete one.

Layout: ``<dir>/step-00000050/`` holds DCP's files and, once every rank's writes and the
metadata are on disk, ``COMPLETE``: a JSON record of the step and each file's size and CRC32.
A directory without it (a job killed mid-write, a full disk) is never loaded and is replaced
when that step is saved again; the previous checkpoint is deleted only after a newer one is
complete, so a failed write never loses the last good state.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.stateful import Stateful

from trainer.run_layout import MARKER, complete_steps, step_dir
from trainer.train.config import CheckpointConfig

# DCP reports a failed save or load on any rank as CheckpointException, a BaseException.
_FAILED = (Exception, dcp.CheckpointException)


class CheckpointError(RuntimeError):
    pass


class ModelAndOptimizer(Stateful):
    """Model and optimizer state as DCP wants it: sharded, keyed by parameter name."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _share(items: list, rank: int, world: int) -> list:
    """The part of a checkpoint's files one rank reads, so that the ranks of a large run share
    the reading (a 70B run's checkpoint is ~1 TB) instead of one reading it all."""
    return sorted(items)[rank::world]


def verify(path: Path, rank: int = 0, world: int = 1) -> None:
    """Every file the marker lists is there with its size and CRC32; else an error naming it.
    ``rank`` of ``world`` checks its share of the files."""
    record = json.loads((path / MARKER).read_text())
    for name, (size, crc) in _share(list(record["files"].items()), rank, world):
        file = path / name
        if not file.exists():
            raise CheckpointError(f"checkpoint {path} is damaged: {file} is missing; delete {path} to resume "
                                  "from the checkpoint before it")
        if file.stat().st_size != size or _crc32(file) != crc:
            raise CheckpointError(f"checkpoint {path} is damaged: {file} does not match its recorded size/CRC32 "
                                  f"({size} bytes); delete {path} to resume from the checkpoint before it")


def verify_together(path: Path) -> None:
    """:func:`verify`, its files shared among the ranks, every rank raising the first damage any
    rank found (so the failure record names the file whichever rank writes it)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return verify(path)
    try:
        verify(path, dist.get_rank(), dist.get_world_size())
        found = None
    except CheckpointError as exc:
        found = str(exc)
    _raise_first(_gathered((None, found)))


def _gathered(value: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``value``, on every rank."""
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, value, group=group)
    return everyone


def _raise_first(results: list[tuple[Any, str | None]]) -> None:
    """Every rank's (result, error), gathered: raise the first error any rank met, on every rank,
    so that each fails the same way and none waits for the others in a later collective."""
    if damage := next((error for _, error in results if error), None):
        raise CheckpointError(damage)


class KeptStager(DefaultStager):
    """DCP's stager, kept for the whole run: it copies the state into host buffers that it makes
    on its first copy (one per tensor, pinned on CUDA) and refills on later ones. Made afresh per
    save, the 1.5B-parameter GPU benchmark's 18 GB were allocated and pinned at every checkpoint,
    which held training up 9.8 s on one H100.

    torch 2.11's DefaultStager empties its copier after every copy (``_stage`` closes it: the
    cache of buffers is dropped and its next copy fails with ``KeyError: <class 'type'>``), and
    its DCP closes the stager handed to ``async_save``; torch 2.13 does neither. Both closes are
    ignored here, and :meth:`release` ends the stager with the run."""

    def __init__(self, options: StagingOptions):
        super().__init__(options)
        copier = self._state_dict_stager
        self._release_copier = copier.close
        copier.close = lambda: None

    def close(self) -> None:
        pass

    def release(self) -> None:
        super().close()
        self._release_copier()


def _plain(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each Stateful replaced by its state dict, as DCP saves it."""
    return {key: value.state_dict() if isinstance(value, Stateful) else value for key, value in state.items()}


class Checkpointer:
    def __init__(self, cfg: CheckpointConfig, rank: int, staging: StagingOptions):
        """``staging``: how background writes copy the state first (device.checkpoint_staging)."""
        self.cfg, self.rank = cfg, rank
        self.root = Path(cfg.dir).expanduser()
        self.pending: Future | None = None
        self.pending_step: int | None = None
        self.staging: Future | None = None
        self.stager = KeptStager(staging) if cfg.async_save else None
        # Background writes run their collectives on their own group, never interleaved with
        # the training step's collectives on the default one.
        self.group = dist.new_group(backend="gloo") if cfg.async_save else None
        # Sealing a background write (CRC32 of every file, the marker, pruning) happens off the
        # training thread too: file reads and zlib release the GIL, so the steps do not wait on it.
        self.sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-seal") if cfg.async_save else None
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)

    def latest(self) -> int | None:
        steps = complete_steps(self.root)
        return steps[-1] if steps else None

    def load(self, state: dict[str, Any], step: int) -> None:
        path = step_dir(self.root, step)
        verify_together(path)
        try:
            # Per-rank entries (RNG) of a run with another world size are simply absent.
            dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True))
        except _FAILED as exc:
            raise CheckpointError(f"checkpoint {path} could not be read: {exc}") from exc

    def save(self, state: dict[str, Any], step: int, *, blocking: bool = False) -> None:
        self.wait()  # the stager refills the host buffers that the previous write may still be reading
        # A resumed run stopping at once: never rewrite a good checkpoint. Rank 0 decides for
        # all, so no rank waits in a save the others skipped.
        complete = torch.tensor([int(self.rank == 0 and step in complete_steps(self.root))])
        dist.broadcast(complete, src=0)
        if complete.item():
            return
        path = step_dir(self.root, step)
        if self.rank == 0 and path.exists():
            shutil.rmtree(path)  # an incomplete write of this step by an earlier attempt
        dist.barrier()
        if blocking or not self.cfg.async_save:
            try:
                dcp.save(state, checkpoint_id=str(path))
            except _FAILED as exc:
                raise self._failed(step, exc) from exc
            self._finish(step)
            return
        try:
            write = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group, async_stager=self.stager)
        except _FAILED as exc:
            raise self._failed(step, exc) from exc
        if isinstance(write, AsyncSaveResponse):  # the copy is being taken in the background
            self.staging, write = write.staging_completion, write.upload_completion
        self.pending = self.sealer.submit(self._seal, write, step)
        self.pending_step = step

    def warm(self, state: dict[str, Any]) -> None:
        """Have the stager make its host buffers now, in the background, so that the first
        checkpoint holds training up no longer than the later ones do. Call it once the optimizer
        has made its state (after the first step). This copy's values are thrown away, so
        training goes on while it is taken: the buffers are what it is for."""
        if self.stager is not None:
            self.stager.stage(_plain(state))

    def wait_for_staging(self) -> None:
        """Before the optimizer changes weights and state in place: the copy a background write
        is taking of them must be complete (a failed copy fails the write, reported by wait)."""
        if self.staging is not None:
            staging, self.staging = self.staging, None
            futures.wait([staging])

    def _seal(self, write: Future, step: int) -> None:
        write.result()
        self._finish(step)

    def wait(self) -> None:
        """Let the background write end; raise if it failed (a full disk, say)."""
        if self.pending is None:
            return
        future, step = self.pending, self.pending_step
        self.pending = self.pending_step = self.staging = None
        try:
            future.result()
        except _FAILED as exc:
            raise self._failed(step, exc) from exc

    def poll(self) -> None:
        """Take note of a background write that has ended (raising if it failed), without waiting
        for one that has not."""
        if self.pending is not None and self.pending.done():
            self.wait()

    def _failed(self, step: int, exc: BaseException) -> CheckpointError:
        previous = self.latest()
        kept = f"the previous checkpoint step {previous} is intact" if previous is not None else "no earlier checkpoint exists"
        return CheckpointError(f"writing checkpoint step {step} to {step_dir(self.root, step)} failed: "
                               f"{type(exc).__name__}: {exc}; {kept}")

    def _finish(self, step: int) -> None:
        """Seal a written checkpoint: each rank records the size and CRC32 of its share of the
        files (DCP's save returns on a rank only once every rank's files and the metadata are on
        disk), and rank 0 writes the marker from all of them, then prunes."""
        path = step_dir(self.root, step)
        world = dist.get_world_size(self.group)
        try:
            mine = {p.name: (p.stat().st_size, _crc32(p))
                    for p in _share([p for p in path.iterdir() if p.is_file()], self.rank, world)}
            failed = None
        except OSError as exc:
            mine, failed = {}, f"sealing checkpoint {path} failed: {exc}"
        shares = _gathered((mine, failed), self.group)
        _raise_first(shares)
        failed = None
        if self.rank == 0:
            files = {name: entry for share, _ in shares for name, entry in share.items()}
            tmp = path / f".{MARKER}.tmp"
            try:
                tmp.write_text(json.dumps({"step": step, "files": files}))
                os.replace(tmp, path / MARKER)
            except OSError as exc:  # the disk filled up just now: the marker is the last byte written
                failed = str(self._failed(step, exc))
        # Every rank learns whether the checkpoint is complete and fails the same way if not.
        _raise_first(_gathered((None, failed), self.group))
        if self.rank == 0:
            for old in complete_steps(self.root)[:-self.cfg.keep]:
                shutil.rmtree(step_dir(self.root, old), ignore_errors=True)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self.sealer is not None:
                self.sealer.shutdown()
                self.stager.release()
