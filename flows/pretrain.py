"""The `pretrain` flow: the runbook from raw data to a trained model, one task per stage.

1. fetch: every data source of the spec to a content-addressed directory on the shared disk.
2. tokenize: the fetched JSONL to a Megatron indexed dataset, as a Slurm array and a merge.
3. convert: for continual pre-training on Trainium, the HF checkpoint to NxDT's shards.
"""

from __future__ import annotations

from prefect import flow

from pretrain.presets import load_spec
from tasks.convert import convert
from tasks.fetch import fetch
from tasks.tokenize import tokenize


@flow(name="pretrain", log_prints=True)
def pretrain(preset: str = "tiny-local", overrides: list[str] | None = None) -> dict[str, str]:
    """Run the pipeline for ``preset`` (a preset name or a spec file), with ``key=value``
    overrides such as ``training.train_steps=100``."""
    spec = load_spec(preset, overrides or [])
    data_dir = fetch(spec)
    outputs = {"fetch": data_dir, "tokenize": tokenize(spec, data_dir)}
    if spec.model.init_from and spec.backend.kind == "neuron":
        outputs["convert"] = convert(spec)
    return outputs
