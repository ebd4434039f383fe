"""Content-addressed stage outputs: staged in a temporary directory, renamed into place, and
considered done only when their MANIFEST.json validates.

A cache hit is a manifest that validates against the files beside it, never a database row,
so a deleted or truncated output is rebuilt instead of being served stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
_CHUNK = 8 << 20


def stable_hash(value: Any) -> str:
    """sha256 of the canonical JSON of ``value``: the same inputs always give the same key."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_digest(path: Path) -> str:
    """sha256 over a file's content, or over a directory's files by relative path and content."""
    if path.is_file():
        return file_sha256(path)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return stable_hash([(p.relative_to(path).as_posix(), file_sha256(p)) for p in files])


def sampled_digest(path: Path, samples: int = 16, chunk: int = 64 << 10) -> str:
    """sha256 of ``samples`` chunks spread evenly over the file, first and last included: for
    content too large to read whole on every run (a 140 GB checkpoint). Two trainings of one
    architecture differ in every chunk, so a fine-tune or a checkpoint replaced in place gets
    another key, at a cost of ``samples`` reads."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for i in range(samples):
            f.seek(max(0, size - chunk) * i // max(1, samples - 1))
            digest.update(f.read(chunk))
    return digest.hexdigest()


def code_version() -> str:
    """The git commit of the code that produced an output, or the package version outside git:
    provenance recorded beside the output, never part of its key (see ``trainer/formats.py``)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        return f"git:{sha}"
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import version

        return f"pretrain-pipeline=={version('pretrain-pipeline')}"


class MissingOutput(RuntimeError):
    """A stage left out of a run has no output for this spec to hand to the stages after it."""

    retryable = False  # trying again finds the same nothing

    def __init__(self, stage: str, final: Path):
        super().__init__(f"the {stage} stage was not asked to run and has no complete output for this spec "
                         f"at {final}; add '{stage}' to the flow's stages (or run it once without stages)")


def output_dir(root: str | Path, stage: str, key: str) -> Path:
    """``<root>/<stage>/<stage>-<key[:16]>``: readable, and distinct for distinct keys."""
    return Path(root).expanduser() / stage / f"{stage}-{key[:16]}"


def describe_files(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under ``directory`` except the manifest itself."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel != MANIFEST:
            files[rel] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return files


def write_manifest(directory: Path, stage: str, key_inputs: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """Describe every file in ``directory`` and write the manifest last, atomically. The key is
    ``stable_hash(key_inputs)``; the inputs are kept too, so that a later key can be explained."""
    manifest = {
        "stage": stage,
        "key": stable_hash(key_inputs),
        "key_inputs": key_inputs,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code_version": code_version(),
        "files": describe_files(directory),
        **fields,
    }
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, directory / MANIFEST)
    return manifest


def created_before(directory: Path, moment: str) -> bool:
    """Whether ``directory``'s output was complete before ``moment`` (UTC, as manifests write it):
    a stage that returns it now handed on an earlier run's output."""
    try:
        return json.loads((directory / MANIFEST).read_text())["created"] < moment
    except (OSError, ValueError, KeyError):
        return False


def load_valid(directory: Path, key: str, deep: bool = False) -> dict[str, Any] | None:
    """The manifest of ``directory`` if it is complete for ``key``, else None.

    Sizes are always checked; ``deep`` re-hashes every file.
    """
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("key") != key:
        return None
    for rel, meta in manifest.get("files", {}).items():
        path = directory / rel
        if not path.is_file() or path.stat().st_size != meta["bytes"]:
            return None
        if deep and file_sha256(path) != meta["sha256"]:
            return None
    return manifest


def newest_output(root: str | Path, stage: str,
                  where: Callable[[dict[str, Any]], bool] = lambda manifest: True) -> dict[str, Any] | None:
    """The manifest of the stage's most recently completed output under ``root`` (of those that
    ``where`` accepts), if any."""
    manifests = []
    for path in (Path(root).expanduser() / stage).glob(f"{stage}-*/{MANIFEST}"):
        try:
            manifests.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return max(filter(where, manifests), key=lambda m: m.get("created", ""), default=None)


def changed_inputs(before: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """What differs between two keys' inputs, one ``name: before -> now`` each, nested names dotted."""
    changes = []
    for name in sorted(before.keys() | now.keys()):
        old, new, dotted = before.get(name), now.get(name), f"{prefix}{name}"
        if isinstance(old, dict) and isinstance(new, dict):
            changes += changed_inputs(old, new, f"{dotted}.")
        elif old != new:
            changes.append(f"{dotted}: {_short(old)} -> {_short(new)}")
    return changes


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def staging_dir(final: Path) -> Path:
    """Where an output is built before it is renamed to ``final``; kept across retries so
    an interrupted stage can resume."""
    return final.with_name(f".{final.name}.partial")


@contextmanager
def staged_output(final: Path) -> Iterator[Path]:
    """Yield the staging directory; on success rename it to ``final``.

    On failure the staging directory stays for a resumed attempt and ``final`` is untouched,
    so nothing half-written ever looks complete.
    """
    staging = staging_dir(final)
    staging.mkdir(parents=True, exist_ok=True)
    yield staging
    if not (staging / MANIFEST).is_file():
        raise RuntimeError(f"{staging}: stage finished without writing {MANIFEST}")
    if final.exists():
        # An output left by an older code version or a concurrent run: replace it whole.
        shutil.rmtree(final)
    os.replace(staging, final)


@dataclass(frozen=True)
class Output:
    """A stage's output for one key: where it is, and its manifest when it is complete there."""

    key: str
    directory: Path
    manifest: dict[str, Any] | None
    """None while no complete output with this key is there."""
    cached: bool = False
    """Handed on from an earlier run, not built now."""


def existing_output(root: str | Path, stage: str, key_inputs: dict[str, Any]) -> Output:
    """The key of ``key_inputs``, its output directory under ``root``, and that output's manifest if it
    is complete: what a stage and ``pretrain plan`` both look up before deciding to build."""
    key = stable_hash(key_inputs)
    directory = output_dir(root, stage, key)
    return Output(key, directory, load_valid(directory, key))


def cached_output(root: str | Path, stage: str, key_inputs: dict[str, Any],
                  build: Callable[[Path], dict[str, Any]], reuse_only: bool = False,
                  asked_as: str | None = None) -> Output:
    """Every stage's caching: key -> output directory -> a complete output there is handed on ->
    else ``build(staging)`` fills the staging directory and returns the manifest's own fields ->
    the manifest is written last -> the directory is renamed into place.

    ``reuse_only``: the stage was left out of the run; a missing output raises :class:`MissingOutput`
    naming ``asked_as`` (the stage a user adds to the run; default ``stage``)."""
    found = existing_output(root, stage, key_inputs)
    if found.manifest is not None:
        return Output(found.key, found.directory, found.manifest, cached=True)
    if reuse_only:
        raise MissingOutput(asked_as or stage, found.directory)
    with staged_output(found.directory) as staging:
        done = write_manifest(staging, stage, key_inputs, **build(staging))
    return Output(found.key, found.directory, done)
