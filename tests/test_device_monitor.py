"""The device sampler's sources and the control plane's reading of its records.

neuron-monitor: parsed from a real report (tests/assets/neuron_monitor/, with its source). NVML:
only the conversion of NVML's values into a record is tested here (no GPU in CI, and no fake
NVML); the NVML calls run on a GPU machine (docs/benchmarks.md). The CPU source reads this
machine's own /proc. End to end on the local cluster: tests/test_train_task.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrain.benchmark import RULES, record_from_run
from pretrain.device_samples import DeviceSamples
from pretrain.log_parsers import parse_log
from trainer.monitor import procfs
from trainer.monitor.neuron import error_counts, parse_report
from trainer.monitor.nvml import gpu_record

pytestmark = pytest.mark.pure

ASSETS = Path(__file__).parent / "assets" / "neuron_monitor"
ROOT = Path(__file__).parent.parent


def trn1_report() -> dict:
    return json.loads((ASSETS / "trn1-2xlarge-training.json").read_text())


def test_neuron_monitor_report_of_a_trn1_run_becomes_a_record_per_neuroncore_and_the_host():
    cores, host = parse_report(trn1_report())[:2], parse_report(trn1_report())[2]
    assert [c["device"] for c in cores] == ["nc0", "nc1"]
    assert cores[0]["util_pct"] == pytest.approx(1.3631567613356375) and cores[1]["util_pct"] == 0
    # the core's memory is the sum of its usage breakdown: constants, code, scratchpad, runtime, tensors
    assert cores[0]["memory_gib"] == pytest.approx((196608 + 101125344 + 943608) / 2**30)
    assert cores[1]["memory_gib"] == pytest.approx(32768 / 2**30)
    assert host["host_memory_gib"] == pytest.approx(11233579008 / 2**30)
    # 23,654 generic errors in a working run (260 executions completed): not a faulty node
    assert error_counts(trn1_report())["generic"] == 23654
    assert host["errors"] == 0 and "error_detail" not in host


def test_neuron_runtime_and_uncorrected_ecc_errors_mark_the_node():
    report = trn1_report()
    report["neuron_runtime_data"][0]["report"]["execution_stats"]["error_summary"]["hardware"] = 2
    report["system_data"]["neuron_hw_counters"]["neuron_devices"][0]["mem_ecc_uncorrected"] = 1
    host = parse_report(report)[-1]
    assert host["errors"] == 3
    assert host["error_detail"] == "23654 generic, 2 hardware, 1 mem_ecc_uncorrected"


def test_neuron_report_without_runtimes_has_only_the_host():
    """neuron-monitor on an idle node: no application, so no cores to report."""
    report = trn1_report()
    report["neuron_runtime_data"] = []
    assert [r["device"] for r in parse_report(report)] == ["host"]


def test_nvml_values_convert_to_the_records_units():
    record = gpu_record(3, utilization_pct=97, memory_used_bytes=71 * 2**30, power_mw=612_345, temperature_c=71,
                        sm_clock_mhz=1980, new_ecc_uncorrected=0, xids=[])
    assert record == {"device": "gpu3", "util_pct": 97.0, "memory_gib": 71.0, "power_w": 612.345,
                      "temperature_c": 71, "sm_clock_mhz": 1980, "errors": 0}
    faulty = gpu_record(0, utilization_pct=0, memory_used_bytes=0, power_mw=None, temperature_c=None,
                        sm_clock_mhz=None, new_ecc_uncorrected=2, xids=[79])
    assert faulty["errors"] == 3 and faulty["error_detail"] == "XID 79, 2 uncorrected ECC"
    assert faulty["power_w"] is None


def test_proc_parsers_read_this_machines_proc():
    busy, total = procfs.cpu_times(Path("/proc/stat").read_text())
    assert 0 < busy < total
    assert procfs.rss_bytes(Path("/proc/self/statm").read_text()) > 10 * 2**20  # this interpreter
    read, written = procfs.io_bytes(Path("/proc/self/io").read_text())
    assert read >= 0 and written >= 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert child.pid in procfs.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_cpu_sampler_writes_device_records_until_sigterm(tmp_path):
    """``python -m trainer monitor`` on a node without accelerators: CPU records, TensorBoard."""
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "monitor", "--dir", str(tmp_path / "devices"),
                             "--tensorboard", str(tmp_path / "tb"), "--interval", "0.5"], cwd=ROOT,
                            env={**os.environ, "SLURMD_NODENAME": "node-7"})
    path = tmp_path / "devices" / "node-7.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (path.exists() and path.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) >= 3  # two while running, and the last one taken on SIGTERM
    assert {r["kind"] for r in records} == {"device"} and {r["device"] for r in records} == {"cpu"}
    assert all(0 <= r["util_pct"] <= 100 and r["errors"] == 0 for r in records)
    assert list((tmp_path / "tb" / "devices-node-7").glob("events.out.tfevents.*"))


def test_the_metrics_stream_reader_passes_over_device_records():
    stream = parse_log('{"step": 1, "loss": 5.0}\n{"kind": "device", "node": "n", "time": 1.0, "device": "cpu", '
                       '"util_pct": 50.0}\n{"step": 2, "loss": 4.0}\n')
    assert [p["step"] for p in stream.as_list()] == [1, 2] and stream.skipped == 0


def samples() -> DeviceSamples:
    found = DeviceSamples()
    for i in range(10):
        for gpu, util in ((0, 90.0), (1, 70.0)):
            found.add({"kind": "device", "node": "gpu-1", "time": 1000.0 + 5 * i, "device": f"gpu{gpu}",
                       "util_pct": util, "memory_gib": 40.0 + gpu + i, "errors": 0})
        found.add({"kind": "device", "node": "gpu-2", "time": 1001.0 + 5 * i, "device": "gpu0", "util_pct": 20.0,
                   "memory_gib": 10.0, "errors": int(i == 6), **({"error_detail": "XID 79"} if i == 6 else {})})
    return found


def test_device_samples_give_the_run_summary_its_figures_and_name_faulty_nodes():
    found = samples()
    figures = found.figures()
    assert figures["device_util_pct"] == pytest.approx((80.0 * 10 + 20.0 * 10) / 20)  # per node sample: its mean
    assert figures["device_memory_gib"] == 50.0  # gpu1 of gpu-1 at the last sample
    assert found.faulty_nodes() == {"gpu-2": "gpu0: XID 79"}
    rows = {r["node"]: r for r in found.rows()}
    assert rows["gpu-1"]["mean util %"] == 80.0 and rows["gpu-1"]["devices"] == 2 and rows["gpu-1"]["errors"] == 0
    assert rows["gpu-2"]["errors"] == 1 and rows["gpu-2"]["error detail"] == "gpu0: XID 79"
    assert DeviceSamples().figures() == {"device_util_pct": None, "device_memory_gib": None}


def test_devices_artifact_draws_utilization_and_memory_per_node():
    markdown = samples().markdown("tiny: devices")
    assert markdown.count("xychart-beta") == 2
    assert 'x-axis "minutes" 0 --> 1' in markdown and 'y-axis "utilization %" 0 --> 100' in markdown
    assert "    line [80.0, 80.0" in markdown and "    line [20.0, 20.0" in markdown
    assert "_lines: gpu-1 (#1f77b4), gpu-2 (#ff7f0e)_" in markdown
    assert "| gpu-2 | 1 | 10 | 20.0 | 20.0 | 10.0 | 10.0 | 1 | gpu0: XID 79 |" in markdown


def test_nightly_benchmark_judges_a_drop_in_device_utilization():
    train = {"metrics": {"tokens_per_s": 1000.0, "step_time_ms": 100.0, "mfu_pct": None, "final_loss": 5.0,
                         "device_util_pct": 91.0}, "compiled_during_training": []}
    record = record_from_run({"name": "tiny"}, "run-1", train, {}, None)
    assert record.metrics["device_util_pct"] == 91.0
    assert RULES["device_util_pct"].higher_is_better
