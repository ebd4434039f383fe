"""How often to checkpoint: the interval that keeps the most of a run's wall time as training,
given what a save holds training up and how often the run's nodes fail (Young 1974; Daly 2006).
The model and its sources: docs/checkpoints.md. Pure and standard library only, so `pretrain plan`
and the tests use it without a cluster.

Times are seconds unless a name says otherwise; an interval is the training time between two
saves, the save's stall not included (Daly's tau).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Llama 3 (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot on
# 16,384 H100s, i.e. 2,048 servers of 8. Charging every one to a server: 54 d x 24 h x 2,048 / 419
# = 6,335 node-hours between failures (the run's own MTBF, 3.09 h, times its node count).
DEFAULT_NODE_MTBF_H = 54 * 24 * 2048 / 419

# The spec's interval is flagged when its expected goodput trails the best by more than this: one
# percentage point of a weeks-long run is most of a day of the whole cluster.
FAR_APART = 0.01


@dataclass(frozen=True)
class FailureInputs:
    nodes: int
    node_mtbf_h: float  # one node's mean time between failures
    save_stall_s: float  # seconds training is held per checkpoint
    restart_s: float  # from a failure to training again: requeue, start-up, checkpoint load
    step_s: float | None = None  # seconds per optimizer step; None: unknown, advice in seconds only

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes={self.nodes}: a run needs at least one node")
        if not self.node_mtbf_h > 0:
            raise ValueError(f"node_mtbf_h={self.node_mtbf_h}: a node's MTBF must be above 0 hours")
        if not self.save_stall_s >= 0:
            raise ValueError(f"save_stall_s={self.save_stall_s}: a save cannot hold training for less than 0 s")
        if not self.restart_s >= 0:
            raise ValueError(f"restart_s={self.restart_s}: a restart cannot take less than 0 s")
        if self.step_s is not None and not self.step_s > 0:
            raise ValueError(f"step_s={self.step_s}: a step takes more than 0 s (or leave it unset)")

    @property
    def mtbf_s(self) -> float:
        """The run's MTBF: any one of its nodes failing stops every rank (synchronous training), so
        failure rates add up over the nodes."""
        return self.node_mtbf_h * 3600 / self.nodes


def young_interval_s(save_stall_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum, sqrt(2 delta M): for comparison; it ignores failures during
    the save and the restart."""
    _check_stall_and_mtbf(save_stall_s, mtbf_s)
    return math.sqrt(2 * save_stall_s * mtbf_s)


def best_interval_s(save_stall_s: float, mtbf_s: float) -> float:
    """Daly's higher-order estimate of the interval that maximizes expected_goodput:
    sqrt(2 delta M) (1 + sqrt(xi) / 3 + xi / 9) - delta with xi = delta / (2 M), and M itself once
    the stall reaches 2 M (Daly 2006, where the series no longer holds). 0 when saving is free."""
    _check_stall_and_mtbf(save_stall_s, mtbf_s)
    if save_stall_s >= 2 * mtbf_s:
        return mtbf_s
    xi = save_stall_s / (2 * mtbf_s)
    return math.sqrt(2 * save_stall_s * mtbf_s) * (1 + math.sqrt(xi) / 3 + xi / 9) - save_stall_s


def expected_goodput(interval_s: float, inputs: FailureInputs) -> float:
    """The expected fraction of wall time that ends up as kept training, by Daly's complete model:
    failures come as a Poisson process of mean M = inputs.mtbf_s; the run trains interval_s, then
    holds for the stall delta while it saves, again and again; a failure anywhere in that segment
    throws the segment away (on average about half of interval + stall) and costs restart_s R
    before training again (a failure during the restart starts it over). Expected wall time per
    kept segment: M e^(R/M) (e^((tau + delta)/M) - 1), so the goodput is its share of tau:

        tau e^(-R/M) / (M (e^((tau + delta)/M) - 1))  ~  tau / (tau + delta) (1 - (R + (tau + delta)/2) / M)

    to first order. An interval of 0 is the limit of saving continuously: 0 with a stall, e^(-R/M)
    without one (only the restarts cost)."""
    if not interval_s >= 0:
        raise ValueError(f"interval_s={interval_s}: an interval cannot be shorter than 0 s")
    mtbf = inputs.mtbf_s
    segment = interval_s + inputs.save_stall_s
    if segment == 0:
        return math.exp(-inputs.restart_s / mtbf)
    # e^(-x) / (1 - e^(-x)) rather than 1 / (e^x - 1): no overflow for an interval of many MTBFs.
    return interval_s / mtbf * math.exp(-(inputs.restart_s + segment) / mtbf) / -math.expm1(-segment / mtbf)


def auto_interval_steps(inputs: FailureInputs) -> int:
    """The best interval in whole steps (at least 1): of the step counts either side of the best
    interval, the one with the higher expected goodput."""
    if inputs.step_s is None:
        raise ValueError("step_s is unset: an interval in steps needs the seconds per step")
    steps = best_interval_s(inputs.save_stall_s, inputs.mtbf_s) / inputs.step_s
    candidates = sorted({max(1, math.floor(steps)), max(1, math.ceil(steps))})
    return max(candidates, key=lambda n: expected_goodput(n * inputs.step_s, inputs))  # a tie: the shorter


def node_mtbf_from_history(node_hours: float, failures: int, prior_node_mtbf_h: float) -> float:
    """A node's MTBF from a run's own chain of jobs (node_hours trained, failures met), blended
    with a prior worth one failure in prior_node_mtbf_h node-hours: (node_hours + prior) /
    (failures + 1). A run with no failure yet so keeps the prior, then earns a longer MTBF as its
    failure-free hours add up; with many failures the history outweighs the prior. (The mean of
    the failure rate's posterior under a gamma prior of shape 1, inverted.)"""
    if not node_hours >= 0:
        raise ValueError(f"node_hours={node_hours}: a run cannot have trained less than 0 node-hours")
    if failures < 0:
        raise ValueError(f"failures={failures}: a run cannot have met fewer than 0 failures")
    if not prior_node_mtbf_h > 0:
        raise ValueError(f"prior_node_mtbf_h={prior_node_mtbf_h}: a node's MTBF must be above 0 hours")
    return (node_hours + prior_node_mtbf_h) / (failures + 1)


@dataclass(frozen=True)
class Advice:
    """The spec's checkpoint interval beside the best one, each with its expected goodput. With no
    step time the spec's interval (in steps) has no length: spec_interval_s and spec_goodput are
    None and nothing is compared."""

    inputs: FailureInputs
    spec_interval_steps: int
    spec_interval_s: float | None
    spec_goodput: float | None
    best_interval_steps: int | None
    best_interval_s: float
    best_goodput: float

    @property
    def far_apart(self) -> bool:
        """Whether the spec's interval loses more than FAR_APART of goodput against the best."""
        return self.spec_goodput is not None and self.best_goodput - self.spec_goodput > FAR_APART

    def lines(self) -> list[str]:
        """What `pretrain plan` prints."""
        i = self.inputs
        step = f", {_duration(i.step_s)} a step" if i.step_s is not None else ", step time unknown"
        out = [f"checkpoint interval: {i.nodes} nodes at a node MTBF of {i.node_mtbf_h:,.0f} h "
               f"(the run's: {_duration(i.mtbf_s)}), save stall {_duration(i.save_stall_s)}, "
               f"restart {_duration(i.restart_s)}{step}"]
        if self.best_interval_steps is None:
            out.append(f"  best: every {_duration(self.best_interval_s)} of training, "
                       f"expected goodput {_percent(self.best_goodput)}")
            out.append(f"  spec: every {self.spec_interval_steps} steps (set the step time to weigh it)")
            return out
        out.append(f"  best: every {self.best_interval_steps} steps ({_duration(self.best_interval_s)}), "
                   f"expected goodput {_percent(self.best_goodput)}")
        out.append(f"  spec: every {self.spec_interval_steps} steps ({_duration(self.spec_interval_s)}), "
                   f"expected goodput {_percent(self.spec_goodput)}")
        if self.far_apart:
            out.append(f"  warning: the spec's interval keeps {_points(self.best_goodput - self.spec_goodput)} "
                       f"less of the wall time as training than the best (far apart: over {_points(FAR_APART)}); "
                       f"set training.checkpoint_interval={self.best_interval_steps}")
        return out


def advise(inputs: FailureInputs, interval_steps: int) -> Advice:
    """The spec's interval (training.checkpoint_interval, in steps) against the best one."""
    if interval_steps < 1:
        raise ValueError(f"interval_steps={interval_steps}: a checkpoint interval is at least 1 step")
    if inputs.step_s is None:
        best_s = best_interval_s(inputs.save_stall_s, inputs.mtbf_s)
        return Advice(inputs, interval_steps, None, None, None, best_s, expected_goodput(best_s, inputs))
    best_steps = auto_interval_steps(inputs)
    spec_s, best_s = interval_steps * inputs.step_s, best_steps * inputs.step_s
    return Advice(inputs, interval_steps, spec_s, expected_goodput(spec_s, inputs),
                  best_steps, best_s, expected_goodput(best_s, inputs))


def _check_stall_and_mtbf(save_stall_s: float, mtbf_s: float) -> None:
    if not save_stall_s >= 0:
        raise ValueError(f"save_stall_s={save_stall_s}: a save cannot hold training for less than 0 s")
    if not mtbf_s > 0:
        raise ValueError(f"mtbf_s={mtbf_s}: an MTBF must be above 0 s")


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 1200:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def _points(fraction: float) -> str:
    points = round(100 * fraction, 1)
    return f"{points:g} percentage point{'' if points == 1 else 's'}"
