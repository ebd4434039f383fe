"""The image stage's rendering: the Containerfile and build script from the spec, what moves the
image's key, the spec's checks, and the dry run of gpt3-7.5b-gpu (builds its image, trains in it)."""

from __future__ import annotations

import json
import subprocess

import pytest
from pydantic import ValidationError

from pretrain.presets import load_spec
from pretrain.spec import ImageSpec
from render.image import MISSING_TOOL_EXIT, build_script, containerfile, image_tag
from flows.dry_run import render_files
from tasks.image import image_key_inputs, project_files

pytestmark = pytest.mark.pure

GPU_CONTAINERFILE = """\
# Rendered by pretrain-pipeline from backend.megatron_lm.image (render/image.py).
FROM nvcr.io/nvidia/pytorch:24.09-py3
RUN apt-get update \\
 && apt-get remove -y --allow-change-held-packages ibverbs-utils libibverbs-dev libibverbs1 libmlx5-1 \\
 && cd /tmp && curl -fsSLO https://efa-installer.amazonaws.com/aws-efa-installer-1.42.0.tar.gz \\
 && tar -xf aws-efa-installer-1.42.0.tar.gz && cd aws-efa-installer \\
 && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \\
 && cd /tmp && rm -rf aws-efa-installer aws-efa-installer-1.42.0.tar.gz /var/lib/apt/lists/*
RUN apt-get update && apt-get install -y --no-install-recommends libhwloc-dev && rm -rf /var/lib/apt/lists/* \\
 && cd /tmp && curl -fsSLO https://github.com/aws/aws-ofi-nccl/releases/download/v1.16.0/aws-ofi-nccl-1.16.0.tar.gz \\
 && tar -xf aws-ofi-nccl-1.16.0.tar.gz && cd aws-ofi-nccl-1.16.0 \\
 && ./configure --prefix=/opt/aws-ofi-nccl/install --with-mpi=/opt/amazon/openmpi \\
    --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda --enable-platform-aws \\
 && make -j "$(nproc)" && make install && cd /tmp && rm -rf aws-ofi-nccl-1.16.0 aws-ofi-nccl-1.16.0.tar.gz
ENV LD_LIBRARY_PATH=/opt/amazon/openmpi/lib:/opt/amazon/efa/lib:/opt/aws-ofi-nccl/install/lib:$LD_LIBRARY_PATH
ENV PATH=/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:$PATH
RUN git clone --no-checkout https://github.com/NVIDIA/Megatron-LM.git /workspace/Megatron-LM \\
 && git -C /workspace/Megatron-LM checkout 55ac7082517c3878ae653c07c09c534b8aed49f6
RUN pip install --no-cache-dir submitit==1.5.4 nvidia-ml-py==13.615.71
COPY pretrain-pipeline /opt/pretrain-pipeline
RUN pip install --no-cache-dir --no-deps /opt/pretrain-pipeline
LABEL org.opencontainers.image.version=0.1.0
ENV NCCL_ASYNC_ERROR_HANDLING=1
ENV NCCL_DEBUG=INFO
ENV NCCL_SOCKET_IFNAME=^docker,lo,veth_def_agent
"""
RUNTIME = ["submitit==1.5.4", "nvidia-ml-py==13.615.71"]


def test_the_gpu_presets_containerfile_is_the_runbooks_image_with_this_project():
    """The runbook's image (aws-megatron-lm.Dockerfile): EFA, aws-ofi-nccl on the library path,
    Megatron-LM at its commit, its NCCL settings; and this project with what it runs in the
    container: submitit for the job layer, nvidia-ml-py for the device sampler's NVML."""
    image = load_spec("gpt3-7.5b-gpu").backend.megatron_lm.image
    assert containerfile(image, "0.1.0", RUNTIME) == GPU_CONTAINERFILE


def test_the_image_installs_the_device_samplers_nvml_at_the_projects_pin():
    """The pins of pyproject.toml's gpu extra, which pip's --no-deps install of the project skips."""
    import tomllib
    from pathlib import Path

    from render.image import installed_containerfile

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rendered = installed_containerfile(load_spec("gpt3-7.5b-gpu").backend.megatron_lm.image)
    [runtime] = [line for line in rendered.splitlines() if "submitit==" in line]
    assert extras["gpu"] and all(f" {pin}" in runtime for pin in extras["gpu"])


def test_aws_ofi_nccl_without_the_efa_installer_is_refused():
    with pytest.raises(ValidationError, match="aws_ofi_nccl is built against the EFA installer's libfabric: "
                                              "set backend.megatron_lm.image.efa_installer"):
        ImageSpec(base="scratch", aws_ofi_nccl="1.16.0")


def test_pip_files_and_env_in_their_order_env_quoted_as_a_containerfile_reads_it():
    image = ImageSpec(base="scratch", install_project=False, pip=["nvidia-ml-py==12.560.30"],
                      copy_files={"/opt/b.conf": "/x/b", "/etc/a.conf": "/x/a"},
                      env={"NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa", "NOTE": 'a "b" $c'})
    assert containerfile(image, "0.1.0", RUNTIME).splitlines()[1:] == [
        "FROM scratch", "RUN pip install --no-cache-dir nvidia-ml-py==12.560.30",
        "COPY files/0 /etc/a.conf", "COPY files/1 /opt/b.conf",
        "ENV FI_PROVIDER=efa", "ENV NCCL_DEBUG=INFO", 'ENV NOTE="a \\"b\\" \\$c"']


@pytest.mark.parametrize(("field", "value", "says"), [
    ("megatron_lm_commit", "core_v0.16.1", "full 40-hex commit"),
    ("pip", ["nvidia-ml-py"], "pin each package"),
    ("copy_files", {"etc/a.conf": "/x"}, "must be absolute"),
    ("efa_installer", "latest; rm -rf /", "give a release number"),
])
def test_an_image_that_could_change_under_its_key_is_refused_naming_the_field(field, value, says):
    with pytest.raises(ValidationError, match=f"backend.megatron_lm.image.{field}.*{says}"):
        ImageSpec(base="scratch", **{field: value})


def test_image_and_container_image_together_are_refused():
    with pytest.raises(ValueError, match="container_image=.* and backend.megatron_lm.image are both set"):
        load_spec("gpt3-7.5b-gpu", ["backend.megatron_lm.container_image=nvcr.io/nvidia/pytorch:24.09-py3"])


def test_the_key_follows_the_containerfile_and_the_files_not_where_the_engine_keeps_them(tmp_path):
    (tmp_path / "nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    image = ImageSpec(base="scratch", install_project=False, copy_files={"/etc/nccl.conf": str(tmp_path / "nccl.conf")})
    key = image_key_inputs(image, {})
    assert image_key_inputs(image.model_copy(update={"engine_flags": ["--root", "/nvme"]}), {}) == key
    assert image_key_inputs(image.model_copy(update={"env": {"A": "1"}}), {}) != key
    (tmp_path / "nccl.conf").write_text("NCCL_DEBUG=INFO\n")
    assert image_key_inputs(image, {}) != key


def test_the_project_goes_in_as_pip_installs_it():
    files = project_files()
    assert {"pyproject.toml", "README.md", "jobs/node.py", "trainer/__main__.py",
            "deployments/presets/gpt3-7.5b-gpu.yaml"} <= set(files)
    assert not any(rel.startswith(("tests/", "docs/")) or "__pycache__" in rel for rel in files)


def test_a_build_node_without_podman_or_docker_fails_at_once_saying_what_to_install(tmp_path):
    image = ImageSpec(base="scratch", install_project=False)
    script = build_script(image, image_tag("x", "0" * 16), str(tmp_path), str(tmp_path / "x.sqsh"),
                          str(tmp_path / "record.json"))
    done = subprocess.run(["/bin/bash", "-c", script], env={"PATH": str(tmp_path)}, capture_output=True, text=True)
    assert done.returncode == MISSING_TOOL_EXIT
    assert "install podman (apt-get install podman) or docker" in json.loads((tmp_path / "record.json").read_text())["error"]


def test_the_gpu_preset_renders_its_image_build_and_trains_in_the_squashfs():
    files = render_files(load_spec("gpt3-7.5b-gpu"))
    assert "FROM nvcr.io/nvidia/pytorch:24.09-py3" in files["Containerfile"]
    build = files["build_image.sh"]
    assert "build --tag 'localhost/pretrain-gpt3-7.5b-gpu:<key>'" in build
    assert 'enroot import --output \'<image-output>/image.sqsh\' "$enroot_source://localhost/pretrain-gpt3-7.5b-gpu:<key>"' in build
    assert "#SBATCH --time=120" in files["sbatch_image.sh"] and "gpus" not in files["sbatch_image.sh"]
    train = files["sbatch_train.sh"]
    # pyxis starts the built squashfs on the shared filesystem, and submitit with the image's Python
    assert "'--container-image=<image-output>/image.sqsh' --container-mounts=/fsx:/fsx python -u -m submitit.core._submit" in train
    assert "/fsx/pretrain/jobs/" in train
