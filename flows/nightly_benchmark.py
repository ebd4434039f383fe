"""The `nightly-benchmark` flow: a preset in benchmark mode (fixed steps, no evaluation) through
the whole pipeline, judged against the rolling baseline of earlier passing runs.

Every backend is benchmarked alike: native, neuron (NxDT), megatron-lm and torchtitan, each
rendered in benchmark mode. The record is built from what each one's stages return: the train
stage's summary of its parsed log (tokens/s in whatever form the backend prints it: per device,
sequences/s, or a batch over a step time), the graphs precompile and training compiled where
the backend has a precompile stage. A metric a backend does not print (MFU from Megatron-LM and
NxDT, step time from torchtitan and NxDT, graph breaks from Neuron's compiler) is left out of
its records and never judged; the rules are the same for all (``pretrain.benchmark.RULES``).

Records go beside the outputs (``<paths.root>/benchmarks/`` or a StorageLocation block), not
only into Prefect's database; the run ends Failed naming every metric that regressed.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from prefect import flow
from prefect.states import Cancelled
from prefect.runtime import flow_run

from flows.pretrain import run_stages
from flows.stages import stages_of
from pretrain.benchmark import benchmark_overrides, check_thresholds, record_from_run, reused_stages
from pretrain.presets import load_spec
from tasks.benchmark import history_for, judge
from jobs.contract import FlowRunCancelled


class BenchmarkRegression(RuntimeError):
    pass


@flow(name="nightly-benchmark", log_prints=True)
def nightly_benchmark(preset: str = "tiny-local", overrides: list[str] | None = None, steps: int = 50,
                      window: int = 5, thresholds: dict[str, float] | None = None,
                      history: str | None = None, new_baseline: bool = False) -> Any:
    """Benchmark a preset and fail on a regression.

    Args:
        preset: The preset (or spec file) to benchmark, on any backend.
        overrides: Spec fields to change, `key=value` each, applied before benchmark mode.
        steps: Training steps of the benchmark run.
        window: How many earlier passing runs of the same configuration form the baseline (median).
        thresholds: How much worse than the baseline a metric may get, as a fraction, per metric:
            tokens_per_s, step_time_ms, mfu_pct, device_util_pct (mean device utilization), final_loss,
            graphs_compiled_in_training, graph_breaks, graphs_failed_in_precompile, stage_s. A metric
            the preset's backend does not report is not judged whatever its threshold.
        history: Name of a StorageLocation block for the records; default `<paths.root>/benchmarks`.
        new_baseline: Accept this run as the new baseline after an intended change (new code that
            is slower but better, another machine): it passes, and later runs compare with it
            and the runs after it only.
    """
    check_thresholds(thresholds or {})
    spec = load_spec(preset, [*(overrides or []), *benchmark_overrides(steps, load_spec(preset, overrides or []))])
    # A history that does not exist or cannot be written fails the run now, not after the pipeline.
    history_for(history, spec.paths.root).check_writable(spec.name)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        outputs, seconds = run_stages(spec)
    except FlowRunCancelled as cancelled:
        return Cancelled(message=str(cancelled))
    record = record_from_run(spec.model_dump(mode="json"), str(flow_run.get_id()), outputs["train"], seconds,
                             outputs.get("precompile"),
                             reused_stages(outputs, started, [stage.name for stage in stages_of(spec) if stage.cached]))
    comparisons = judge(record, history, spec.paths.root, window, thresholds, new_baseline)
    regressed = [] if new_baseline else [c for c in comparisons if c.regressed]
    if regressed:
        raise BenchmarkRegression(f"{spec.name}: {len(regressed)} metric(s) regressed: "
                                  + "; ".join(c.describe() for c in regressed))
    return asdict(record)
