"""The nightly benchmark's judgement: baseline, thresholds, verdicts and the durable history."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from prefect_aws import AwsClientParameters, AwsCredentials

from blocks.storage import StorageLocation
from pretrain import manifest
from pretrain.benchmark import (BenchmarkRecord, History, baseline, check_thresholds, compare, comparison_rows,
                                config_fingerprint, record_from_run, trend_chart)


def a_record(tokens: float, step_ms: float, loss: float = 3.5, passed: bool | None = None, started: str = "",
             **extra: float) -> BenchmarkRecord:
    return BenchmarkRecord(spec_name="tiny-local", fingerprint="f" * 16, flow_run_id=f"run-{started}",
                           started=started or "2026-11-20T02:00:00Z", code_version="git:abc",
                           metrics={"tokens_per_s": tokens, "step_time_ms": step_ms, "final_loss": loss,
                                    "mfu_pct": None, **extra},
                           passed=passed)


def test_baseline_is_the_median_of_the_last_passing_runs():
    history = [a_record(100, 50, passed=True, started="2026-11-01T02:00:00Z"),
               a_record(10, 500, passed=False, started="2026-11-02T02:00:00Z"),  # a bad night: not a baseline
               a_record(110, 48, passed=True, started="2026-11-03T02:00:00Z"),
               a_record(90, 52, passed=True, started="2026-11-04T02:00:00Z"),
               a_record(120, 40, passed=True, started="2026-11-05T02:00:00Z")]
    base, runs = baseline(history, window=3)
    assert [r.started[:10] for r in runs] == ["2026-11-03", "2026-11-04", "2026-11-05"]
    assert base["tokens_per_s"] == 110 and base["step_time_ms"] == 48
    assert "mfu_pct" not in base  # no run measured it (CPU): nothing to compare


def test_a_run_accepted_as_a_new_baseline_starts_it():
    """After an intended slowdown, one run started with new_baseline resets the comparison: the
    fast runs before it are no longer the measure."""
    history = [a_record(1000, 50, passed=True, started=f"2026-11-0{day}T02:00:00Z") for day in (1, 2, 3)]
    history.append(a_record(700, 70, passed=True, started="2026-11-04T02:00:00Z"))
    history[-1].starts_baseline = True
    history.append(a_record(690, 71, passed=True, started="2026-11-05T02:00:00Z"))
    base, runs = baseline(history, window=5)
    assert [r.started[:10] for r in runs] == ["2026-11-04", "2026-11-05"]
    assert base["tokens_per_s"] == 695 and not any(c.regressed for c in compare(a_record(680, 72), base))


def test_a_slower_run_regresses_on_throughput_and_step_time_but_not_on_noise():
    base = {"tokens_per_s": 1000.0, "step_time_ms": 100.0, "final_loss": 3.5}
    noisy = compare(a_record(960, 104), base)
    assert not any(c.regressed for c in noisy)
    slow = {c.metric: c for c in compare(a_record(700, 140), base)}
    assert slow["tokens_per_s"].regressed and slow["step_time_ms"].regressed
    assert not slow["final_loss"].regressed
    assert slow["tokens_per_s"].change == pytest.approx(0.3)
    assert "tokens_per_s 700 tokens/s against a baseline of 1,000 tokens/s (+30.0% worse); threshold 10%" \
        == slow["tokens_per_s"].describe()
    faster = {c.metric: c for c in compare(a_record(1500, 60), base)}
    assert not any(c.regressed for c in faster.values()) and faster["tokens_per_s"].change < 0
    # a looser threshold lets the same run pass
    assert not any(c.regressed for c in compare(a_record(700, 140), base, {"tokens_per_s": 0.5, "step_time_ms": 0.5}))


def test_stage_durations_need_both_the_relative_and_the_absolute_margin():
    base = {"stage_s:tokenize": 4.0, "stage_s:train": 100.0}
    short = {c.metric: c for c in compare(a_record(1, 1, **{"stage_s:tokenize": 12.0, "stage_s:train": 130.0}), base)}
    assert not short["stage_s:tokenize"].regressed  # 3x, but only 8 s: queueing noise
    assert short["stage_s:train"].regressed          # +30 %, 30 s
    # a compile cache that stopped covering training: any new graph counts
    assert compare(a_record(1, 1, graphs_compiled_in_training=1), {"graphs_compiled_in_training": 0})[-1].regressed


def test_a_metric_the_baseline_has_and_this_run_lacks_regresses():
    """A counter that stops being measured (no finite loss at all, graphs no longer counted)
    must not pass silently."""
    base = {"tokens_per_s": 1000.0, "step_time_ms": 100.0, "final_loss": 3.5, "graphs_compiled_in_training": 0.0}
    compared = {c.metric: c for c in compare(a_record(1000, 100, loss=float("nan")), base)}
    assert compared["final_loss"].regressed and compared["graphs_compiled_in_training"].regressed
    assert not compared["tokens_per_s"].regressed
    assert compared["final_loss"].describe() == "final_loss: not measured by this run, against a baseline of 3.5"
    rows = {r["metric"]: r for r in comparison_rows(list(compared.values()))}
    assert rows["final_loss"]["this run"] is None and rows["final_loss"]["verdict"] == "REGRESSED"
    # a metric with no rule in the baseline is not judged
    assert "unruled" not in {c.metric for c in compare(a_record(1000, 100), {**base, "unruled": 1.0})}


def test_a_stage_that_handed_on_an_earlier_output_is_not_timed_nor_missed(tmp_path):
    """A tokenize that found its dataset complete took a second; a fresh one (new code, new data)
    takes minutes. Neither is compared with the other kind."""
    train = {"metrics": {"tokens_per_s": 1000.0, "step_time_ms": 100.0, "mfu_pct": None, "final_loss": 3.5},
             "compiled_during_training": []}
    record = record_from_run({"name": "tiny-local", "paths": {}}, "run-2", train,
                             {"fetch": 0.4, "tokenize": 0.6, "train": 90.0}, None, reused=["fetch", "tokenize"])
    assert record.reused_stages == ["fetch", "tokenize"]
    assert "stage_s:tokenize" not in record.metrics and record.metrics["stage_s:train"] == 90.0
    base = {"tokens_per_s": 1000.0, "stage_s:tokenize": 300.0, "stage_s:train": 90.0}
    compared = {c.metric: c for c in compare(record, base)}
    assert "stage_s:tokenize" not in compared and not any(c.regressed for c in compared.values())
    # the flow's test of "earlier": the output's manifest was complete before the run started
    out = tmp_path / "tokenize-out"
    out.mkdir()
    before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))
    manifest.write_manifest(out, "tokenize", {"input": "k"})
    after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 5))
    assert manifest.created_before(out, after) and not manifest.created_before(out, before)
    assert not manifest.created_before(tmp_path / "nothing-here", after)


def test_comparison_rows_put_regressions_first_and_say_why():
    base = {"tokens_per_s": 1000.0, "step_time_ms": 100.0, "final_loss": 3.5}
    rows = comparison_rows(compare(a_record(500, 100, loss=3.5, graphs_compiled_in_training=0, unruled=1.0), base))
    assert rows[0]["metric"] == "tokens_per_s" and rows[0]["verdict"] == "REGRESSED"
    assert rows[0]["change (worse +)"] == "+50.0%"
    assert {r["metric"]: r["verdict"] for r in rows[1:]} == {"final_loss": "ok", "graphs_compiled_in_training": "no baseline",
                                                           "step_time_ms": "ok"}


def test_unknown_or_negative_thresholds_are_refused_with_the_known_names():
    with pytest.raises(ValueError, match="unknown metric 'tokens'.*tokens_per_s"):
        check_thresholds({"tokens": 0.1})
    with pytest.raises(ValueError, match="thresholds.final_loss=-1"):
        check_thresholds({"final_loss": -1})


def test_fingerprint_ignores_where_outputs_go_but_not_what_runs():
    spec = {"name": "tiny-local", "paths": {"root": "/a"}, "model": {"hidden_size": 128}}
    assert config_fingerprint(spec) == config_fingerprint({**spec, "paths": {"root": "/b"}})
    assert config_fingerprint(spec) != config_fingerprint({**spec, "model": {"hidden_size": 256}})


def test_record_from_run_collects_metrics_graphs_and_stage_times():
    train = {"metrics": {"tokens_per_s": 9000.0, "step_time_ms": 220.0, "mfu_pct": None, "final_loss": 4.7},
             "compiled_during_training": [{"node": "vm", "compiled": 0}, {"node": "vm2", "compiled": 2}]}
    precompile = {"nodes": ["vm"], "graphs": {"graphs traced": 2, "graph breaks": 1, "compiled": 3, "from cache": 0,
                                              "failed": 0}}
    record = record_from_run({"name": "tiny-local", "paths": {}}, "run-1", train, {"fetch": 1.5, "train": 90.0},
                             precompile)
    # MFU and device utilization were not measured: absent, not None or 0
    assert record.metrics == {"tokens_per_s": 9000.0, "step_time_ms": 220.0, "final_loss": 4.7,
                              "graphs_compiled_in_training": 2, "graph_breaks": 1,
                              "graphs_failed_in_precompile": 0, "stage_s:fetch": 1.5, "stage_s:train": 90.0}
    assert record.graphs["compiled"] == 3 and record.code_version


def test_a_new_graph_break_or_a_failed_graph_regresses_but_a_cold_cache_does_not():
    """The precompile counts a change of code can worsen are judged; whether the compile cache
    was warm (graphs compiled against served from it) is not a regression."""
    train = {"metrics": {"tokens_per_s": 9000.0, "step_time_ms": 220.0, "mfu_pct": None, "final_loss": 4.7},
             "compiled_during_training": [{"node": "vm", "compiled": 0}]}

    def run(breaks: int, failed: int, compiled: int) -> BenchmarkRecord:
        graphs = {"graphs traced": 4, "graph breaks": breaks, "compiled": compiled, "from cache": 4 - compiled,
                  "failed": failed}
        return record_from_run({"name": "tiny-local", "paths": {}}, "run", train, {},
                               {"nodes": ["vm"], "graphs": graphs})

    base = run(breaks=1, failed=0, compiled=0).values()
    assert not [c for c in compare(run(breaks=1, failed=0, compiled=4), base) if c.regressed]
    regressed = {c.metric: c.describe() for c in compare(run(breaks=2, failed=1, compiled=0), base) if c.regressed}
    assert set(regressed) == {"graph_breaks", "graphs_failed_in_precompile"}
    assert regressed["graph_breaks"].startswith("graph_breaks 2 breaks against a baseline of 1 breaks")


@pytest.mark.parametrize("where", ["file", "s3"])
def test_history_round_trip_keeps_only_the_same_configuration(where, tmp_path, s3, s3_endpoint):
    if where == "file":
        history = History(str(tmp_path / "benchmarks"))
    else:
        bucket = f"bench-history-{uuid.uuid4().hex[:8]}"  # the stack's S3 server outlives a test run
        s3.create_bucket(Bucket=bucket)
        # as the nightly flow builds it: from a StorageLocation block and its credentials block
        location = StorageLocation(url=f"s3://{bucket}/nightly", aws_credentials=AwsCredentials(
            aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1",
            aws_client_parameters=AwsClientParameters(endpoint_url=s3_endpoint)))
        history = History(location.url, location.storage_options())
    assert history.load("tiny-local", "f" * 16) == []
    first = a_record(100, 50, passed=True, started="2026-11-01T02:00:00Z")
    second = a_record(90, 55, passed=False, started="2026-11-02T02:00:00Z")
    other = a_record(1, 1, passed=True, started="2026-11-03T02:00:00Z")
    other.fingerprint = "0" * 16
    for record in (second, other, first):
        history.append(record)
    loaded = history.load("tiny-local", "f" * 16)
    assert [r.started for r in loaded] == [first.started, second.started]
    assert loaded[1].passed is False and loaded[0].metrics == first.metrics
    # A retry of the judging task finds its run's own record: it is not its own baseline.
    assert [r.started for r in history.load("tiny-local", "f" * 16, other_than=first.flow_run_id)] == [second.started]
    if where == "file":
        # a damaged file beside the records is skipped, never fatal; no temporary file is left
        (tmp_path / "benchmarks" / "tiny-local" / "broken.json").write_text("{not json")
        assert len(history.load("tiny-local", "f" * 16)) == 2
        assert not list((tmp_path / "benchmarks").rglob(".*.tmp"))
        stored = json.loads(next((tmp_path / "benchmarks" / "tiny-local").glob("2026-11-01*.json")).read_text())
        assert stored["metrics"]["tokens_per_s"] == 100


def test_trend_chart_draws_one_value_per_run():
    runs = [a_record(100 + i, 50, passed=True, started=f"2026-11-0{i + 1}T02:00:00Z") for i in range(4)]
    chart = trend_chart(runs, "tokens_per_s")
    assert chart.startswith("xychart-beta")
    assert 'x-axis ["11-01 02:00", "11-02 02:00", "11-03 02:00", "11-04 02:00"]' in chart
    line = next(s for s in chart.splitlines() if s.strip().startswith("line"))
    assert [float(v) for v in line.strip()[len("line ["):-1].split(",")] == [100, 101, 102, 103]
    assert trend_chart(runs, "mfu_pct") == ""
    # two runs started in the same minute keep apart on the axis
    runs.append(a_record(104, 50, passed=True, started="2026-11-04T02:00:41Z"))
    assert 'x-axis ["11-01 02:00", "11-02 02:00", "11-03 02:00", "11-04 02:00:00", "11-04 02:00:41"]' in trend_chart(
        runs, "tokens_per_s")


def test_a_history_block_that_does_not_exist_fails_before_any_stage_runs(local_stack, tmp_path):
    from flows.nightly_benchmark import nightly_benchmark

    state = nightly_benchmark(preset="tiny-local", overrides=[f"paths.root={tmp_path}"], steps=2,
                              history="no-such-history-block", return_state=True)
    assert state.is_failed() and "no-such-history-block" in str(state.message), state.message
    assert not (tmp_path / "fetch").exists()  # nothing was fetched, let alone trained
    # A block that exists but points where nothing can be written (a bucket that is not there)
    StorageLocation(url=f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/nightly", aws_credentials=AwsCredentials(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1",
        aws_client_parameters=AwsClientParameters(endpoint_url=local_stack["PRETRAIN_S3_ENDPOINT"]))
    ).save("unwritable-history", overwrite=True)
    state = nightly_benchmark(preset="tiny-local", overrides=[f"paths.root={tmp_path}"], steps=2,
                              history="unwritable-history", return_state=True)
    assert state.is_failed() and "the benchmark history at s3://no-such-bucket-" in str(state.message), state.message
    assert "cannot be written" in str(state.message) and not (tmp_path / "fetch").exists()
