"""A real English corpus built from text already on this machine: the docstrings of the
installed Python's standard library, one JSON document per module.

Used by the demo and the tests, so nothing is ever downloaded.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path


def _docstrings(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                yield doc


def python_files(include_site_packages: bool = False) -> Iterator[tuple[Path, Path]]:
    """(root, file) of the standard library's sources, then optionally the installed packages'."""
    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" not in path.parts and "test" not in path.parts:
            yield stdlib, path
    if include_site_packages:
        site = Path(paths["purelib"])
        for path in sorted(site.rglob("*.py")):
            yield site, path


def _parse(files: Iterable[tuple[Path, Path]]) -> Iterator[dict[str, str]]:
    for root, path in files:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue  # a few stdlib files are deliberately invalid (lib2to3 test data)
        text = "\n\n".join(_docstrings(tree))
        if text:
            yield {"text": text, "source": path.relative_to(root).as_posix()}


def _cache_path(files: list[tuple[Path, Path]]) -> Path:
    """Where the parsed corpus is kept between processes: keyed by the interpreter, this module's
    own source (how documents are extracted) and every source file's path, size and mtime, so an
    upgraded Python or an edited extraction is parsed afresh."""
    key = hashlib.sha256(sys.version.encode() + Path(__file__).read_bytes())
    for _, path in files:
        stat = path.stat()
        key.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "pretrain-pipeline"
    return cache / f"stdlib-corpus-{key.hexdigest()[:16]}.jsonl"


def _kept_documents(files: list[tuple[Path, Path]]) -> tuple[dict[str, str], ...]:
    """The documents of ``files``, parsed once per machine and kept (temporary name, then rename:
    processes may write at once)."""
    cached = _cache_path(files)
    if cached.exists():
        return tuple(json.loads(line) for line in cached.read_text(encoding="utf-8").splitlines())
    docs = tuple(_parse(files))
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    tmp.replace(cached)
    return docs


@functools.cache
def _stdlib_documents() -> tuple[dict[str, str], ...]:
    """The standard library's ~2,000 files take about 8 s of CPU to parse on the 2-core machine,
    and the demo (its corpus, then its tokenizer) and every test process that trains a tokenizer
    ask for the corpus; reading the kept copy takes a few milliseconds."""
    return _kept_documents(list(python_files()))


def documents(limit_bytes: int | None = None, include_site_packages: bool = False) -> Iterator[dict[str, str]]:
    """``{"text", "source"}`` records in a fixed order (sorted paths), until ``limit_bytes``."""
    total = 0
    for doc in (_parse(python_files(True)) if include_site_packages else _stdlib_documents()):
        yield doc
        total += len(doc["text"].encode())
        if limit_bytes is not None and total >= limit_bytes:
            return


def corpus_texts(limit_bytes: int | None = None) -> list[str]:
    return [d["text"] for d in documents(limit_bytes)]


def write_jsonl(path: Path, limit_bytes: int | None = None, include_site_packages: bool = False) -> int:
    """Write the corpus to ``path`` (temporary name, then rename); return the document count."""
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in documents(limit_bytes, include_site_packages):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            count += 1
    tmp.replace(path)
    return count
