"""Slurm's view of nodes and partitions: node lists as host names, which nodes are unhealthy, and
what a partition has (its nodes, their GPUs, its job size limit), read with ``scontrol`` and
``sinfo`` (https://slurm.schedmd.com/sinfo.html)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

# sinfo node states in which a node runs nothing until someone intervenes
UNHEALTHY_STATES = "down,drain,fail,no_respond"


def expand_nodes(nodes: str) -> list[str]:
    """``node[1-3],gpu7`` as host names (``scontrol show hostnames``); empty for none."""
    if not nodes or nodes in ("None assigned", "(null)"):
        return []
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:  # no Slurm on this machine (the local executor): a plain host name
        return [nodes]
    return out.stdout.split() if out.returncode == 0 else [nodes]


def unhealthy_nodes(nodes: list[str]) -> set[str]:
    """Those of ``nodes`` that Slurm now holds down, drained, failed or not responding: after a
    NODE_FAIL, the job's node list names every node it ran on, and this tells which one failed."""
    if not nodes:
        return set()
    out = subprocess.run(["sinfo", "--noheader", "--Node", "--nodes", ",".join(nodes), "--format", "%N",
                          "--states", UNHEALTHY_STATES], capture_output=True, text=True, timeout=60)
    return set(out.stdout.split()) & set(nodes) if out.returncode == 0 else set()


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: dict[str, str]  # node -> its sinfo state (idle, mixed, down*, drained, ...)
    gpus: dict[str, int]  # node -> GPUs in its GRES
    cpus: dict[str, int]  # node -> its CPUs
    max_nodes: int | None  # the largest job it takes, in nodes; None: no limit

    @property
    def usable(self) -> list[str]:
        """Nodes not held out of service (down, drained, failing, not responding: a ``*`` suffix)."""
        return [n for n, state in self.nodes.items()
                if not state.endswith("*") and not state.startswith(("down", "drain", "fail"))]


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES column: ``gpu:8``, ``gpu:h100:8(S:0-1)``, ``gpu:a100:4,nvme:1``; 0 for none."""
    return sum(int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu(?::[^:,(]+)*?:(\d+)", gres))


def parse_partition(name: str | None, node_lines: str, size_lines: str) -> Partition | None:
    """The partition ``name`` (the default one, marked ``*``, when None) from
    ``sinfo -h -N -o %N|%T|%G|%c|%P`` (a line per node and partition) and ``sinfo -h -o %P|%s`` (a
    line per partition and node state: ``debug*|1-infinite``, ``trn1|1-16``)."""
    def wanted(partition: str) -> bool:
        return partition.rstrip("*") == name if name is not None else partition.endswith("*")

    nodes, gpus, cpus = {}, {}, {}
    for node, state, gres, cpu_count, partition in _fields(node_lines, 5):
        if wanted(partition):
            nodes[node], gpus[node], cpus[node] = state, gres_gpus(gres), int(cpu_count)
    found = [(partition.rstrip("*"), size.split("-")[-1]) for partition, size in _fields(size_lines, 2)
             if wanted(partition)]
    if not found:
        return None
    largest = found[0][1]
    return Partition(found[0][0], nodes, gpus, cpus, int(largest) if largest.isdigit() else None)


def _fields(text: str, count: int) -> list[list[str]]:
    return [parts for line in text.splitlines() if len(parts := line.strip().split("|")) == count]


def read_partition(name: str | None) -> Partition | None:
    """What ``sinfo`` says of the partition ``name`` (None: the default); None when there is no such partition."""
    def sinfo(fmt: str) -> str:
        out = subprocess.run(["sinfo", "-h", *fmt.split()], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"sinfo failed: {out.stderr.strip()}")
        return out.stdout

    return parse_partition(name, sinfo("-N -o %N|%T|%G|%c|%P"), sinfo("-o %P|%s"))
