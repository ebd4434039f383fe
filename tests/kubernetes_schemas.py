"""Validators for rendered Kubernetes objects, from the schema fixtures in tests/assets/kubernetes
(SOURCES.md there): Job and Pod from the Kubernetes v1.37.0 definitions, PyTorchJob from the
Kubeflow training-operator v1.9.0 CRD."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

ASSETS = Path(__file__).parent / "assets" / "kubernetes"


def closed(node: Any) -> Any:
    """The CRD's schema as the API server applies it with strict field validation (kubectl's
    default since 1.27): an unknown field is an error, not silently pruned. Objects that preserve
    unknown fields, or say what their other keys hold, stay open."""
    if isinstance(node, list):
        return [closed(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: closed(v) for k, v in node.items()}
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        node["additionalProperties"] = False
    return node


@functools.cache
def _kubernetes() -> dict[str, Any]:
    return json.loads((ASSETS / "kubernetes-v1.37.0-job-pod.schema.json").read_text())


def kubernetes_validator(definition: str) -> Draft202012Validator:
    """e.g. ``io.k8s.api.batch.v1.Job``; the fixture is already strict (kubernetes-validate's
    local-strict schemas)."""
    return Draft202012Validator({**_kubernetes(), "$ref": f"#/$defs/{definition}"})


@functools.cache
def pytorchjob_validator() -> Draft202012Validator:
    return Draft202012Validator(closed(json.loads((ASSETS / "kubeflow-pytorchjob-v1.9.0.schema.json").read_text())))


def errors(validator: Draft202012Validator, instance: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def invalid(body: dict[str, Any]) -> list[str]:
    """Every schema error of a rendered Job or PyTorchJob; a PyTorchJob's pod templates are also
    checked against the Kubernetes PodTemplateSpec, which the CRD only partly spells out."""
    if body["kind"] == "Job":
        return errors(kubernetes_validator("io.k8s.api.batch.v1.Job"), body)
    found = errors(pytorchjob_validator(), body)
    template = kubernetes_validator("io.k8s.api.core.v1.PodTemplateSpec")
    for role, replica in body["spec"]["pytorchReplicaSpecs"].items():
        found += [f"{role}: {e}" for e in errors(template, replica["template"])]
    return found
