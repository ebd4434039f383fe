"""The `pretrain` flow: the runbook from raw data to a trained model, one task per stage.

1. fetch: every data source of the spec to a content-addressed directory on the shared disk.
2. tokenize: the fetched JSONL to a Megatron indexed dataset, as a Slurm array and a merge.
3. convert: for continual pre-training on Trainium, the HF checkpoint to NxDT's shards.
4. precompile: fill the compile cache on the nodes training will use (torch.compile warm-up on
   the native backend, neuron_parallel_compile on the neuron backend).
5. train (native backend): torchrun on N nodes, resumed from its newest checkpoint after any
   failure; the loss curve and the run summary are published as artifacts.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from prefect import flow

from pretrain import manifest
from pretrain.loss_curve import RunSummary, package_versions
from pretrain.presets import load_spec
from pretrain.spec import PretrainSpec
from tasks.convert import convert
from tasks.fetch import fetch
from tasks.precompile import precompile_native, precompile_neuron
from tasks.render import publish_rendered
from tasks.tokenize import tokenize
from tasks.train import train
from tasks.train_artifacts import publish_run_summary


class StageTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, stage: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return stage(*args, **kwargs)
        finally:
            self.seconds[name] = round(time.monotonic() - start, 1)


@flow(name="pretrain", log_prints=True)
def pretrain(preset: str = "tiny-local", overrides: list[str] | None = None, dry_run: bool = False) -> dict:
    """Run the pipeline for ``preset`` (a preset name or a spec file), with ``key=value``
    overrides such as ``training.train_steps=100``. ``dry_run`` publishes every rendered file
    as an artifact and submits nothing."""
    spec = load_spec(preset, overrides or [])
    if dry_run:
        return {"rendered": publish_rendered(spec)}
    stage = StageTimer()
    data_dir = stage("fetch", fetch, spec)
    dataset = stage("tokenize", tokenize, spec, data_dir)
    outputs: dict[str, Any] = {"fetch": data_dir, "tokenize": dataset}
    if spec.backend.kind == "neuron":
        checkpoint = stage("convert", convert, spec) if spec.model.init_from else None
        outputs["convert"] = checkpoint
        outputs["precompile"] = stage("precompile", precompile_neuron, spec, dataset, checkpoint)
    elif spec.backend.kind == "native":
        nodes = None
        if spec.backend.native.compile:
            outputs["precompile"] = stage("precompile", precompile_native, spec, dataset, data_dir)
            nodes = outputs["precompile"]["nodes"]
        result = stage("train", train, spec, dataset, data_dir, nodelist=nodes)
        outputs["train"] = result
        publish_run_summary(spec.name, _summary(spec, result, stage.seconds))
    return outputs


def _summary(spec: PretrainSpec, result: dict[str, Any], stage_seconds: dict[str, float]) -> RunSummary:
    return RunSummary(spec=spec.model_dump(mode="json"), code_version=manifest.code_version(),
                      packages=package_versions(),
                      slurm_jobs=[{"stage": "train", "job_id": a["job"], "nodes": a["nodes"]} for a in result["attempts"]],
                      stage_seconds=stage_seconds, **result["metrics"])
