"""Shared fixtures: the real local stack (Slurm, S3) and a Prefect API for the whole run, and
the rules that let `make test` run the suite on three pytest-xdist workers (`--dist loadfile`)
beside one stack."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from pathlib import Path

import boto3
import pytest

# The modules that take longest go first, so that the workers finish together: loadfile hands
# out whole modules in collection order, one to each worker as it frees up. (Measured with
# `pytest --durations=0`; docs/benchmarks.md.)
SLOWEST_FIRST = ("test_deployments.py", "test_train_task.py", "test_train_loop.py", "test_pretrain_flow.py",
                 "test_slurm_jobs.py")
# Serialises the tests marked `alone` against every other test of the run, on either worker.
LANE_LOCK = Path(os.environ.get("PRETRAIN_TEST_LOCK", "/tmp/pretrain-tests.lock"))
TURNSTILE = LANE_LOCK.with_suffix(".turnstile")


def _alone(item) -> bool:
    return item.get_closest_marker("alone") is not None


def pytest_collection_modifyitems(items):
    """Modules slowest first; in each module the tests marked ``alone`` first: while one runs the
    other workers wait, and at the start of a module it waits for their current tests once, not
    once for each such test as they come up between the module's others."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    # stable: file order kept otherwise
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), not _alone(item)))


@contextlib.contextmanager
def _locked(path: Path, mode: int):
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)



@contextlib.contextmanager
def _shared():
    """The lane lock shared, once no ``alone`` test is waiting for it (the turnstile gives those
    priority: while one waits, no test takes the shared lock anew)."""
    with _locked(TURNSTILE, fcntl.LOCK_EX):
        pass
    with _locked(LANE_LOCK, fcntl.LOCK_SH):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``alone`` runs with nothing else of the suite beside it: it needs the Slurm
    node idle (it drains it) or it judges time against the machine's CPUs (a
    trainer's start-up against a time limit, throughput). Every other test holds the lane lock
    shared around its whole protocol, so that its module's fixtures (a tokenized corpus, a
    deployed worker) are never set up beside an ``alone`` test either."""
    if _alone(item):
        return (yield)  # its phases take the lock themselves
    with _shared():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """An ``alone`` test's fixtures are set up beside the other workers' tests, as theirs are;
    only the test itself runs alone."""
    if not _alone(item):
        return (yield)
    with _shared():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _alone(item):
        return (yield)
    with _locked(TURNSTILE, fcntl.LOCK_EX), _locked(LANE_LOCK, fcntl.LOCK_EX):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if not _alone(item):
        return (yield)
    with _shared():
        return (yield)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One temporary Prefect API server for the run, with its own PREFECT_HOME so results and
    blocks never leak between runs (the harness does not isolate PREFECT_HOME itself)."""
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.pop("PREFECT_API_URL", None)
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
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

    with _locked(LANE_LOCK.with_suffix(".stack"), fcntl.LOCK_EX):  # both workers may ask at once
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
