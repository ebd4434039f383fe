"""Prefect blocks of pretrain-pipeline (`prefect block register -m blocks`)."""

from blocks.cluster import SlurmCluster

__all__ = ["SlurmCluster"]
