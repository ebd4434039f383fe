"""image (container backends): build the training image on a node of the cluster, as the GPU
runbooks advise (the head node's disk is small), and import it to a squashfs on the shared
filesystem that the train stage hands to pyxis (``srun --container-image``).

The key is the rendered Containerfile (base, Megatron-LM commit, pip pins, ENV, the project's
and submitit's versions) and the content of everything copied into the build context: the
files the spec names and this project's source. Never the git commit: an edit to a test or a
document builds nothing. An unchanged image is never rebuilt; a changed one is built with the
engine's layer cache on that node, so only the steps after the change run again.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger

from tasks.executor import cluster_for, job_folder, run_job
from jobs.node import Command
from jobs.contract import JobFailed, ends_cancelled, stage_request
from pretrain import manifest
from pretrain.spec import ImageSpec, PretrainSpec
from render.image import (BUILD_TIME_LIMIT_MIN, CONTAINERFILE, PROJECT_CONTEXT, SQUASHFS, build_script,
                          copied_files, image_tag, installed_containerfile)
from tasks.artifacts import artifact_key, retryable

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class ImageBuildFailed(RuntimeError):
    """What no retry fixes: a tool missing on the build node, a file the spec names missing here."""

    retryable = False


def project_files(root: Path = PROJECT_ROOT) -> dict[str, Path]:
    """This project's source as pip installs it: pyproject.toml, the README it names, and every
    file of the packages its setuptools section includes (read from pyproject, so the image holds
    what a wheel would)."""
    if not (root / "pyproject.toml").is_file():
        raise ImageBuildFailed(f"{root}: no pyproject.toml, so this project's source cannot be put into the image; "
                               "run from a checkout (pip install -e .) or set backend.megatron_lm.image."
                               "install_project=false")
    project = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    files = {"pyproject.toml": root / "pyproject.toml", project["project"]["readme"]: root / project["project"]["readme"]}
    for package in sorted(p for p in root.iterdir() if p.is_dir() and any(fnmatch(p.name, pat) for pat in patterns)):
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[path.relative_to(root).as_posix()] = path
    return files


def _source(src: str, dst: str) -> Path:
    path = Path(src).expanduser()
    if not path.exists():
        raise ImageBuildFailed(f"backend.megatron_lm.image.copy_files[{dst!r}]={src!r}: no such file or directory "
                               "on this machine; give a path the flow can read")
    return path


def image_key_inputs(image: ImageSpec, project: dict[str, Path]) -> dict[str, Any]:
    """What the image is a function of: the Containerfile and the content of its build context."""
    return {"containerfile": installed_containerfile(image),
            "files": {name: manifest.tree_digest(_source(src, dst)) for name, src, dst in copied_files(image)},
            "project": manifest.stable_hash({rel: manifest.file_sha256(p) for rel, p in project.items()})}


def _assemble_context(context: Path, image: ImageSpec, key_inputs: dict[str, Any], project: dict[str, Path]) -> None:
    shutil.rmtree(context, ignore_errors=True)  # a retry starts from a clean context
    context.mkdir(parents=True)
    (context / CONTAINERFILE).write_text(key_inputs["containerfile"])
    for name, src, dst in copied_files(image):
        source, target = _source(src, dst), context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target) if source.is_dir() else shutil.copy2(source, target)
    for rel, path in project.items():
        target = context / PROJECT_CONTEXT / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


@task(name="image", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def build_image(spec: PretrainSpec, reuse_only: bool = False) -> str:
    """Build ``backend.megatron_lm.image`` unless its key's squashfs is complete; return its path.
    ``reuse_only``: return an existing complete image, never submit (the stage was left out)."""
    image = spec.backend.megatron_lm.image
    project = project_files() if image.install_project else {}
    key_inputs = image_key_inputs(image, project)
    tag = image_tag(spec.name, manifest.stable_hash(key_inputs))
    output = manifest.cached_output(spec.paths.root, "image", key_inputs,
                                    lambda staging: _build(spec, image, tag, staging, key_inputs, project), reuse_only)
    if output.cached:
        get_run_logger().info("image: %s is complete (manifest valid); nothing submitted", output.directory)
    _publish(spec, output.directory, output.manifest, output.cached)
    return str(output.directory / SQUASHFS)


def _build(spec: PretrainSpec, image: ImageSpec, tag: str, staging: Path, key_inputs: dict[str, Any],
           project: dict[str, Path]) -> dict[str, Any]:
    """Build and import the image into ``staging``; the manifest's fields: its tag and the build's record."""
    context, record_path = staging / "context", staging.with_name(staging.name + ".record.json")
    _assemble_context(context, image, key_inputs, project)
    record_path.unlink(missing_ok=True)
    # A file, not `bash -c TEXT`: a failure's message then names it instead of quoting it whole.
    script = staging.with_name(staging.name + ".build_image.sh")
    script.write_text(build_script(image, tag, str(context), str(staging / SQUASHFS), str(record_path)))
    cluster = cluster_for(spec)  # a Kubernetes block refuses the image stage (render.kubernetes.image)
    request = stage_request(spec, f"{spec.name}-image", Command(["bash", str(script)]), nodes=1,
                            gpus_per_node=None, exclusive=False, time_limit_min=BUILD_TIME_LIMIT_MIN)
    try:
        run_job(request, cluster, job_folder(spec, cluster))
    except JobFailed as failed:
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        if "error" in record:
            raise ImageBuildFailed(f"image: {record['error']} (job {failed.job_id})") from None
        raise
    record = json.loads(record_path.read_text())
    record_path.unlink()
    script.unlink()
    shutil.rmtree(context)
    return {"tag": tag, **record}


def _publish(spec: PretrainSpec, final: Path, done: dict[str, Any], cached: bool) -> None:
    squashfs = done["files"][SQUASHFS]
    create_table_artifact([{"squashfs": str(final / SQUASHFS), "squashfs MB": round(squashfs["bytes"] / 1e6, 1),
                            "image MB": round(done["image_bytes"] / 1e6, 1), "layers": done["layers"],
                            "build s": done["build_seconds"], "engine": done["engine"], "import": done["importer"]}],
                          key=artifact_key(spec.name, "image"),
                          description=f"training image {done['tag']}" + (" (cached: nothing submitted)" if cached else ""))
