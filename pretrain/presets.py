"""Presets: one YAML file per runbook workload in deployments/presets/, with their published
values. A preset may ``extends:`` another and change a few fields; the CLI and the flow only
override (``dotted.key=value``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pretrain.spec import PretrainSpec

PRESETS_DIR = Path(__file__).resolve().parent.parent / "deployments" / "presets"


class SpecError(ValueError):
    """An invalid spec; the message names the file, the field and the fix."""


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec is a YAML mapping, got {type(data).__name__}")
    return data


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _resolve(preset_or_path: str, seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], Path]:
    """A preset's name means the preset, whatever the current directory holds (a folder named after a
    preset, say); anything else is the path of a spec file. The one rule for the command line and
    for ``extends``."""
    path = Path(preset_or_path)
    if path.suffix not in (".yaml", ".yml"):  # a YAML file's name goes to _read_yaml, which says what is wrong
        if (PRESETS_DIR / f"{preset_or_path}.yaml").is_file():
            path = PRESETS_DIR / f"{preset_or_path}.yaml"
        elif not path.is_file():
            raise SpecError(f"unknown preset {preset_or_path!r}; available: {', '.join(list_presets())} "
                            "(or give the path of a spec YAML file)")
    if str(path) in seen:
        raise SpecError(f"{path}: 'extends' loops through {' -> '.join(seen)}")
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    if parent is not None:
        base, _ = _resolve(parent, (*seen, str(path)))
        data = _merge(base, data)
    return data, path


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides; values are YAML (``8``, ``null``, ``[a, b]``)."""
    data = _merge({}, data)
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key:
            raise SpecError(f"override {override!r}: write it as dotted.key=value, e.g. parallel.tp=8")
        node = data
        *parents, leaf = key.split(".")
        for i, part in enumerate(parents):
            # A missing section is created: pydantic then names any key that does not exist.
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SpecError(f"override {override!r}: {'.'.join(parents[:i + 1])} is a value, "
                                "not a section")
        try:
            node[leaf] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise SpecError(f"override {override!r}: the value is not valid YAML ({exc})") from None
    return data


def _format_errors(exc: ValidationError, path: Path) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field (a typo?)"
        lines.append(f"  {field}: {message}" if field else f"  {message}")
    return f"{path}: invalid spec:\n" + "\n".join(lines)


def load_spec(preset_or_path: str, overrides: list[str] | tuple[str, ...] = ()) -> PretrainSpec:
    data, path = _resolve(preset_or_path)
    data = apply_overrides(data, overrides)
    data.setdefault("name", path.stem)
    try:
        return PretrainSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, path)) from None
