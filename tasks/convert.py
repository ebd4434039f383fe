"""convert: the spec's Hugging Face checkpoint into NxD Training's sharded layout, as a Slurm job
on one node. The output key is the source's fingerprint (config.json, the weight files' names,
sizes and sampled contents) plus the layout, so a second run with the same checkpoint and layout
submits nothing, and another checkpoint of the same architecture is converted afresh."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger

from pretrain import manifest
from jobs.node import Command
from pretrain.spec import PretrainSpec
from tasks.artifacts import artifact_key, retryable
from tasks.executor import cluster_for, job_folder, run_job
from jobs.contract import ends_cancelled, stage_request
from render.convert_command import convert_command, convert_flags, expected_config
from trainer import formats

def source_fingerprint(source: Path) -> dict:
    """config.json and, per weight file, its name, modification time and a digest of its size and
    sampled contents: names and sizes alone are the same for every checkpoint of one architecture.
    The time catches weights rewritten in place; the samples, another training's weights copied
    with their times kept."""
    files = sorted(p for p in source.iterdir() if p.suffix == ".safetensors" or p.name.endswith(".index.json"))
    return {"config": (source / "config.json").read_text(),
            "files": [(p.name, p.stat().st_mtime_ns, manifest.sampled_digest(p)) for p in files]}


def convert_key_inputs(spec: PretrainSpec, source: Path) -> dict:
    """What the shards are a function of: the checkpoint's content, the layout's flags, and the
    writer's format. The spec's model shape is in it too: the converter checks it against
    config.json, so a spec that changed shape is checked again rather than handed an earlier
    conversion."""
    return {"format": formats.CONVERT, "source": source_fingerprint(source), "layout": convert_flags(spec),
            "model": expected_config(spec)}


@task(name="convert", retries=1, retry_delay_seconds=10, retry_condition_fn=retryable)
@ends_cancelled
def convert(spec: PretrainSpec, reuse_only: bool = False) -> str:
    """Convert ``model.init_from``; return the directory NxDT's ``resume_from_checkpoint`` takes.
    ``reuse_only``: return an existing complete conversion, never submit (the stage was left out)."""
    logger = get_run_logger()
    source = Path(spec.model.init_from).expanduser()
    if not (source / "config.json").exists():
        raise FileNotFoundError(f"model.init_from={spec.model.init_from}: no config.json there; point it at a "
                                "Hugging Face checkpoint directory")
    key_inputs = convert_key_inputs(spec, source)

    def build(staging: Path) -> dict:
        cluster = cluster_for(spec)
        record_path = staging.with_name(staging.name + ".record.json")
        argv = convert_command(spec, str(source), str(staging / "checkpoint"), record=str(record_path))
        run_job(stage_request(spec, f"{spec.name}-convert", Command(argv), nodes=1, gpus_per_node=None,
                              exclusive=False), cluster, job_folder(spec, cluster))
        record = json.loads(record_path.read_text())
        record_path.unlink()
        return {"layout": key_inputs["layout"],
                **{k: record[k] for k in ("shards", "parameters_stored", "bytes", "verified_tensors")}}

    output = manifest.cached_output(spec.paths.root, "convert", key_inputs, build, reuse_only)
    final, done = output.directory, output.manifest
    if output.cached:
        logger.info("convert: %s is complete (manifest valid); nothing submitted", final)
    create_table_artifact([{"shards": done["shards"], "parameters": done["parameters_stored"],
                            "bytes": done["bytes"], "verified tensors": done["verified_tensors"],
                            "layout": " ".join(done["layout"])}],
                          key=artifact_key(spec.name, "convert"), description=f"NxDT checkpoint in {final}")
    return str(final / "checkpoint")
