"""The `pretrain` flow: the runbook from raw data to a trained model, one task per stage.

0. preflight: refuse what this host or the cluster cannot run before anything is queued; before
   jobs on many nodes, a one-node probe of what the backend needs there.
1. fetch: every data source of the spec to a content-addressed directory on the shared disk; the
   tokenizer, checkpoint and config.json the spec names on the Hugging Face Hub beside it.
2. tokenize: the fetched JSONL to a Megatron indexed dataset, as a Slurm array and a merge (to
   NxD's Arrow blocks for NxDT's Llama configs); a fetched dataset tokenized already is handed on.
3. convert: for continual pre-training on Trainium, the HF checkpoint to NxDT's shards.
4. precompile: fill the compile cache on the nodes training will use (torch.compile warm-up on
   the native backend, neuron_parallel_compile on the neuron backend; none for torchtitan, whose
   first training run compiles: `pretrain plan` says why).
5. image (Megatron-LM): build the training image on a node and import it to a squashfs for pyxis.
6. train: torchrun on N nodes (the native trainer, NxDT's training orchestrator or Megatron-LM's
   pretrain_gpt.py), a chain of jobs to the last step, each resuming from the newest checkpoint
   (a new flow run of the same spec continues the run too); the chain, the loss curve and the run
   summary are published as artifacts.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from prefect import flow
from prefect.states import Cancelled

from pretrain import manifest
from pretrain.device_samples import DeviceSamples
from pretrain.loss_curve import RunSummary, metrics_summary, package_versions
from pretrain.hub_refs import spec_references
from pretrain.presets import load_spec
from pretrain.spec import PretrainSpec
from tasks.fetch import fetch_hub_files
from tasks.executor import jobs_of_this_flow_run
from tasks.preflight import preflight
from flows.dry_run import publish_rendered
from render.nxdt import check_model_config
from jobs.contract import FlowRunCancelled, raise_if_cancelled
from flows.stages import STAGE_NAMES, StageName, refuse_not_run, to_run
from tasks.train_artifacts import publish_run_summary


class StageTimer:
    """Runs stages, keeping each one's output and duration, so that a failed run still tells
    how far it got."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.outputs: dict[str, Any] = {}

    def __call__(self, name: str, stage: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return raise_if_cancelled(stage(*args, **kwargs))
        finally:
            self.seconds[name] = round(time.monotonic() - start, 1)


def run_stages(spec: PretrainSpec, stages: list[str] | None = None,
               stage: StageTimer | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """Run the stages of ``spec`` (all that apply to its backend when ``stages`` is None), walking
    its backend's list (flows/stages.py).

    A stage left out is not run; the stages after it take its existing output, or fail naming
    the stage to add. A stage named that the backend has no job for is refused before anything
    runs. Returns each stage's output and how long each one took (also kept in ``stage`` as they
    finish).
    """
    if stages is not None:
        refuse_not_run(spec, stages)
    selected = set(STAGE_NAMES if stages is None else stages)
    stage = stage or StageTimer()
    stage("preflight", preflight, spec, sorted(selected))
    if spec_references(spec):
        # the later stages read the Hub's files from the shared disk, by the paths this spec names
        spec = stage("fetch-hub", fetch_hub_files, spec, reuse_only="fetch" not in selected)
    if spec.backend.kind == "neuron" and spec.model.family == "llama" and selected & {"precompile", "train"}:
        check_model_config(spec)  # the config.json NxDT builds the model from, before any job
    for step, reuse_only in to_run(spec, selected):
        stage.outputs[step.name] = stage(step.name, step.run, spec, stage.outputs, reuse_only)
    return stage.outputs, stage.seconds


@flow(name="pretrain", log_prints=True)
def pretrain(preset: str = "tiny-local", overrides: list[str] | None = None, stages: list[StageName] | None = None,
             cluster_block: str | None = None, init_from: str | None = None, dry_run: bool = False) -> Any:
    """LLM pre-training from raw data to a trained, monitored model on a Slurm cluster.

    Args:
        preset: A preset name (llama3-70b, tiny-local, ...; `pretrain presets` lists them) or the
            path of a spec YAML file on the machine the flow runs on.
        overrides: Spec fields to change, one `key=value` each, e.g. `training.train_steps=100`
            or `cluster.block=trn1-cluster`.
        stages: The stages to run, of fetch, tokenize, convert, precompile, image and train; empty runs
            every stage that applies. A stage left out hands on its existing output; one the
            backend has no job for (`pretrain plan` shows it skipped) is refused.
        cluster_block: Name of the SlurmCluster block with the site's settings (partition,
            account, setup lines); empty: the spec's `cluster.block`, else Slurm's defaults.
        init_from: A Hugging Face checkpoint directory to continue pre-training from (converted
            first on Trainium); empty: the spec's `model.init_from`, else training from scratch.
        dry_run: Publish every rendered script and config (sbatch, NxDT YAML, conversion command,
            torchrun lines) as artifacts and submit nothing.
    """
    # A deployment's named parameters come first and the user's overrides after them, so an
    # override wins, and passing overrides (which replaces the whole list) keeps a deployment's
    # cluster block and checkpoint.
    named = [f"{field}={value}" for field, value in (("cluster.block", cluster_block), ("model.init_from", init_from))
             if value]
    spec = load_spec(preset, [*named, *(overrides or [])])
    if dry_run:
        return {"rendered": publish_rendered(spec)}
    stage = StageTimer()
    try:
        outputs, seconds = run_stages(spec, stages or None, stage)
    except FlowRunCancelled as cancelled:
        return Cancelled(message=str(cancelled))  # a flow without a worker ends Cancelled too
    except Exception as exc:
        if "train" in (stages or STAGE_NAMES):  # a run meant to train: say how far it got and why not
            publish_run_summary(spec.name, _summary(spec, stage, f"failed: {exc}", exc))
        raise
    if "train" in outputs:
        publish_run_summary(spec.name, _summary(spec, stage, "completed"))
    return outputs


def _summary(spec: PretrainSpec, stage: StageTimer, outcome: str, failure: BaseException | None = None) -> RunSummary:
    """``failure``: what ended the run; a train stage that failed attaches what it measured
    before it did (``metrics``) and its attempts' outcomes (``attempts``)."""
    train_result, precompiled = stage.outputs.get("train"), stage.outputs.get("precompile") or {}
    compiled = [{"stage": "precompile", **row} for row in precompiled.get("rows", [])]
    compiled += [{"stage": "train", **row} for row in (train_result or {}).get("compiled_during_training", [])]
    attempts = train_result["attempts"] if train_result else getattr(failure, "attempts", None) or []
    outcomes = {attempt["job"]: attempt["outcome"] for attempt in attempts}
    # An attempt's outcome says more (in the trainer's words) than the job's Slurm state.
    jobs = [{"stage": job["name"].removeprefix(f"{spec.name}-"), "job_id": job["job_id"], "nodes": job["nodes"],
             "outcome": outcomes.get(job["job_id"]) or job["outcome"]} for job in jobs_of_this_flow_run()]
    measured = train_result["metrics"] if train_result else getattr(failure, "metrics", None)
    return RunSummary(spec=spec.model_dump(mode="json"), outcome=outcome, code_version=manifest.code_version(),
                      packages=package_versions(), jobs=jobs, stage_seconds=stage.seconds,
                      compile_graphs=compiled,
                      **(measured or {**metrics_summary([]), **DeviceSamples().figures()}))
