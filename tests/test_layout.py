"""The house's import directions (README, "Layout"): every arrow points one way, down this list.

    cli -> deployments -> flows -> tasks -> jobs, render -> blocks, pretrain -> trainer

Node programs (``trainer``) import nothing else of the repository, so they run on a compute node
by themselves; the shared layer (``pretrain``) and the rendering (``render``) never import Prefect;
a stage's task never imports another stage's task."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "deployments", "flows", "tasks", "jobs", "render", "blocks", "pretrain", "trainer")

# What each package may import of the repository besides itself.
ALLOWED = {
    "cli": {"deployments", "flows", "tasks", "jobs", "render", "blocks", "pretrain", "trainer"},
    "deployments": {"flows", "tasks", "jobs", "render", "blocks", "pretrain", "trainer"},
    "flows": {"tasks", "jobs", "render", "blocks", "pretrain", "trainer"},
    "tasks": {"jobs", "render", "blocks", "pretrain", "trainer"},
    "jobs": {"blocks", "pretrain"},
    "render": {"jobs", "pretrain", "trainer"},
    "blocks": set(),
    "pretrain": {"trainer"},
    "trainer": set(),
}
NO_PREFECT = {"render", "pretrain", "trainer"}
# Modules of tasks/ that every stage shares; the others are stages and import none of each other.
SHARED_TASK_MODULES = {"tasks.artifacts", "tasks.attempts", "tasks.executor", "tasks.runs", "tasks.train_artifacts"}


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import that runs, leaving out ``if TYPE_CHECKING:`` blocks."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _violations() -> list[str]:
    problems = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            where = path.relative_to(ROOT)
            for line, imported in _runtime_imports(ast.parse(path.read_text(), str(path))):
                top = imported.split(".")[0]
                if top in PACKAGES and top != package and top not in ALLOWED[package]:
                    problems.append(f"{where}:{line}: {package}/ imports {imported}")
                if package in NO_PREFECT and top.startswith("prefect"):
                    problems.append(f"{where}:{line}: {package}/ imports {imported} (no Prefect here)")
                if (package == "tasks" and top == "tasks" and imported not in SHARED_TASK_MODULES
                        and imported != module):
                    problems.append(f"{where}:{line}: {module} imports another stage's task, {imported}")
    return problems


def test_every_import_points_down_the_layers():
    assert _violations() == []


def test_the_layer_check_sees_a_wrong_import(tmp_path, monkeypatch):
    """The check itself: a node program that imports the spec is reported, with file and line."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "trainer" / "bad.py").write_text("import os\nfrom pretrain.spec import PretrainSpec\n")
    (tmp_path / "tasks" / "convert.py").write_text("from tasks.tokenize import tokenize\n")
    (tmp_path / "render" / "ok.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from prefect import flow\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _violations() == ["tasks/convert.py:1: tasks.convert imports another stage's task, tasks.tokenize",
                             "trainer/bad.py:2: trainer/ imports pretrain.spec"]


def test_the_shared_layer_and_the_rendering_load_without_prefect():
    """What the static check cannot see: an import made through a third-party module."""
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for package in ("pretrain", "render")
               for p in sorted((ROOT / package).rglob("*.py"))]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('prefect', 'blocks', 'tasks', 'flows')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
