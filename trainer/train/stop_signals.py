"""Stop signals noted from the node program's first moment.

Slurm signals every process of a job step at once, ahead of a time limit (``--signal``), on
preemption and on ``scancel``. A rank still importing torch and the model code (seconds here,
minutes from a cluster's shared filesystem) would die of SIGUSR2's default action, leaving no
record of why. Noted here instead, the signal is honoured after the run's first step, like one
that arrives while it loads its data or resumes: a checkpoint, then exit status 3.
"""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
_noted: list[int] = []


def catch() -> None:
    """Note stop signals from now on, until the trainer installs its own handler."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _note)


def _note(signum: int, _frame: Any) -> None:
    _noted.append(signum)


def noted() -> int | None:
    """The first stop signal that arrived before the trainer's handler, if any."""
    return _noted[0] if _noted else None
