"""Shared fixtures: the real local stack (Slurm, S3) and a Prefect API for the whole run."""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest


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
