"""A real English corpus built from text already on this machine: the docstrings of the
installed Python's standard library, one JSON document per module.

Used by the demo and the tests, so nothing is ever downloaded.
"""

from __future__ import annotations

import ast
import json
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path


def _docstrings(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                yield doc


def documents(limit_bytes: int | None = None) -> Iterator[dict[str, str]]:
    """``{"text", "source"}`` records in a fixed order (sorted paths), until ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue  # a few stdlib files are deliberately invalid (lib2to3 test data)
        text = "\n\n".join(_docstrings(tree))
        if not text:
            continue
        yield {"text": text, "source": path.relative_to(stdlib).as_posix()}
        total += len(text.encode())
        if limit_bytes is not None and total >= limit_bytes:
            return


def write_jsonl(path: Path, limit_bytes: int | None = None) -> int:
    """Write the corpus to ``path`` (temporary name, then rename); return the document count."""
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in documents(limit_bytes):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            count += 1
    tmp.replace(path)
    return count
