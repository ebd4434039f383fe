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
from tasks.render import publish_rendered
from tasks.tokenize import tokenize


@flow(name="pretrain", log_prints=True)
def pretrain(preset: str = "tiny-local", overrides: list[str] | None = None, dry_run: bool = False) -> dict:
    """Run the pipeline for ``preset`` (a preset name or a spec file), with ``key=value``
    overrides such as ``training.train_steps=100``. ``dry_run`` publishes every rendered file
    as an artifact and submits nothing."""
    spec = load_spec(preset, overrides or [])
    if dry_run:
        return {"rendered": publish_rendered(spec)}
    data_dir = fetch(spec)
    outputs = {"fetch": data_dir, "tokenize": tokenize(spec, data_dir)}
    if spec.model.init_from and spec.backend.kind == "neuron":
        outputs["convert"] = convert(spec)
    return outputs
