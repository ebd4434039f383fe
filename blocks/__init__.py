"""Prefect blocks of pretrain-pipeline: `prefect block register -m blocks` makes them appear in
the UI. Secrets (a Hugging Face token, say) are Prefect's own Secret blocks, named by the spec."""

from blocks.cluster import SlurmCluster
from blocks.kubernetes import KubernetesCluster
from blocks.storage import StorageLocation

__all__ = ["KubernetesCluster", "SlurmCluster", "StorageLocation"]
