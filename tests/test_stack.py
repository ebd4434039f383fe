"""`pretrain stack` lifecycle on a second, isolated stack (own directory and ports), so the
stack the rest of the suite uses is never disturbed."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import pytest

from deployments import stack
from deployments.stack.processes import alive

BASE_PORT = 7817


@pytest.fixture(scope="module")
def second_stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack")
    yield root
    stack.down(root)


def slurm_env(root) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": stack.environment(root)["SLURM_CONF"]}


def sbatch_and_wait(root, script: str = "hostname") -> str:
    env = slurm_env(root)
    job_id = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", script], env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id], env=env,
                             capture_output=True, text=True).stdout.strip()
        if out == "COMPLETED":
            return job_id
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not complete (sacct: {out!r})")


def all_pids(state: dict) -> list[int]:
    return [pid for pids in state.values() for pid in pids.values()]


def test_up_starts_every_component_and_is_idempotent(second_stack):
    stack.up(second_stack, base_port=BASE_PORT)
    first = stack.status(second_stack)
    assert all(all_pids(first)), first
    env = stack.environment(second_stack)
    assert env["SLURM_CONF"].startswith(str(second_stack))
    assert sbatch_and_wait(second_stack)
    stack.up(second_stack)
    assert stack.status(second_stack) == first  # the same processes: nothing was started again

    s3 = boto3.client("s3", endpoint_url=env["PRETRAIN_S3_ENDPOINT"], region_name="us-east-1",
                      aws_access_key_id="x", aws_secret_access_key="x")
    s3.create_bucket(Bucket="stack-test")
    s3.put_object(Bucket="stack-test", Key="k", Body=b"v")
    assert s3.get_object(Bucket="stack-test", Key="k")["Body"].read() == b"v"
    with urllib.request.urlopen(env["PREFECT_API_URL"] + "/health", timeout=5) as resp:
        assert json.loads(resp.read()) is True
    # A day of cancelled runs must not keep the idle server busy (deployments/stack/prefect_server.py).
    with urllib.request.urlopen(api_request(env, "/admin/settings"), timeout=5) as resp:
        assert json.loads(resp.read())["server"]["services"]["cancellation_cleanup"]["loop_seconds"] == 120


def api_request(env: dict[str, str], path: str, auth: str | None = None) -> urllib.request.Request:
    """A request to the stack's Prefect API with basic authentication, as Prefect's client sends it."""
    token = base64.b64encode((auth or env["PREFECT_API_AUTH_STRING"]).encode()).decode()
    return urllib.request.Request(env["PREFECT_API_URL"] + path, headers={"Authorization": f"Basic {token}"})


def test_the_prefect_server_refuses_a_client_without_the_stacks_credential(second_stack):
    """The API hands out the Secret blocks (the Hub token, S3 keys) and starts runs: only a client
    with the credential in stack.json (owner-only) gets an answer, through Prefect's own client too."""
    stack.up(second_stack, base_port=BASE_PORT)
    env = stack.environment(second_stack)
    assert (second_stack / "stack.json").stat().st_mode & 0o777 == 0o600
    for auth in (None, "pretrain:a-guess"):
        request = (urllib.request.Request(env["PREFECT_API_URL"] + "/admin/version") if auth is None
                   else api_request(env, "/admin/version", auth))
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401
    with urllib.request.urlopen(api_request(env, "/admin/version"), timeout=5) as resp:
        assert resp.status == 200
    exported = subprocess.run([sys.executable, "-m", "cli.main", "stack", "env", "--dir", str(second_stack)],
                              capture_output=True, text=True, check=True).stdout
    shell = {**os.environ, "PREFECT_HOME": str(second_stack / "client-home")}
    shell.pop("PREFECT_API_AUTH_STRING", None)
    client = "from prefect.client.orchestration import get_client\nwith get_client(sync_client=True) as c: c.hello()"
    for preamble, works in (("", True), ("unset PREFECT_API_AUTH_STRING; ", False)):
        done = subprocess.run(["bash", "-c", f'{exported}\n{preamble}"{sys.executable}" -c "$0"', client],
                              env=shell, capture_output=True, text=True, timeout=120)
        assert (done.returncode == 0) == works, done.stderr[-2000:]
    assert "401" in done.stderr


def test_up_recovers_after_a_daemon_is_killed(second_stack):
    stack.up(second_stack, base_port=BASE_PORT)
    victim = stack.status(second_stack)["slurm"]["slurmctld"]
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.5)
    stack.up(second_stack)
    state = stack.status(second_stack)
    assert state["slurm"]["slurmctld"] not in (None, victim)
    assert sbatch_and_wait(second_stack)


def test_up_restarts_slurm_that_runs_on_an_older_checkouts_settings(second_stack):
    """A stack started before the preemption slot existed: `up` writes today's settings and
    restarts the two daemons that read them, and leaves the others running."""
    stack.up(second_stack, base_port=BASE_PORT)
    before = stack.status(second_stack)["slurm"]
    conf = Path(stack.environment(second_stack)["SLURM_CONF"])
    conf.write_text(conf.read_text().replace(" Gres=preemptslot:1", ""))
    stack.up(second_stack)
    after = stack.status(second_stack)["slurm"]
    assert {d for d in before if after[d] != before[d]} == {"slurmctld", "slurmd"}
    node = subprocess.run(["scontrol", "show", "node", "localhost"], env=slurm_env(second_stack),
                          capture_output=True, text=True, check=True).stdout
    assert "Gres=preemptslot:1" in node
    assert sbatch_and_wait(second_stack, "true")


def test_reset_restarts_job_ids_with_no_stale_accounting(second_stack):
    stack.up(second_stack, base_port=BASE_PORT)
    sbatch_and_wait(second_stack)
    stack.reset(second_stack, components=("slurm",))
    env = slurm_env(second_stack)
    assert subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID", "-S", "2000-01-01"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip() == ""
    assert sbatch_and_wait(second_stack) == "1"


def test_command_line_status_env_and_down(second_stack):
    stack.up(second_stack, base_port=BASE_PORT)
    cli = [sys.executable, "-m", "cli.main", "stack"]
    status = subprocess.run([*cli, "status", "--dir", str(second_stack)], capture_output=True, text=True)
    assert status.returncode == 0 and "slurm    up" in status.stdout
    env = subprocess.run([*cli, "env", "--dir", str(second_stack)], capture_output=True, text=True, check=True)
    assert f"export SLURM_CONF={second_stack}" in env.stdout
    pids = all_pids(stack.status(second_stack))
    down = subprocess.run([*cli, "down", "--dir", str(second_stack)], capture_output=True, text=True, check=True)
    assert "slurmctld" in down.stdout and "prefect" in down.stdout
    time.sleep(0.5)
    assert not any(alive(pid) for pid in pids)
    after = subprocess.run([*cli, "status", "--dir", str(second_stack)], capture_output=True, text=True)
    assert after.returncode == 1 and "DOWN" in after.stdout
