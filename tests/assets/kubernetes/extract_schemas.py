"""Writes the schema fixtures the Kubernetes rendering tests validate against (SOURCES.md says
where each input comes from). The inputs are large (the Kubernetes definitions 1.8 MB, the CRD
0.6 MB of YAML), so only what validation reads is kept: the definitions that Job and Pod reach,
the CRD's openAPIV3Schema, both without their descriptions.

    python extract_schemas.py --definitions .../v1.37.0-local-strict/_definitions.json \
        --crd kubeflow.org_pytorchjobs.yaml --out tests/assets/kubernetes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

ROOTS = ("io.k8s.api.batch.v1.Job", "io.k8s.api.core.v1.Pod")
# Inside kubernetes-validate's shared definitions file a reference is local; its per-kind files
# name that file. The fixture keeps every reference local.
LOCAL_PREFIX, FILE_PREFIX = "#/$defs/", "/api/_definitions.json#/$defs/"


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].removeprefix(FILE_PREFIX).removeprefix(LOCAL_PREFIX)} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def local_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (v.replace(FILE_PREFIX, LOCAL_PREFIX) if k == "$ref" else local_refs(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [local_refs(v) for v in node]
    return node


def reachable(defs: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    keep, todo = {}, list(roots)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep[name] = defs[name]
            todo += sorted(refs(defs[name]))
    return dict(sorted(keep.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--definitions", type=Path, required=True)
    parser.add_argument("--crd", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    defs = json.loads(args.definitions.read_text())["$defs"]
    kept = local_refs(without_descriptions(reachable(defs, ROOTS)))
    (args.out / "kubernetes-v1.37.0-job-pod.schema.json").write_text(
        json.dumps({"$defs": kept}, indent=1, sort_keys=True) + "\n")
    crd = yaml.safe_load(args.crd.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    (args.out / "kubeflow-pytorchjob-v1.9.0.schema.json").write_text(
        json.dumps(without_descriptions(version["schema"]["openAPIV3Schema"]), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
