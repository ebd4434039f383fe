"""The checkpoint advice's inputs for a spec, from what a run has measured where it has, else from
the spec and stated assumptions; and ``training.checkpoint_interval: auto`` resolved into steps.
The model itself is pretrain/checkpoint_advice.py (docs/checkpoints.md).

- save stall: the native trainer's, measured from its metrics (the gap between two step records
  around a checkpoint, less the step itself); before that, or for a backend whose log gives no
  step times, an estimate: the checkpoint's bytes (``pretrain.checkpoint_room.checkpoint_bytes``)
  written at :data:`ASSUMED_WRITE_BYTES_PER_S` per node;
- restart: the median time the run's chain lost between jobs; before that, ``cluster.startup_min``
  plus :data:`ASSUMED_REQUEUE_S`;
- step time: the run's median; before that, ``training.step_time_s`` (None: advice in seconds);
- failure rate: the cluster block's per-node MTBF (else the published default), updated by the
  run's own chain of jobs once it has one (``node_mtbf_from_history``).
"""

from __future__ import annotations

import statistics
from typing import Any

from pretrain import run_chain
from pretrain.checkpoint_room import BYTES_PER_PARAMETER, checkpoint_bytes, parameters
from pretrain.checkpoint_advice import (DEFAULT_NODE_MTBF_H, FailureInputs, advise, auto_interval_steps,
                                       node_mtbf_from_history)
from pretrain.spec import PretrainSpec

# A shared filesystem's write rate per node, for the estimate alone: 1 GB/s, a conservative figure
# for FSx for Lustre, whose throughput AWS sells from 125 to 1,000 MB/s per TiB provisioned.
ASSUMED_WRITE_BYTES_PER_S = 1e9
# Slurm's time from a job's end to the next one's start when nodes are free: its scheduler's pass.
ASSUMED_REQUEUE_S = 60.0
def estimated_stall_s(spec: PretrainSpec) -> float:
    return checkpoint_bytes(spec) / (ASSUMED_WRITE_BYTES_PER_S * spec.cluster.nodes)


def measured_stall_s(points: list[dict[str, Any]], interval: int) -> float | None:
    """The median time training waited on a checkpoint, from step records that carry when each step
    ended (``time``) and how long it took (``step_time_ms``): the native trainer's. None without them."""
    by_step = {p["step"]: p for p in points if "time" in p and "step_time_ms" in p}
    stalls = [by_step[s + 1]["time"] - by_step[s]["time"] - by_step[s + 1]["step_time_ms"] / 1000
              for s in by_step if s % interval == 0 and s + 1 in by_step]
    return max(statistics.median(stalls), 0.0) if stalls else None


def failure_inputs(spec: PretrainSpec, node_mtbf_h: float | None = None, chain: list[run_chain.Record] = (),
                   step_time_ms: float | None = None, stall_s: float | None = None) -> FailureInputs:
    """What the advice weighs for this spec: the run's measurements where given, else the spec's and
    the assumptions above. ``node_mtbf_h``: the cluster block's, else the published default."""
    prior = node_mtbf_h or DEFAULT_NODE_MTBF_H
    if chain:
        node_hours, failures = run_chain.failure_history(chain)
        prior = node_mtbf_from_history(node_hours, failures, prior)
    lost = [s for i in range(len(chain)) if (s := run_chain.lost_before(chain, i)) is not None]
    restart = statistics.median(lost) if lost else spec.cluster.startup_min * 60 + ASSUMED_REQUEUE_S
    step_s = step_time_ms / 1000 if step_time_ms else spec.training.step_time_s
    stall = estimated_stall_s(spec) if stall_s is None else stall_s
    return FailureInputs(nodes=spec.cluster.nodes, node_mtbf_h=prior, save_stall_s=stall, restart_s=restart,
                         step_s=step_s)


def advice_lines(spec: PretrainSpec, inputs: FailureInputs, measured: bool) -> list[str]:
    """The advice as `pretrain plan` and the chain artifact print it, saying where its inputs came from."""
    source = ("measured by the run where it has (save stall, restart, step time, failures)" if measured else
              f"save stall estimated ({parameters(spec) / 1e9:.2f} B parameters x "
              f"{BYTES_PER_PARAMETER[spec.backend.kind]} bytes at "
              f"{ASSUMED_WRITE_BYTES_PER_S / 1e9:g} GB/s per node), restart = cluster.startup_min + "
              f"{ASSUMED_REQUEUE_S:.0f} s, step time training.step_time_s, node MTBF the default unless the "
              "cluster block sets node_mtbf_h: the run measures its own")
    interval = spec.training.checkpoint_interval
    if interval == "auto":
        steps = auto_interval_steps(inputs)
        return [*advise(inputs, steps).lines(), f"training.checkpoint_interval=auto: {steps} steps", f"({source})"]
    return [*advise(inputs, interval).lines(), f"({source})"]


def planned(spec: PretrainSpec) -> PretrainSpec:
    """``spec`` as its first job would be launched, before the run has measured anything: what
    `pretrain render` and a dry run show."""
    return resolved(spec, failure_inputs(spec))


def resolved(spec: PretrainSpec, inputs: FailureInputs) -> PretrainSpec:
    """``spec`` with ``training.checkpoint_interval: auto`` replaced by the interval ``inputs`` give."""
    if spec.training.checkpoint_interval != "auto":
        return spec
    training = spec.training.model_copy(update={"checkpoint_interval": auto_interval_steps(inputs)})
    return spec.model_copy(update={"training": training})
