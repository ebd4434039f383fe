"""The checkpoint-interval model (pretrain/checkpoint_advice.py, docs/checkpoints.md): published
figures reproduced from their inputs, the optimum, the advice `pretrain plan` prints, bad inputs."""

from __future__ import annotations

import math

import pytest

from pretrain.checkpoint_advice import (
    DEFAULT_NODE_MTBF_H, FailureInputs, advise, auto_interval_steps, best_interval_s, expected_goodput,
    node_mtbf_from_history, young_interval_s,
)

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

DAY_S = 86400
# Meta's RSC-1 (Kokolis et al. 2024): 6.50 failures per 1,000 node-days, as one node's MTBF in hours.
RSC1_NODE_MTBF_H = 24 / 6.50e-3


def test_the_default_node_mtbf_gives_llama_3s_interruption_rate_back():
    """419 unexpected interruptions in 54 days on 16,384 GPUs, 8 a server (Llama 3, 3.3.4)."""
    run = FailureInputs(nodes=16384 // 8, node_mtbf_h=DEFAULT_NODE_MTBF_H, save_stall_s=0, restart_s=0)
    assert 54 * DAY_S / run.mtbf_s == pytest.approx(419)


def test_llama_3s_effective_training_time_above_90_percent_is_reproduced():
    """Even with the longest stall the paper's figures allow (4 GB a GPU on all 16,384 GPUs at the
    storage's sustained 2 TB/s) and a 5-minute restart, the best interval keeps over 90 %."""
    stall_s = 16384 * 4e9 / 2e12
    run = FailureInputs(nodes=2048, node_mtbf_h=DEFAULT_NODE_MTBF_H, save_stall_s=stall_s, restart_s=300)
    best = best_interval_s(run.save_stall_s, run.mtbf_s)
    assert 13 * 60 < best < 15 * 60
    assert 0.90 < expected_goodput(best, run) < 0.91


def test_meta_rsc_job_mttf_projections_are_reproduced():
    """Kokolis et al.: MTTF 1.8 h at 16,384 GPUs and 0.23 h at 131,072 GPUs from RSC-1's rate."""
    at_16k = FailureInputs(nodes=16384 // 8, node_mtbf_h=RSC1_NODE_MTBF_H, save_stall_s=0, restart_s=0)
    at_131k = FailureInputs(nodes=131072 // 8, node_mtbf_h=RSC1_NODE_MTBF_H, save_stall_s=0, restart_s=0)
    assert round(at_16k.mtbf_s / 3600, 1) == 1.8
    assert round(at_131k.mtbf_s / 3600, 2) == 0.23


def test_meta_rsc_expected_ettr_of_a_16000_gpu_job_is_reproduced():
    """Kokolis et al.: a 16,000-GPU job on RSC-1, non-blocking checkpoints, 5-minute restart:
    expected ETTR 0.7 checkpointing hourly, 0.93 every 5 minutes."""
    job = FailureInputs(nodes=16000 // 8, node_mtbf_h=RSC1_NODE_MTBF_H, save_stall_s=0, restart_s=300)
    assert round(expected_goodput(3600, job), 1) == 0.7
    assert round(expected_goodput(300, job), 2) == 0.93


@pytest.mark.parametrize(("mtbf_min", "published_min"), [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_gives_his_published_optima_back(mtbf_min, published_min):
    """Daly 2006, figures 3 to 5: a 5-minute dump at M = 24 h, 6 h and 15 min."""
    best_min = best_interval_s(5 * 60, mtbf_min * 60) / 60
    assert round(best_min, 1 if published_min < 10 else 0) == published_min


def test_young_and_daly_agree_with_their_closed_forms_on_a_hand_checked_case():
    # stall 50 s, MTBF 10,000 s: sqrt(2 x 50 x 10,000) = 1,000 s; xi = 50 / 20,000 = 0.0025,
    # 1,000 x (1 + 0.05 / 3 + 0.0025 / 9) - 50 = 966.944 s
    assert young_interval_s(50, 10_000) == pytest.approx(1000)
    assert best_interval_s(50, 10_000) == pytest.approx(966.944, abs=1e-3)
    # Daly's edge: a stall of twice the MTBF or more, save once an MTBF
    assert best_interval_s(20_000, 10_000) == 10_000
    assert best_interval_s(0, 10_000) == 0


RUNS = {
    # about 6 s a step: 6 x 405e9 x 16M tokens over 16,384 GPUs at 400 TFLOP/s (Llama 3, Table 4)
    "llama 3 405b": FailureInputs(2048, DEFAULT_NODE_MTBF_H, save_stall_s=32.8, restart_s=300, step_s=6.0),
    "llama3-70b on 16 trn1": FailureInputs(16, DEFAULT_NODE_MTBF_H, save_stall_s=120, restart_s=1200, step_s=320.0),
    "one node, long stall": FailureInputs(1, 500, save_stall_s=3600, restart_s=600, step_s=60.0),
}


@pytest.mark.parametrize("run", RUNS.values(), ids=RUNS.keys())
def test_the_best_interval_is_a_maximum_of_expected_goodput(run):
    best = best_interval_s(run.save_stall_s, run.mtbf_s)
    for neighbour in (0.95 * best, 1.05 * best):
        assert expected_goodput(neighbour, run) < expected_goodput(best, run)
    steps = auto_interval_steps(run)
    for neighbour in (steps - 1, steps + 1):
        assert expected_goodput(neighbour * run.step_s, run) < expected_goodput(steps * run.step_s, run)


def test_one_checkpoint_per_100_day_run_is_far_apart_at_16_nodes():
    run = FailureInputs(16, DEFAULT_NODE_MTBF_H, save_stall_s=120, restart_s=1200, step_s=320.0)
    advice = advise(run, interval_steps=100 * DAY_S // 320)
    assert advice.far_apart
    assert advice.best_goodput - advice.spec_goodput > 0.5
    assert advice.lines()[-1].startswith("  warning:")
    assert f"training.checkpoint_interval={advice.best_interval_steps}" in advice.lines()[-1]


def test_an_interval_near_the_best_is_not_flagged():
    run = FailureInputs(16, DEFAULT_NODE_MTBF_H, save_stall_s=120, restart_s=1200, step_s=320.0)
    advice = advise(run, interval_steps=auto_interval_steps(run) + 5)
    assert not advice.far_apart
    assert advice.spec_goodput < advice.best_goodput
    assert not any("warning" in line for line in advice.lines())


def test_without_a_step_time_the_advice_is_in_seconds_only():
    run = FailureInputs(16, DEFAULT_NODE_MTBF_H, save_stall_s=120, restart_s=1200)
    advice = advise(run, interval_steps=10)
    assert (advice.spec_goodput, advice.best_interval_steps, advice.far_apart) == (None, None, False)
    assert advice.best_interval_s == best_interval_s(120, run.mtbf_s)
    assert "step time unknown" in advice.lines()[0]
    # a free save has no best interval but "always": goodput loses only the restarts
    free = advise(FailureInputs(16, DEFAULT_NODE_MTBF_H, save_stall_s=0, restart_s=1200), interval_steps=10)
    assert free.best_goodput == pytest.approx(math.exp(-1200 / run.mtbf_s))


def test_node_mtbf_from_history_blends_the_runs_record_with_the_prior():
    prior = 6000.0
    assert node_mtbf_from_history(0, 0, prior) == prior  # nothing run yet: the prior
    # no failure yet claims no infinite MTBF, but the failure-free hours count
    assert node_mtbf_from_history(4000, 0, prior) == 10_000
    assert node_mtbf_from_history(10_000, 3, prior) == 4000
    # many failures: the run's own rate wins
    assert node_mtbf_from_history(1_000_000, 999, prior) == pytest.approx(1_000_000 / 999, rel=0.01)


@pytest.mark.parametrize(("call", "named"), [
    (lambda: FailureInputs(0, DEFAULT_NODE_MTBF_H, 10, 60), "nodes=0"),
    (lambda: FailureInputs(16, 0, 10, 60), "node_mtbf_h=0"),
    (lambda: FailureInputs(16, DEFAULT_NODE_MTBF_H, -1, 60), "save_stall_s=-1"),
    (lambda: FailureInputs(16, DEFAULT_NODE_MTBF_H, 10, -1), "restart_s=-1"),
    (lambda: FailureInputs(16, DEFAULT_NODE_MTBF_H, 10, 60, step_s=0), "step_s=0"),
    (lambda: best_interval_s(-1, 1000), "save_stall_s=-1"),
    (lambda: best_interval_s(10, 0), "mtbf_s=0"),
    (lambda: expected_goodput(-1, FailureInputs(16, DEFAULT_NODE_MTBF_H, 10, 60)), "interval_s=-1"),
    (lambda: auto_interval_steps(FailureInputs(16, DEFAULT_NODE_MTBF_H, 10, 60)), "step_s"),
    (lambda: advise(FailureInputs(16, DEFAULT_NODE_MTBF_H, 10, 60, 320.0), 0), "interval_steps=0"),
    (lambda: node_mtbf_from_history(-1, 0, 6000), "node_hours=-1"),
    (lambda: node_mtbf_from_history(100, -1, 6000), "failures=-1"),
    (lambda: node_mtbf_from_history(100, 0, 0), "prior_node_mtbf_h=0"),
])
def test_bad_inputs_raise_a_value_error_naming_the_input(call, named):
    with pytest.raises(ValueError, match=named):
        call()
