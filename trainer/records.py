"""The machine-readable record a node program leaves: one JSON line on stdout, and optionally a
file written atomically, whose presence tells the control plane the program finished."""

from __future__ import annotations

import json
import os
from pathlib import Path


def emit(record: dict, path: str | None = None) -> None:
    line = json.dumps(record)
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(line + "\n")
        os.replace(tmp, path)
    print(line)
