"""Where a run goes: the cluster and paths sections."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pretrain.spec.strict import Strict


class ClusterSpec(Strict):
    block: str | None = Field(None, description="Name of a SlurmCluster block with the site's settings, or "
                              "kubernetes-cluster/NAME: a KubernetesCluster block, and the stages run on Kubernetes.")
    executor: Literal["auto", "slurm", "local"] = Field(
        "auto", description="Overrides the block: slurm, local processes, or auto-detect.")
    nodes: int = Field(1, gt=0)
    min_nodes: int | None = Field(None, gt=0, description="The fewest nodes training may go on with after losing "
                                  "some: a resubmission asks for as many of cluster.nodes as the partition still "
                                  "has healthy (not down, drained or left out after a node failure), down to this "
                                  "many, and resumes there with fewer data-parallel ranks (the global batch stays, "
                                  "gradient accumulation grows). Unset: cluster.nodes, and a resubmission waits for "
                                  "that many. backend.kind=native. On a KubernetesCluster block: the PyTorchJob's "
                                  "elasticPolicy, between this many and cluster.nodes pods.")
    devices_per_node: int = Field(1, gt=0, description="Ranks per node: GPUs, (logical) NeuronCores, "
                                  "or CPU processes.")
    cpus_per_task: int | None = Field(None, gt=0)
    mem_gb: float | None = Field(None, gt=0)
    time_limit_min: int = Field(gt=0, description="Slurm time limit of each training job, in minutes: a run longer "
                                "than that is a chain of jobs, each resuming from the newest checkpoint.")
    startup_min: float = Field(5.0, gt=0, description="Minutes from a training job's start to its first step "
                               "(container, rendezvous, checkpoint load): what each job of the chain loses.")

    @model_validator(mode="after")
    def _min_nodes_up_to_nodes(self) -> ClusterSpec:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"cluster.min_nodes={self.min_nodes} is above cluster.nodes={self.nodes}: a run shrinks, "
                             "it never grows; lower cluster.min_nodes or unset it")
        return self

    @property
    def fewest_nodes(self) -> int:
        return self.min_nodes or self.nodes

    def nodes_with(self, healthy: int) -> int:
        """The nodes a resubmission asks for when the partition has ``healthy`` nodes it may use:
        all of cluster.nodes if it has them, else as many as it has, but never fewer than
        cluster.min_nodes (the job then waits for a node to come back)."""
        return max(self.fewest_nodes, min(self.nodes, healthy))


def _default_root() -> str:
    return os.environ.get("PRETRAIN_ROOT", "~/.pretrain/data")


class PathsSpec(Strict):
    # validate_default: the default goes through _expand too, so no path ever keeps a literal "~"
    root: str = Field(default_factory=_default_root, validate_default=True, description="Shared-filesystem root for every "
                      "stage's content-addressed output (default $PRETRAIN_ROOT or ~/.pretrain/data).")

    @field_validator("root")
    @classmethod
    def _expand(cls, value: str) -> str:
        return os.path.expanduser(os.path.expandvars(value))
