"""``python -m trainer train --config FILE``: run under torchrun on every node, or alone.

Exit status: 0 finished, 2 bad config or bad input (data, init_from, a device the node does not have), 3 stopped
on a signal after saving a checkpoint (resumable: run the same command again), 1 failed.

torchrun reports every failed rank as exit status 1, so a failure that running the job again would
meet again (bad input, a diverged loss, a damaged checkpoint, a full disk) also leaves a record
``{"status": "failed", "reason": ...}``: the control plane stops on it instead of resubmitting,
and names the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from trainer import records
from trainer.train.config import TrainConfig

EXIT_BAD_INPUT = 2


def failed(exc: Exception, record: str | None, status: int) -> int:
    """Every rank meets these (the config, the data and the loss are the same everywhere; a
    checkpoint error may be one rank's): whichever writes last, the record names a reason."""
    sys.stderr.write(f"error: {exc}\n")  # one write, as records.emit does: every rank writes at once
    if record:
        records.emit({"status": "failed", "reason": str(exc)}, record)
    return status


def main(argv: list[str]) -> NoReturn:
    status = run(argv)
    # The run is over and everything it writes is closed: leave without the interpreter's
    # teardown, where torch's C++ objects are destroyed: there, rarely, a rank of a finished run
    # aborted ("terminate called without an active exception", rank 1 of two on gloo, once in CI),
    # and torchrun reported the finished run as failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer train")
    parser.add_argument("--config", required=True, help="the trainer config (JSON) rendered from the spec")
    parser.add_argument("--record", help="write the final record (JSON) here when the run ends")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig.from_file(args.config)
    except (ValueError, FileNotFoundError) as exc:
        return failed(exc, args.record, EXIT_BAD_INPUT)
    # A config that cannot run has failed by now, before torch and the model code are imported:
    # seconds of every rank's start here, a minute on a cluster's shared file system.
    from trainer.train import device as devices
    from trainer.train.checkpoint import CheckpointError
    from trainer.train.loop import EXIT_STOPPED, NonFiniteLoss, Trainer

    try:
        trainer = Trainer(cfg)  # resolves the device, reads the data and init_from, resumes from a checkpoint
    except (ValueError, FileNotFoundError, devices.DeviceUnavailable) as exc:  # the config, or what it names
        return failed(exc, args.record, EXIT_BAD_INPUT)
    except CheckpointError as exc:  # the checkpoint to resume from is damaged
        return failed(exc, args.record, 1)
    try:
        result = trainer.train()
    except (NonFiniteLoss, CheckpointError) as exc:
        return failed(exc, args.record, 1)
    finally:
        trainer.close()
    if cfg.parallel.compile and args.record and os.environ.get("LOCAL_RANK", "0") == "0":
        # Compile caches are per node: each node's first rank reports what it compiled, under
        # the scheduler's name for the node (records.node_name).
        host = records.node_name()
        counts = devices.compile_counts(trainer.device)
        records.emit({"node": host, **counts}, f"{args.record}.compile-{host}.json")
    if trainer.rank == 0:
        records.emit(result, args.record)
    return EXIT_STOPPED if result["status"] == "stopped" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
