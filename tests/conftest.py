"""Shared fixtures: the real local stack (Slurm, S3) and a Prefect API for the whole run, and
the order in which `make test` hands modules to its pytest-xdist workers (`--dist loadfile`)."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import boto3
import pytest

# One thread per process: three workers, their jobs and their ranks share two cores, and a
# second OpenMP thread each only spins (a tiny-local run took 13 % more CPU with two). Set
# before anything imports torch; every process the tests start themselves inherits it. Slurm jobs
# inherit nothing of it (jobs/slurm.py exports a fixed list): the native launch sets their ranks'
# threads from cluster.cpus_per_task (render/native.py), which the one-rank tests set to 1.
os.environ["OMP_NUM_THREADS"] = "1"

# The modules that take longest go first, so that the workers finish together: loadfile hands
# out whole modules in collection order, one to each worker as it frees up. (Measured with
# `pytest --durations=0`; docs/benchmarks.md.)
SLOWEST_FIRST = ("test_run_chain_jobs.py", "test_train_task.py", "test_deployments.py", "test_train_loop.py",
                 "test_nodes.py", "test_slurm_jobs.py", "test_pretrain_flow.py", "test_fail_fast.py")
STACK_LOCK = Path("/tmp/pretrain-tests.stack.lock")


def pytest_collection_modifyitems(items):
    """Modules slowest first."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept otherwise


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One temporary Prefect API server for the run, with its own PREFECT_HOME so results and
    blocks never leak between runs (the harness does not isolate PREFECT_HOME itself)."""
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.pop("PREFECT_API_URL", None)
    from prefect.testing.utilities import prefect_test_harness

    # Its first start creates the database schema: 2 min once, on cores shared with a chaos soak.
    with prefect_test_harness(server_startup_timeout=300):
        yield


@pytest.fixture(autouse=True)
def prefect_api(request):
    """Every test but the pure ones (``pytest.mark.pure``: `make check`) talks to the harness."""
    if request.node.get_closest_marker("pure") is None:
        request.getfixturevalue("prefect_harness")


@pytest.fixture(scope="session")
def local_stack():
    """The project's Slurm cluster and S3 server, started if they are not running yet."""
    from deployments import stack

    with open(STACK_LOCK, "a") as lock:  # the workers may ask at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        stack.up(components=("slurm", "s3"))
    env = stack.environment()
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    return env


@pytest.fixture(scope="session")
def s3_endpoint(local_stack) -> str:
    return local_stack["PRETRAIN_S3_ENDPOINT"]


@pytest.fixture
def s3(s3_endpoint):
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


@pytest.fixture
def shared_dir(tmp_path) -> Path:
    """A directory the Slurm jobs can reach (single node: any local path is shared)."""
    return tmp_path


@pytest.fixture
def clean_queue():
    """Job names whose jobs are cancelled after the test, pass or fail, so that a failed test
    leaves the next one (on either worker) an idle node; the tests assert that nothing was left
    themselves."""
    names: list[str] = []
    yield names
    for name in names:
        subprocess.run(["scancel", "-n", name], check=False)


@pytest.fixture
def filesystem(tmp_path):
    """A real filesystem of the size asked for, a tmpfs (root needed), unmounted afterwards. Its size is
    a limit, not memory taken: only what is written to it takes memory, so a test of a run's
    checkpoint room may have one as large as a cluster's shared filesystem."""
    mount, mounted = tmp_path / "fs", []
    mount.mkdir()

    def of_size(size: int) -> Path:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size // 1024}k", "tmpfs", str(mount)],
                              capture_output=True, text=True)
        assert done.returncode == 0, f"cannot mount a tmpfs (root needed): {done.stderr}"
        mounted.append(mount)
        return mount

    yield of_size
    for path in mounted:
        subprocess.run(["umount", "--lazy", str(path)], check=True)  # lazy: detached even while a file is open
