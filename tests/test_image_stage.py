"""The image stage on the local Slurm cluster: a real podman build of a tiny image (FROM scratch:
no registry is reachable, and a build without RUN starts no container) in a Slurm job, imported
to a squashfs whose contents unsquashfs lists; a second call finds the manifest and submits nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from prefect import flow

from pretrain.presets import load_spec
from pretrain.spec import ImageSpec
from render.image import SANDBOX_PODMAN_FLAGS
from tasks.image import build_image


@pytest.fixture(autouse=True)
def image_tools():
    """Installed by make test (deployments/stack/install-debian.sh): missing, the install broke,
    and that fails here rather than skipping the stage's only real build."""
    missing = [tool for tool in ("podman", "mksquashfs") if not shutil.which(tool)]
    assert not missing, f"{', '.join(missing)} not on PATH: run make system-deps (podman, squashfs-tools)"


@flow
def image_once(spec):
    return build_image.with_options(retries=0)(spec)


@pytest.fixture
def runroot():
    """podman's runroot: at most 50 characters, which pytest's tmp_path is not."""
    path = tempfile.mkdtemp(prefix="podman-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_image_is_built_on_a_node_imported_to_squashfs_and_reused(local_stack, tmp_path, runroot):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "nccl.conf").write_text("NCCL_DEBUG=INFO\n")
    spec = load_spec("gpt3-7.5b-gpu", [f"paths.root={tmp_path / 'root'}", "cluster.executor=slurm"])
    # podman's storage in the test's directory, with the flags this machine needs
    spec.backend.megatron_lm.image = ImageSpec(
        base="scratch", install_project=False, copy_files={"/opt/site": str(tmp_path / "site")},
        env={"NCCL_SOCKET_IFNAME": "^lo"},
        engine_flags=["--root", str(tmp_path / "storage"), "--runroot", runroot, *SANDBOX_PODMAN_FLAGS])
    state = image_once(spec, return_state=True)
    assert state.is_completed(), state.message
    squashfs = Path(state.result())
    listing = subprocess.run(["unsquashfs", "-l", str(squashfs)], capture_output=True, text=True, check=True).stdout
    assert {"squashfs-root/opt/site/nccl.conf", "squashfs-root/etc/environment"} <= set(listing.split())
    environment = subprocess.run(["unsquashfs", "-cat", str(squashfs), "etc/environment"], capture_output=True,
                                 text=True, check=True).stdout
    assert "NCCL_SOCKET_IFNAME=^lo" in environment.splitlines()
    done = json.loads((squashfs.parent / "MANIFEST.json").read_text())
    assert done["engine"] == "podman" and done["importer"] == "mksquashfs" and done["layers"] == 1
    assert set(done["files"]) == {"image.sqsh"}  # the build context is gone
    jobs = sorted((tmp_path / "root" / "jobs").iterdir())
    assert len(jobs) == 1
    assert image_once(spec, return_state=True).result() == str(squashfs)
    assert sorted((tmp_path / "root" / "jobs").iterdir()) == jobs  # a cache hit submits nothing
