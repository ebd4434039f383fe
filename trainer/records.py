"""The machine-readable record a node program leaves: one JSON line on stdout, and optionally a
file written atomically, whose presence tells the control plane the program finished."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


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
