"""Prefect's ephemeral API: with no PREFECT_API_URL, the first call to the API (a flow run, a
block's load) starts a temporary server on PREFECT_HOME's database. The `pretrain` command and
the demo start it with these settings."""

from __future__ import annotations

import os

# Settings of the ephemeral Prefect API server (a subprocess that inherits this process's
# environment), each kept where the user set it already:
# - it migrates a new database before it answers: on a fresh machine with two busy cores that took
#   longer than Prefect's default 20 s wait (seen in CI);
# - its telemetry service (prefect.server.services.telemetry, on by default) writes a session row
#   to the server's SQLite database as soon as the server is up, while the server's other services
#   and the flow's first API calls write too. SQLite takes one writer at a time: on a busy machine
#   the service lost the lock and logged a full SQLAlchemy traceback ("database is locked") before
#   anything else of the demo, and offline its heartbeat to Prefect's servers fails with an error
#   line. Neither the demo nor a `pretrain plan` that reads a credentials block has any business
#   reporting to Prefect; the local stack's server (deployments/stack/prefect_server.py) and the
#   tests turn the service off the same way.
EPHEMERAL_SERVER_SETTINGS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def configure_ephemeral_server() -> None:
    """Set :data:`EPHEMERAL_SERVER_SETTINGS` before anything (a flow run, a block's load) starts the server."""
    for name, value in EPHEMERAL_SERVER_SETTINGS.items():
        os.environ.setdefault(name, value)
