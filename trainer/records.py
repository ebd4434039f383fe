"""The machine-readable record a node program leaves: one JSON line on stdout, and optionally a
file written atomically, whose presence tells the control plane the program finished."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import TextIO


def node_name() -> str:
    """The scheduler's name for this node, which the next job's node list takes: Slurm's, or the
    Kubernetes node a pod runs on (NODE_NAME, from the pod's spec.nodeName); else the host's."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("NODE_NAME") or socket.gethostname()


def emit(record: dict, path: str | None = None) -> None:
    line = json.dumps(record)
    if path:
        # Several processes may write the same record (every rank of a failed run): each its own
        # temporary file, so that every rename finds one.
        tmp = Path(f"{path}.{socket.gethostname()}-{os.getpid()}.tmp")
        tmp.write_text(line + "\n")
        os.replace(tmp, path)
    # One write of the whole line, not print's two (text, then newline): the ranks of a failed run
    # all emit their record at once into one pipe, where two writes each could interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def open_appending(path: Path) -> TextIO:
    """``path`` opened to append JSON lines. A writer killed in the middle of a line leaves it torn,
    without its newline: the next line appended would join it, and a reader that skips the torn
    line would lose the whole one too. So a torn end is closed with a newline first."""
    out = path.open("a", encoding="utf-8")
    if out.tell():
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                out.write("\n")
    return out
