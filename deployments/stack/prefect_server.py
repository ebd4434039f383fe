"""The Prefect server of the stack (SQLite under the stack directory), for deployments,
schedules and workers; plain flow runs use the ephemeral API instead.

It serves only clients that send the stack's credential: Prefect's basic authentication
(``PREFECT_SERVER_API_AUTH_STRING`` here, ``PREFECT_API_AUTH_STRING`` in clients, workers and the
UI's login; https://docs.prefect.io/v3/advanced/security-settings). Bound to loopback, it is
still reachable by every user of the machine, and the API hands out the Secret blocks (the Hub
token, S3 keys) to whoever asks. Its health check (``/api/health``) is open, as Prefect leaves it
for probes."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from deployments.stack.processes import running_pid, start_detached, stop, wait_until


def server_env(root: Path, port: int, auth: str) -> dict[str, str]:
    env = {**os.environ,
           "PREFECT_HOME": str(root / "prefect"),
           "PREFECT_SERVER_API_AUTH_STRING": auth,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           # The UI calls this address; it must be this server's own /api (left unset it
           # is built from PREFECT_SERVER_API_HOST/PORT, not the port the server was started on:
           # server.ui.api_url in https://docs.prefect.io/v3/api-ref/settings-ref).
           "PREFECT_SERVER_UI_API_URL": f"http://127.0.0.1:{port}/api",
           # Every loop, the cancellation clean-up queues a job for each run cancelled in the
           # last day, to cancel its unfinished task runs. On this SQLite server 100 such runs
           # (a day of `make test`) kept a tenth of a core busy at the 20 s default; at 2 min
           # it is a sixtieth. Our tasks end Cancelled themselves (jobs/slurm.py ends_cancelled),
           # so only tasks of other flows wait longer for their state.
           "PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_LOOP_SECONDS": "120"}
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_API_AUTH_STRING", None)
    return env


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1) as resp:
            return json.loads(resp.read()) is True
    except (OSError, ValueError):
        return False


def _refuses_anonymous(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/admin/version", timeout=5).close()
    except urllib.error.HTTPError as error:
        return error.code == 401
    except OSError:
        return True  # not answering: nothing to restart for
    return False


def up(root: Path, port: int, auth: str) -> int:
    pid_file = root / "run" / "prefect.pid"
    if (pid := running_pid(pid_file)) is not None:
        if _refuses_anonymous(port):
            return pid
        down(root)  # started by an older checkout, open to anyone: start it again with the credential
    (root / "run").mkdir(parents=True, exist_ok=True)
    log = root / "log" / "prefect.log"
    prefect = str(Path(sys.executable).with_name("prefect"))
    pid = start_detached([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                         log, pid_file, env=server_env(root, port, auth))
    wait_until(lambda: _healthy(port), 120, f"the Prefect server on port {port}", log)
    return pid


def down(root: Path) -> bool:
    # The server runs uvicorn in child processes: stop its whole session.
    return stop(root / "run" / "prefect.pid", group=True)


def status(root: Path) -> int | None:
    return running_pid(root / "run" / "prefect.pid")
