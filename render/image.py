"""The training image from the spec: its Containerfile, and the script a build node runs to build
it with podman (or docker) and import it to the squashfs pyxis starts (``srun --container-image``).

The runbooks' GPU recipe, step for step: build on the NGC PyTorch image with the EFA installer's
user-space libraries, aws-ofi-nccl built against them, and Megatron-LM cloned at a pinned revision
(aws-samples/awsome-distributed-training ``3.test_cases/megatron/megatron-lm/aws-megatron-lm.Dockerfile``,
whose installer flags, configure options and library paths are those below), then
``enroot import -o megatron-training.sqsh dockerd://megatron-training:latest``. enroot's importers
for images held by a local engine are ``dockerd://`` and ``podman://`` (NVIDIA/enroot
``doc/cmd/import.md``). Where the node has no enroot, the image is exported to a root filesystem
and packed with ``mksquashfs``, with its ENV written to ``/etc/environment``, where enroot reads a
container's environment (NVIDIA/enroot ``doc/image-format.md``).
"""

from __future__ import annotations

import re
import shlex
from importlib.metadata import requires, version

from pretrain.spec import ImageSpec

# Global podman flags that make a rootful podman build work on a machine without systemd, on
# cgroup v1, inside a container (this project's test machine): vfs, because overlay cannot be
# mounted on the overlay root filesystem; cgroupfs and the file events backend, because podman's
# defaults (the systemd cgroup manager, journald) need a running systemd
# (containers/podman docs/source/markdown/podman.1.md). A build without RUN steps starts no
# container, so no OCI runtime setting is needed. podman refuses a --runroot longer than 50
# characters ("the specified runroot is longer than 50 characters"). A GPU cluster's build node wants overlay on
# its local disk instead: `engine_flags: [--root, /opt/dlami/nvme/containers]`.
SANDBOX_PODMAN_FLAGS = ("--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file")

MEGATRON_LM_DIR = "/workspace/Megatron-LM"  # where render/megatron_lm.py runs pretrain_gpt.py from
PROJECT_DIR = "/opt/pretrain-pipeline"
# Names inside the build context the image stage assembles.
CONTAINERFILE = "Containerfile"
PROJECT_CONTEXT = "pretrain-pipeline"
FILES_CONTEXT = "files"
SQUASHFS = "image.sqsh"  # in the image stage's output directory
# Pulling a multi-GB NGC base and pip-installing takes tens of minutes; the training's own
# time limit (days) is no bound for a build job.
BUILD_TIME_LIMIT_MIN = 120
# The exit status of the build script when the node lacks a tool: no retry can install it.
MISSING_TOOL_EXIT = 3


def image_tag(spec_name: str, key: str) -> str:
    """``localhost/pretrain-<name>:<key[:16]>``: the engine's local name for one key's image."""
    slug = re.sub(r"[^a-z0-9_.-]+", "-", spec_name.lower()).strip("-.") or "image"
    return f"localhost/pretrain-{slug}:{key[:16]}"


def copied_files(image: ImageSpec) -> list[tuple[str, str, str]]:
    """(name in the build context, source path, destination in the image) of ``copy_files``, in
    destination order; numbered, since two sources may share a base name."""
    return [(f"{FILES_CONTEXT}/{i}", src, dst) for i, (dst, src) in enumerate(sorted(image.copy_files.items()))]


def efa_steps(image: ImageSpec) -> list[str]:
    """The EFA installer (user space: no kernel module, no limits, no verification, as a container
    build needs) and aws-ofi-nccl built against its libfabric, both on the library path. The base's
    own verbs packages go first: the installer brings its rdma-core, which they hold back."""
    if not image.efa_installer:
        return []
    efa = f"aws-efa-installer-{image.efa_installer}"
    steps = ["RUN apt-get update \\\n"
             " && apt-get remove -y --allow-change-held-packages ibverbs-utils libibverbs-dev libibverbs1 libmlx5-1 \\\n"
             f" && cd /tmp && curl -fsSLO https://efa-installer.amazonaws.com/{efa}.tar.gz \\\n"
             f" && tar -xf {efa}.tar.gz && cd aws-efa-installer \\\n"
             " && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \\\n"
             f" && cd /tmp && rm -rf aws-efa-installer {efa}.tar.gz /var/lib/apt/lists/*"]
    paths = ["/opt/amazon/openmpi/lib", "/opt/amazon/efa/lib"]
    if image.aws_ofi_nccl:
        ofi = f"aws-ofi-nccl-{image.aws_ofi_nccl}"
        steps.append(
            "RUN apt-get update && apt-get install -y --no-install-recommends libhwloc-dev && rm -rf /var/lib/apt/lists/* \\\n"
            f" && cd /tmp && curl -fsSLO https://github.com/aws/aws-ofi-nccl/releases/download/v{image.aws_ofi_nccl}/{ofi}.tar.gz \\\n"
            f" && tar -xf {ofi}.tar.gz && cd {ofi} \\\n"
            " && ./configure --prefix=/opt/aws-ofi-nccl/install --with-mpi=/opt/amazon/openmpi \\\n"
            "    --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda --enable-platform-aws \\\n"
            f" && make -j \"$(nproc)\" && make install && cd /tmp && rm -rf {ofi} {ofi}.tar.gz")
        paths.append("/opt/aws-ofi-nccl/install/lib")
    # Unquoted, so that the engine expands the base image's own values.
    return steps + [f"ENV LD_LIBRARY_PATH={':'.join(paths)}:$LD_LIBRARY_PATH",
                    "ENV PATH=/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:$PATH"]


def containerfile(image: ImageSpec, project_version: str, runtime: list[str]) -> str:
    """Slowest-changing steps first, so that a rebuild after a change reuses the engine's cached
    layers above it: the base, EFA and Megatron-LM, then pip packages and files, then this
    project, then ENV (setting a variable rebuilds nothing else). ``runtime``: the pinned packages
    the project needs inside the container (:func:`runtime_requirements`)."""
    lines = ["# Rendered by pretrain-pipeline from backend.megatron_lm.image (render/image.py).",
             f"FROM {image.base}", *efa_steps(image)]
    if image.megatron_lm_commit:
        lines.append(f"RUN git clone --no-checkout {shlex.quote(image.megatron_lm_repository)} {MEGATRON_LM_DIR} \\\n"
                     f" && git -C {MEGATRON_LM_DIR} checkout {image.megatron_lm_commit}")
    if image.pip:
        lines.append("RUN pip install --no-cache-dir " + " ".join(shlex.quote(req) for req in image.pip))
    lines += [f"COPY {name} {dst}" for name, _, dst in copied_files(image)]
    if image.install_project:
        # The job layer unpickles its command with submitit inside the container, and the device
        # sampler reads the GPUs through NVML: those, and this project without its control-plane
        # dependencies.
        lines += ["RUN pip install --no-cache-dir " + " ".join(shlex.quote(req) for req in runtime),
                  f"COPY {PROJECT_CONTEXT} {PROJECT_DIR}",
                  f"RUN pip install --no-cache-dir --no-deps {PROJECT_DIR}",
                  f"LABEL org.opencontainers.image.version={project_version}"]
    lines += [f"ENV {name}={_env_value(value)}" for name, value in sorted(image.env.items())]
    return "\n".join(lines) + "\n"


def runtime_requirements() -> list[str]:
    """What the image installs beside the project, at the versions installed here: the submitit
    the flow pickles with, and the ``gpu`` extra (nvidia-ml-py, the device sampler's NVML), which
    the NGC PyTorch base does not ship."""
    gpu = [req.partition(";")[0].strip() for req in requires("pretrain-pipeline") or [] if 'extra == "gpu"' in req]
    return [f"submitit=={version('submitit')}", *gpu]


def installed_containerfile(image: ImageSpec) -> str:
    """The Containerfile for the project and the packages installed here, which the image must match."""
    return containerfile(image, version("pretrain-pipeline"), runtime_requirements())


def _env_value(value: str) -> str:
    """A Containerfile ENV value: double-quoted (Containerfile syntax, not shell) where needed."""
    if value and not re.search(r'[\s"\\$]', value):
        return value
    return '"' + re.sub(r'(["\\$])', r"\\\1", value) + '"'


def build_script(image: ImageSpec, tag: str, context: str, output: str, record: str) -> str:
    """What the build node runs: build ``tag`` from ``context``, import it to ``output`` (a .sqsh)
    and write ``record`` (JSON: engine, importer, size, layers, seconds). A missing tool writes
    ``{"error": ...}`` there and exits ``MISSING_TOOL_EXIT``, so the stage fails at once with it."""
    q = shlex.quote
    flags = " ".join(q(flag) for flag in image.engine_flags)
    return f"""set -euo pipefail
missing() {{ printf '{{"error": "%s"}}\\n' "$1" > {q(record)}; echo "$1" >&2; exit {MISSING_TOOL_EXIT}; }}
if command -v podman >/dev/null; then engine=podman; enroot_source=podman
elif command -v docker >/dev/null; then engine=docker; enroot_source=dockerd
else missing "no podman or docker on $(hostname): install podman (apt-get install podman) or docker on the build node"
fi
if ! command -v enroot >/dev/null && ! command -v mksquashfs >/dev/null; then
  missing "neither enroot nor mksquashfs on $(hostname): install enroot, or squashfs-tools (apt-get install squashfs-tools)"
fi
run_engine() {{ "$engine" {flags} "$@"; }}
run_engine build --tag {q(tag)} --file {q(context)}/{CONTAINERFILE} {q(context)}
built=$SECONDS
size=$(run_engine image inspect --format '{{{{.Size}}}}' {q(tag)})
layers=$(run_engine image inspect --format '{{{{len .RootFS.Layers}}}}' {q(tag)})
if command -v enroot >/dev/null; then
  importer=enroot
  enroot import --output {q(output)} "$enroot_source://{tag}"
else
  importer=mksquashfs
  rootfs={q(output)}.rootfs
  rm -rf "$rootfs" && mkdir -p "$rootfs/etc"
  container=$(run_engine create {q(tag)} true)
  run_engine export "$container" | tar --numeric-owner -xf - -C "$rootfs"
  run_engine rm "$container" >/dev/null
  run_engine image inspect --format '{{{{range .Config.Env}}}}{{{{println .}}}}{{{{end}}}}' {q(tag)} > "$rootfs/etc/environment"
  mksquashfs "$rootfs" {q(output)} -noappend -quiet
  rm -rf "$rootfs"
fi
printf '{{"engine": "%s", "importer": "%s", "image_bytes": %s, "layers": %s, "build_seconds": %s, "seconds": %s}}\\n' \\
  "$engine" "$importer" "$size" "$layers" "$built" "$SECONDS" > {q(record)}
"""
