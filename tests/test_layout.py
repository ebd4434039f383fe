"""The house's layers and the one rule their imports follow. This module holds the rule, checks
every import of the code against it, and checks the drawing of it in the README ("Architecture").

``LAYERS`` lists the packages from the top down and ``ARROWS`` the imports between them: a package
imports only what its arrows lead to, directly or through other arrows. Every arrow points down
``LAYERS``, so no two packages import each other; node programs (``trainer``) come last and import
nothing else of the repository, so they run on a compute node by themselves. Besides: the shared
layer (``pretrain``) and the rendering (``render``) never import Prefect; a stage's task never
imports another stage's task."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("cli", "deployments", "flows", "tasks", "render", "jobs", "blocks", "pretrain", "trainer")
# Only the arrows no chain of others implies: the README draws these and no more.
ARROWS = {("cli", "deployments"), ("deployments", "flows"), ("flows", "tasks"), ("tasks", "render"),
          ("render", "jobs"), ("jobs", "blocks"), ("render", "pretrain"), ("pretrain", "trainer")}
NO_PREFECT = {"render", "pretrain", "trainer"}
# Modules of tasks/ that every stage shares; the others are stages and import none of each other.
SHARED_TASK_MODULES = {"tasks.artifacts", "tasks.attempts", "tasks.executor", "tasks.runs", "tasks.train_artifacts"}


def reachable(package: str, arrows: set[tuple[str, str]] = ARROWS) -> set[str]:
    """The packages ``package`` may import: those its arrows lead to, directly or not."""
    found: set[str] = set()
    frontier = [package]
    while frontier:
        here = frontier.pop()
        for start, end in arrows:
            if start == here and end not in found:
                found.add(end)
                frontier.append(end)
    return found


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


def _imports() -> list[tuple[str, str, Path, int, str]]:
    """(package, module, file, line, imported) of every import that runs in the layers' code."""
    found = []
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found += [(package, module, path.relative_to(ROOT), line, imported)
                      for line, imported in _runtime_imports(ast.parse(path.read_text(), str(path)))]
    return found


def _violations() -> list[str]:
    problems = []
    for package, module, where, line, imported in _imports():
        top = imported.split(".")[0]
        if top in LAYERS and top != package and top not in reachable(package):
            problems.append(f"{where}:{line}: {package}/ imports {imported}")
        if package in NO_PREFECT and top.startswith("prefect"):
            problems.append(f"{where}:{line}: {package}/ imports {imported} (no Prefect here)")
        if package == "tasks" and top == "tasks" and imported not in SHARED_TASK_MODULES and imported != module:
            problems.append(f"{where}:{line}: {module} imports another stage's task, {imported}")
    return problems


def test_the_arrows_point_down_the_layers_and_none_is_implied_by_others():
    assert [(a, b) for a, b in sorted(ARROWS) if LAYERS.index(a) >= LAYERS.index(b)] == []
    assert [arrow for arrow in sorted(ARROWS) if arrow[1] in reachable(arrow[0], ARROWS - {arrow})] == []


def test_every_import_points_down_the_layers():
    assert _violations() == []


def test_the_code_takes_every_arrow():
    """An arrow the code does not take is a claim of the drawing that the code does not bear out."""
    taken = {(package, imported.split(".")[0]) for package, _, _, _, imported in _imports()}
    assert sorted(ARROWS - taken) == []


def test_the_readme_draws_the_arrows():
    """The README's Architecture diagram: its solid arrows are the imports allowed, each arrow once;
    a dotted one is not an import (the job layer starting a node program)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Architecture\n"):]
    diagram = section[section.index("```mermaid\n"):].split("\n```", 1)[0]
    drawn = [(re.match(r"\s*(\w+)", line)[1], re.search(r"-->\s*(\w+)", line)[1])
             for line in diagram.splitlines() if "-->" in line]
    assert sorted(drawn) == sorted(ARROWS)
    assert "tests/test_layout.py" in section  # where a reader finds the rule the drawing shows


def test_the_layer_check_sees_a_wrong_import(tmp_path, monkeypatch):
    """The check itself: a node program that imports the spec is reported, with file and line."""
    for package in LAYERS:
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


def test_the_gpu_benchmarks_load_without_prefect():
    """The lent GPU machines' image has no Prefect, and the device tool carries only a few wheels
    (DEVELOPERS.md): a GPU benchmark that reached a task module through a helper would stop at
    its imports there, its device time spent."""
    scripts = ["side_by_side_gpu", "train_benchmark", "torchtitan_gpu", "megatron_lm_gpu"]
    code = (f"import importlib, sys\nsys.path.insert(0, 'benchmarks')\nfor m in {scripts!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('prefect', 'blocks', 'tasks', 'flows')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
