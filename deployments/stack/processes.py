"""Daemons the stack starts, followed by their pid files: alive, start, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class StackError(RuntimeError):
    """A component did not come up; the message names its log and shows its last lines."""


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int | None) -> bool:
    """A live, non-zombie process: PID 1 reaps killed daemons late, so kill -0 is not enough."""
    if not pid:
        return False
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return out.returncode == 0 and bool(out.stdout.strip()) and not out.stdout.strip().startswith("Z")


def running_pid(pid_file: Path) -> int | None:
    pid = read_pid(pid_file)
    return pid if alive(pid) else None


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log written)"


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise StackError(f"{what} did not come up within {timeout_s:.0f} s; see {log}:\n{log_tail(log)}")


def run(argv: list[str], env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    if check and out.returncode != 0:
        raise StackError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def start_detached(argv: list[str], log: Path, pid_file: Path, env: dict[str, str] | None = None) -> int:
    """Start a foreground program in its own session, logging to ``log``; record its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def stop(pid_file: Path, group: bool = False, timeout_s: float = 15) -> bool:
    """SIGTERM the recorded process (its whole session when ``group``), SIGKILL after
    ``timeout_s``; True when something was stopped."""
    pid = running_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    send = (lambda sig: os.killpg(pid, sig)) if group else (lambda sig: os.kill(pid, sig))
    try:
        send(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            send(signal.SIGKILL)
    except ProcessLookupError:
        pass
    pid_file.unlink(missing_ok=True)
    return True


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False
