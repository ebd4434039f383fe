"""The Slurm cluster a pipeline runs on: the site's settings, saved once as a Prefect block.

The spec says what a workload needs (nodes, devices, time); this block says how this site
grants it (partition, account, container runtime, setup lines).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from prefect.blocks.core import Block
from pydantic import Field, field_validator

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def variable_names(env: dict[str, str]) -> dict[str, str]:
    """A block's mapping of variables (``env``), refused when a name is not one a shell can export
    (POSIX: letters, digits and underscores, not starting with a digit); pydantic's error names the
    field."""
    for name in env:
        if not _VARIABLE.fullmatch(name):
            raise ValueError(f"{name!r} is not a variable name a shell can export; use letters, digits and "
                             "underscores, not starting with a digit")
    return env


def node_mtbf_h_field() -> Any:
    """Both cluster blocks' ``node_mtbf_h``: the site's node failure rate for the checkpoint advice."""
    return Field(
        None, gt=0,
        description="The site's mean time between failures of one node, in hours, for the checkpoint advice "
        "(docs/checkpoints.md); a run's own chain of jobs refines it. None: the default derived from the Llama 3 "
        "paper's 419 unexpected interruptions in 54 days on 2,048 nodes (6,335 h).")


class SlurmCluster(Block):
    _block_type_name = "Slurm Cluster"
    _block_type_slug = "slurm-cluster"
    _description = "Where and how pretrain-pipeline submits Slurm jobs."

    executor: Literal["auto", "slurm", "local"] = Field(
        "auto",
        description="'slurm' submits with sbatch; 'local' runs jobs as processes on this host; "
        "'auto' uses Slurm when a controller answers, else local.",
    )
    partition: str | None = Field(None, description="Slurm partition (sbatch --partition).")
    account: str | None = Field(None, description="sbatch --account.")
    qos: str | None = Field(None, description="sbatch --qos.")
    exclusive: bool = Field(
        True,
        description="Precompile and training jobs on more than one node, or on Trainium, take whole nodes "
        "(sbatch --exclusive), as the runbooks launch them; False lets them share nodes with other jobs (a site "
        "whose partition is shared). Other stages' one-node jobs always may share.")
    gres: str | None = Field(None, description="Generic resources, e.g. 'gpu:8' or a site's Neuron GRES.")
    nodelist: list[str] = Field(default_factory=list, description="Run only on these nodes.")
    exclude: list[str] = Field(default_factory=list, description="Never run on these nodes.")
    container_image: str | None = Field(
        None, description="pyxis/enroot image for srun --container-image (Megatron-LM on GPUs)."
    )
    container_mounts: list[str] = Field(
        default_factory=list, description="pyxis mounts, 'SRC:DST' each (srun --container-mounts)."
    )
    setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run in the batch script before srun (module load, venv activate).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="The site's own variables, exported in every job before the setup lines (e.g. "
        "{'PRETRAIN_PEAK_TFLOPS': '95'}). A job inherits only PATH, the venv, HOME and the locale from the "
        "worker's shell; anything else it needs goes here or in the setup lines.")
    python: str | None = Field(
        None, description="Python on the compute nodes; defaults to the interpreter of the flow."
    )
    sbatch_options: dict[str, str | int | bool] = Field(
        default_factory=dict, description="Any further sbatch option, e.g. {'constraint': 'trn1'}."
    )
    lease_timeout_s: int = Field(
        300, ge=0,
        description="A job whose flow process has stopped following it for this long (the flow "
        "process was killed, its machine died) cancels itself, so no job outlives its pipeline; "
        "0 never.")
    preflight_max_age_min: int = Field(
        360, ge=0,
        description="A run that queues jobs on more than one node first runs a one-node probe of what its "
        "backend needs; it skips the probe when the same block and spec passed it this recently (minutes). "
        "0 probes before every such run.")
    node_mtbf_h: float | None = node_mtbf_h_field()
    job_folder: str | None = Field(
        None,
        description="Shared-filesystem directory for job scripts and logs; defaults to "
        "<paths.root>/jobs of the spec.",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return variable_names(env)
