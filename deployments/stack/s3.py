"""The S3-compatible server of the stack: moto's server mode on 127.0.0.1."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from deployments.stack.processes import running_pid, start_detached, stop, wait_until


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def up(root: Path, port: int) -> int:
    pid_file = root / "run" / "s3.pid"
    if (pid := running_pid(pid_file)) is not None:
        return pid
    log = root / "log" / "s3.log"
    (root / "run").mkdir(parents=True, exist_ok=True)
    pid = start_detached([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                         log, pid_file, env={**os.environ})
    wait_until(lambda: _answers(port), 30, f"the S3 server on port {port}", log)
    return pid


def down(root: Path) -> bool:
    return stop(root / "run" / "s3.pid")


def status(root: Path) -> int | None:
    return running_pid(root / "run" / "s3.pid")
