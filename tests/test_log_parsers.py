"""One metrics stream from NxDT, NeMo, NxD, Megatron-LM, torchtitan and native logs, on the
runbooks' sample lines and on published logs (tests/assets/logs/); malformed lines are skipped
and counted."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path


import pytest
from tqdm import tqdm

from pretrain.log_parsers import parse_log, preprocess_progress, rank_error
from pretrain.loss_curve import metrics_summary
from public_logs import blocks

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

NXDT_NEW = ("Epoch 0:   5%|▍         | 3/62 [02:59<58:44,  0.02it/s, v_num=8-06, reduced_train_loss=6.930, "
            "chosen_rewards=-0.81, rejected_rewards=-0.675, lr=2.73e-5, parameter_norm=1.95e+3, global_step=1.000, "
            "consumed_samples=32.00, throughput=0.108, throughput_peak=0.0677, gradient_norm=8.600]")
NXDT_OLD = ("Epoch 0:   3%|▎         | 3/91 [16:05<7:52:06, 321.89s/it, loss=6.7, v_num=2, reduced_train_loss=13.40, "
            "lr=7.5e-9, parameter_norm=5536.0, global_step=1.000, consumed_samples=2048.0]")
MEGATRON = (" [2026-05-04 12:00:01.123456] iteration       10/  500000 | consumed samples:         2880 | "
            "elapsed time per iteration (ms): 1834.5 | throughput per GPU (TFLOP/s/GPU): 402.1 | "
            "learning rate: 6.000000E-05 | global batch size:   288 | lm loss: 9.876543E+00 | loss scale: 1.0 | "
            "grad norm: 3.210 | number of skipped iterations:   0 | number of nan iterations:   0 |")
MEGATRON_OLD = (" iteration       20/  500000 | consumed samples:         5760 | elapsed time per iteration (ms): 1800.0 | "
                "learning rate: 6.000E-05 | global batch size:   288 | lm loss: 8.500000E+00 | loss scale: 1.0 | "
                "number of skipped iterations:   0 | number of nan iterations:   0 |")
# Every field of Megatron-LM's iteration line in its order (``training_log`` in NVIDIA/Megatron-LM
# megatron/training/training.py), the optional ones with Megatron-LM's labels:
# skipped samples, throughput, energy and power, the decoupled lr (megatron-core 0.6-0.14), an MTP
# loss and MoE losses, num zeros, params norm.
MEGATRON_FULL = (" [2026-05-04 12:00:01.123456] iteration      300/  500000 | consumed samples:        86400 | "
                 "skipped samples:          288 | elapsed time per iteration (ms): 1834.5 | "
                 "throughput per GPU (TFLOP/s/GPU): 402.1 | energy per GPU (J/iter/GPU): 1992.5 | "
                 "power per GPU (W/GPU): 647.8 | learning rate: 6.000000E-05 | decoupled learning rate: 1.000000E-04 | "
                 "global batch size:   288 | lm loss: 9.876543E+00 | mtp_1 loss: 9.912345E+00 | "
                 "load_balancing_loss: 1.002000E+00 | z_loss: 3.100000E-03 | loss scale: 65536.0 | grad norm: 3.210 | "
                 "num zeros: 12.0 | params norm: 1234.567 | number of skipped iterations:   1 | "
                 "number of nan iterations:   2 |")
MEGATRON_FULL_POINT = {
    "step": 300, "train_iters": 500000, "time": datetime(2026, 5, 4, 12, 0, 1, 123456).timestamp(),
    "consumed_samples": 86400, "skipped_samples": 288, "step_time_ms": 1834.5, "tflops_per_device": 402.1,
    "energy_per_device_j": 1992.5, "power_per_device_w": 647.8, "lr": 6e-5, "decoupled_lr": 1e-4,
    "global_batch_size": 288, "loss": 9.876543, "mtp_1_loss": 9.912345, "load_balancing_loss": 1.002,
    "z_loss": 3.1e-3, "loss_scale": 65536.0, "grad_norm": 3.21, "num_zeros": 12, "param_norm": 1234.567,
    "skipped_iterations": 1, "nan_iterations": 2}
NXD = ("step 1 step_time 244.7649691104889s throughput 3.935193537274158 seq/s loss 13.412860887125134 "
       "grad norm 1.9788274765014648")


def test_nxdt_progress_bar_updates_split_on_carriage_returns():
    second = NXDT_NEW.replace("global_step=1.000", "global_step=2.000").replace("reduced_train_loss=6.930",
                                                                               "reduced_train_loss=6.500")
    stream = parse_log("\r".join([NXDT_NEW, NXDT_NEW, second]) + "\n" + NXDT_OLD)
    points = stream.as_list()
    # global_step counts from 0: global_step=1 is the second step, and the 70B line's
    # consumed_samples (global batch 1024) says so too.
    assert [p["step"] for p in points] == [2, 3]
    assert points[0]["consumed_samples"] / 1024 == points[0]["step"]
    assert points[1]["loss"] == 6.5 and points[1]["grad_norm"] == 8.6 and points[1]["param_norm"] == 1950.0
    assert points[1]["throughput_seq_s"] == 0.108 and points[1]["throughput_peak_seq_s"] == 0.0677
    assert points[1]["lr"] == 2.73e-5 and points[1]["consumed_samples"] == 32.0
    assert points[0]["loss"] == 13.40  # the older line for the same step came last and wins
    assert points[0]["lr"] == 7.5e-9
    assert stream.skipped == 0


def test_megatron_iteration_lines_with_and_without_timestamp():
    points = parse_log(MEGATRON + "\n" + MEGATRON_OLD + "\n").as_list()
    assert [p["step"] for p in points] == [10, 20]
    first = points[0]
    assert first["loss"] == 9.876543 and first["lr"] == 6e-5 and first["grad_norm"] == 3.21
    assert first["step_time_ms"] == 1834.5 and first["tflops_per_device"] == 402.1
    assert first["consumed_samples"] == 2880 and first["nan_iterations"] == 0 and first["train_iters"] == 500000
    assert "grad_norm" not in points[1]
    assert first["time"] == datetime(2026, 5, 4, 12, 0, 1, 123456).timestamp() and "time" not in points[1]


def test_megatron_line_reads_every_field_with_and_without_timestamp():
    no_time = MEGATRON_FULL.replace(" [2026-05-04 12:00:01.123456]", "")
    seconds = MEGATRON_FULL.replace("iteration      300/", "iteration      301/").replace(
        "[2026-05-04 12:00:01.123456]", "[2024-05-04 12:00:01]")  # core_v0.6 - 2025: no microseconds
    stream = parse_log("\n".join([MEGATRON_FULL, seconds]))
    with_time, core_v06 = stream.as_list()
    assert with_time == MEGATRON_FULL_POINT
    assert core_v06["time"] == datetime(2024, 5, 4, 12, 0, 1).timestamp()
    assert parse_log(no_time).as_list() == [{k: v for k, v in MEGATRON_FULL_POINT.items() if k != "time"}]
    assert stream.skipped == 0


def test_megatron_unknown_numeric_fields_are_kept_under_snake_case_names():
    line = (" iteration       40/  500000 | consumed samples:        11520 | tokens per expert (max/mean): 1.75 | "
            "step: 999 | packing: 3 of 4 bins | lm loss: 8.100000E+00 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 |")
    stream = parse_log(line)
    # A field that is not a number ("packing") is left out, the line is not lost; a field named
    # like a stream key ("step") cannot move the point off its iteration.
    assert stream.as_list() == [{"step": 40, "train_iters": 500000, "consumed_samples": 11520,
                                 "tokens_per_expert_max_mean": 1.75, "loss": 8.1, "skipped_iterations": 0,
                                 "nan_iterations": 0}]
    assert stream.skipped == 0


def test_megatron_interval_of_skipped_iterations_is_a_point_without_loss():
    # Every iteration of the interval skipped (fp16 overflow): Megatron-LM prints no loss then.
    line = (" [2026-05-04 12:05:00.000001] iteration      310/  500000 | consumed samples:        89280 | "
            "elapsed time per iteration (ms): 1800.0 | learning rate: 6.000000E-05 | global batch size:   288 | "
            "loss scale: 32768.0 | number of skipped iterations:  10 | number of nan iterations:   3 |")
    stream = parse_log(line)
    (point,) = stream.as_list()
    assert point["step"] == 310 and point["skipped_iterations"] == 10 and point["nan_iterations"] == 3
    assert "loss" not in point and stream.skipped == 0


def test_torn_lines_report_no_cut_value():
    # A process killed mid-print: "consumed samples:        864" must not become 864 samples,
    # nor "consumed_samples=20" 20.
    for line in (MEGATRON_FULL, NXDT_OLD):
        (full,) = parse_log(line).as_list()
        for cut in range(len(line)):
            for point in parse_log(line[:cut]).as_list():
                assert point.items() <= full.items(), line[:cut]
    # Another rank's output that Slurm appended after the last "|" is not part of the line.
    appended = parse_log(MEGATRON_FULL + "[rank7]: grad norm: 99.000 | extra: 1 |").as_list()
    assert appended == parse_log(MEGATRON_FULL).as_list()


def _bar_number(n: float) -> str:
    """How Lightning's progress bar prints a float metric: tqdm's format_num, then numbers
    without an exponent right-padded to 5 characters (``Tqdm.format_num`` in Lightning-AI/pytorch-lightning
    src/lightning/pytorch/callbacks/progress/tqdm_progress.py)."""
    text = tqdm.format_num(n)
    return text if "e" in text else (text if "." in text else text + ".").ljust(5, "0")


def test_nxdt_rounded_consumed_samples_is_kept_as_printed_and_says_so():
    # Step 100 at global batch 1024: 102400 samples, which tqdm prints as 1.02e+5.
    line = NXDT_OLD.replace("global_step=1.000", f"global_step={_bar_number(99.0)}").replace(
        "consumed_samples=2048.0", f"consumed_samples={_bar_number(102400.0)}")
    assert "consumed_samples=1.02e+5]" in line
    stream = parse_log(line)
    assert stream.as_list() == [{
        "step": 100, "epoch": 0, "progress_pct": 3, "progress_count": 3, "progress_total": 91, "elapsed_s": 965.0,
        "remaining_s": 7 * 3600 + 52 * 60 + 6, "s_per_it": 321.89, "running_loss": 6.7, "v_num": "2", "loss": 13.4,
        "lr": 7.5e-9, "param_norm": 5536.0, "global_step": 99.0, "consumed_samples": 102000.0,
        "consumed_samples_rounded": 1.0}]
    assert stream.skipped == 0


def test_nxdt_rounded_global_step_lands_on_the_printed_step_and_says_so():
    # global_step 1000 and 1001 both print as 1e+3: one approximate point, the later update's.
    lines = [NXDT_NEW.replace("global_step=1.000", f"global_step={_bar_number(float(g))}").replace(
        "reduced_train_loss=6.930", f"reduced_train_loss={loss}") for g, loss in ((1000, "6.930"), (1001, "6.920"))]
    assert "global_step=1e+3," in lines[0] and "global_step=1e+3," in lines[1]
    stream = parse_log("\r".join(lines))
    assert [(p["step"], p["loss"], p["step_rounded"]) for p in stream.as_list()] == [(1001, 6.92, 1.0)]
    # A step printed exactly is never overwritten by a rounded one that lands on it.
    exact = parse_log(NXDT_NEW.replace("global_step=1.000", "global_step=1000.0"))  # as printed elsewhere
    parse_log(lines[1], exact)
    assert exact.points[1001]["loss"] == 6.93 and "step_rounded" not in exact.points[1001] and exact.skipped == 1


def test_nxdt_every_global_step_tqdm_prints_lands_within_its_rounding():
    """The loss curve of a long NxDT run goes on past step 10,000, where tqdm rounds most counts:
    exact steps where tqdm printed them exactly, the others at the printed value, flagged."""
    # consumed_samples = step at global batch 1: each point must carry its own line's count.
    steps = range(0, 200_000, 11)
    bars = [NXDT_NEW.replace("global_step=1.000", f"global_step={_bar_number(float(g))}").replace(
        "consumed_samples=32.00", f"consumed_samples={_bar_number(float(g + 1))}") for g in steps]
    stream = parse_log("\r".join(bars))
    points = stream.as_list()
    assert stream.skipped == 0 and points[-1]["step"] >= 199_000
    exact = [p for p in points if "step_rounded" not in p]
    assert exact and all(p["consumed_samples"] == p["step"] for p in exact if "consumed_samples_rounded" not in p)
    # a rounded point is within tqdm's rounding (3 significant digits) of a step that printed it
    assert all(any(abs(p["step"] - (g + 1)) <= 0.005 * (g + 1) for g in steps) for p in points if "step_rounded" in p)
    # from global_step 99950 on tqdm rounds every count: one flagged point per printed value
    late = [p for p in points if p["step"] > 99_951]
    assert all("step_rounded" in p for p in late) and len(late) == len({b.split("global_step=")[1].split(",")[0]
                                                                          for b, g in zip(bars, steps) if g >= 99_950})


def test_nxd_llama_and_native_json_lines():
    points = parse_log(NXD + '\n{"step": 2, "loss": 12.9, "lr": 0.0003, "tokens_per_s": 5120.5}\n').as_list()
    assert points[0] == {"step": 1, "step_time_ms": 244764.9691104889, "throughput_seq_s": 3.935193537274158,
                         "loss": 13.412860887125134, "grad_norm": 1.9788274765014648}
    assert points[1]["tokens_per_s"] == 5120.5


def test_native_event_lines_are_not_metrics():
    text = "\n".join(['{"step": 2, "loss": 12.9, "time": 1700000000.5}',
                      '{"step": 2, "event": "checkpoint_saved", "bytes": 4096, "time": 1700000009.0}',
                      '{"step": 3, "event": "nan_skipped", "loss": null, "time": 1700000010.0}'])
    stream = parse_log(text)
    assert stream.as_list() == [{"step": 2, "loss": 12.9, "time": 1700000000.5}]
    assert stream.skipped == 0


def test_malformed_lines_are_skipped_and_counted_never_raised():
    text = "\n".join([
        "Epoch 0:   5%| | 3/62 [02:59<58:44, reduced_train_loss=nan?, global_step=x]",
        " iteration       30/  500000 | consumed samples: 8640 | lm loss: not-a-number |",
        '{"step": "three", "loss": 1}',
        '{"broken json',
        "ordinary output line",
        " [2026-13-40 25:00:00] iteration       40/  500000 | lm loss: 1.000000E+00 |",
        " iteration       50/  500000 | consumed samples: 14400 | grad norm: 1.2.3 | lm loss: 1.000000E+00 |",
        MEGATRON,
    ])
    stream = parse_log(text)
    assert [p["step"] for p in stream.as_list()] == [10]
    assert stream.skipped == 6


def test_a_real_megatron_lm_run_becomes_the_loss_curve_with_its_validation():
    """Megatron-LM 0.16.1's own log (tests/assets/logs/SOURCES.md): every iteration line, and the
    validation lines at their iterations; at the last iteration the end-of-training evaluation,
    printed after the periodic one, is the value kept."""
    log = (Path(__file__).parent / "assets/logs/megatron-lm-0.16.1-h100.log").read_text()
    stream = parse_log(log)
    assert sorted(stream.points) == list(range(1, 61)) and stream.skipped == 0
    assert all("loss" in p and "lr" in p and "grad_norm" in p and "time" in p for p in stream.points.values())
    assert stream.points[1]["loss"] == 8.299163 and stream.points[60]["loss"] == 6.422389
    validated = {step: (p["val_loss"], p["val_ppl"]) for step, p in stream.points.items() if "val_loss" in p}
    assert validated == {20: (6.753995, 857.4779), 40: (6.608345, 741.2552), 60: (6.550022, 699.2596)}


def test_megatron_validation_lines_of_every_form():
    stream = parse_log("\n".join([
        " validation loss at iteration 1000 | lm loss value: 2.500000E+00 | lm loss PPL: 1.218249E+01 | ",
        " validation loss at iteration 2000 on test set | lm loss value: 2.400000E+00 | lm loss PPL: 1.102318E+01 | "
        "mtp_1 loss value: 2.600000E+00 | mtp_1 loss PPL: 1.346374E+01 | ",
        " validation loss at iteration 3000 | lm loss value: 2.3",  # torn mid-value: nothing from it
    ]))
    assert stream.points[1000] == {"step": 1000, "val_loss": 2.5, "val_ppl": 12.18249}
    assert stream.points[2000] == {"step": 2000, "test_loss": 2.4, "test_ppl": 11.02318, "test_mtp_1_loss": 2.6,
                                   "test_mtp_1_ppl": 13.46374}
    assert 3000 not in stream.points


def test_several_validation_sets_each_keep_their_values():
    """--multiple-validation-sets: " validation-<index> loss at ..." (``evaluate_and_print_results``
    in NVIDIA/Megatron-LM megatron/training/training.py, core_v0.16.1)."""
    stream = parse_log("\n".join(
        f" validation-{i} loss at iteration 500 | lm loss value: {v:.6E} | lm loss PPL: 1.000000E+01 | "
        for i, v in ((0, 3.1), (1, 2.9))))
    assert stream.points[500] == {"step": 500, "val_set0_loss": 3.1, "val_set0_ppl": 10.0, "val_set1_loss": 2.9,
                                  "val_set1_ppl": 10.0}


@pytest.mark.parametrize("prefix, labels", [
    ("1: ", {"srun_task": 1}),           # srun --label
    ("12:  ", {"srun_task": 12}),        # srun --label among ten or more tasks
    (" 3: ", {"srun_task": 3}),
    ("[default7]:", {"local_rank": 7}),  # torchrun --tee 3
    ("15: [default7]:", {"srun_task": 15, "local_rank": 7}),
    # SkyPilot's prefixes (skypilot-org/skypilot sky/skylet/executor/slurm.py): a worker node's, the setup's
    ("(worker1, rank=1, pid=15406, ip=10.164.0.57) ",
     {"skypilot_name": "worker1", "node_rank": 1, "pid": 15406, "node_ip": "10.164.0.57"}),
    ("\x1b[36m(setup pid=8665)\x1b[0m ", {"skypilot_name": "setup", "pid": 8665}),
])
def test_launcher_labels_before_a_megatron_line_name_the_rank_that_printed_it(prefix, labels):
    line = prefix + MEGATRON
    evaluation = prefix + " validation loss at iteration 10 | lm loss value: 2.500000E+00 | lm loss PPL: 1.218249E+01 |"
    point = parse_log(line + "\n" + evaluation).points[10]
    keys = ("srun_task", "local_rank", "skypilot_name", "node_rank", "pid", "node_ip")
    assert {k: point[k] for k in keys if k in point} == labels
    assert point["loss"] == 9.876543 and point["val_loss"] == 2.5 and point["time"] == parse_log(MEGATRON).points[10]["time"]



def public_megatron_logs() -> dict[str, list[str]]:
    """The public Megatron-LM lines by source file, each file's lines in order."""
    files: dict[str, list[str]] = {}
    for source, lines in blocks("megatron-lm-public-lines.txt"):
        files.setdefault(source.split("#")[0], []).extend(lines)
    return files


def test_every_line_of_public_megatron_logs_adds_its_values():
    """Real iteration and validation lines from published logs and issues (Megatron-LM from 2021
    to 2025, its MoE and MTP fields, Megatron-DeepSpeed, the AWS Neuron fork), each file's lines
    parsed in order: none is skipped, and every line adds or changes values."""
    files = public_megatron_logs()
    assert sum(map(len, files.values())) >= 20
    for source, lines in files.items():
        for i, line in enumerate(lines):
            before, after = parse_log("\n".join(lines[:i])), parse_log("\n".join(lines[: i + 1]))
            assert after.skipped == 0 and after.points != before.points, (source, line)


def test_public_megatron_lines_keep_every_field_under_its_name():
    points = {"/".join(source.split("/")[-2:]): parse_log("\n".join(lines)).points
              for source, lines in public_megatron_logs().items()}
    assert points["gpt3/README.md"][25]["srun_task"] == 1  # "1:  iteration 25/73242187 ..." (srun --label)
    assert "loss" not in points["gpt3/README.md"][1] and points["gpt3/README.md"][1]["skipped_iterations"] == 1
    # the Neuron fork's trailing field: 1024 sequences / 7.3131 s
    assert points["jobs/gpt3-launch-job.md"][64]["throughput_seq_s"] == 140.022
    assert points["issues/756"][71]["load_balancing_loss"] == 1.013377 and points["issues/756"][71]["num_zeros"] == 0.0
    ling = points["docs/gpu_based_training.md"][1]
    assert (ling["z_loss"], ling["mtp_1_loss"], ling["tflops_per_device"]) == (10.91659, 2.828435, 18.0)
    deepspeed = points["microsoft/llama-note.md"][1]
    keys = ("consumed_tokens", "actual_seqlen", "samples_per_second", "tflops_per_device")  # DeepSpeed's TFLOPs: per GPU
    assert {k: deepspeed[k] for k in keys} == {
        "consumed_tokens": 65536, "actual_seqlen": 2048, "samples_per_second": 7.582, "tflops_per_device": 16.98}
    drawn = points["microsoft/llama-note.md"][2500]  # "... on 320-sample draw from test set"
    assert (drawn["test_loss"], drawn["test_samples_drawn"], drawn["val_samples_drawn"]) == (14.95915, 320, 320)
    old = points["gpt2/model_train.md"]  # iterations to 1000, validation at 1000 and 2000, then the end of training
    assert old[1000]["lr"] == 4.608e-05 and old[2000]["val_loss"] == 8.165035 and old[2000]["test_loss"] == 8.428315
    assert math.isnan(points["issues/396"][5426]["grad_norm"])
    assert points["moe_exp/README.md"][20]["param_norm"] == 1104.931  # the MoE run's line, after the dense one


def test_public_torchtitan_step_lines_parse_with_every_value():
    """torchtitan's step lines from published logs and pull requests (tests/assets/logs/SOURCES.md):
    with ANSI colours, torchrun's [rank0]: prefix, grad_norm or not. tps and tflops are per device."""
    sourced = [(source, line) for source, block in blocks("torchtitan-public-lines.txt") for line in block]
    lines = [line for _, line in sourced]
    assert len(lines) == 10 and any("\x1b[" in line for line in lines)
    for source, line in sourced:
        stream = parse_log(line)
        (point,) = stream.points.values()
        fields = {"loss", "memory_gib", "memory_pct", "tokens_per_s_per_device"}
        # nebius/ml-cookbook's run trains FLUX, whose flops torchtitan does not count: it prints
        # "tflops: 0.00  mfu: 0.00%" at 1.5M tokens/s, which is no measurement of either
        if "nebius" not in source:
            fields |= {"tflops_per_device", "mfu_pct"}
        assert stream.skipped == 0 and fields == point.keys() - {"step", "time", "rank", "grad_norm"}, line
        assert ("grad_norm" in point) == ("grad_norm" in line), line
    coloured = parse_log(lines[0]).points[700]
    assert (coloured["loss"], coloured["tokens_per_s_per_device"], coloured["memory_pct"]) == (0.7052, 1541366, 96.97)
    assert "mfu_pct" not in coloured and "tflops_per_device" not in coloured
    assert coloured["time"] == datetime(2025, 6, 10, 21, 58, 27, 8000).timestamp()
    ranked = parse_log(lines[3]).points[200]
    assert (ranked["rank"], ranked["tflops_per_device"], ranked["mfu_pct"]) == (0, 339.16, 34.29)


def test_torchtitan_validation_lines_give_the_steps_validation_loss():
    """torchtitan 0.3.0's validator line, composed from its format string (tests/assets/logs/SOURCES.md):
    its loss is the step's val_loss beside the training line's values, never a training loss."""
    [(source, lines)] = blocks("torchtitan-validation-format.txt")
    assert source.endswith("torchtitan/blob/v0.3.0/torchtitan/components/metrics.py")
    stream = parse_log("\n".join(lines))
    assert stream.skipped == 0
    first, tenth = stream.as_list()
    assert first == {"step": 1, "val_loss": 10.8212}
    assert (tenth["loss"], tenth["val_loss"], tenth["tokens_per_s_per_device"]) == (5.612, 5.7034, 45678)
    assert tenth["time"] == datetime(2026, 1, 5, 10, 0, 9, 500000).timestamp()  # the training line's
    assert metrics_summary(stream.as_list())["final_val_loss"] == 5.7034


def test_published_lightning_bars_give_the_steps_they_report():
    """Published NxDT, NeMo and BioNeMo logs: the last step each reports and how it was found. A
    rounded global_step takes its step from the bar's n where n - 1 prints as it (NeMo's bars: 2e+3
    at 2000/603000 and at 2000/2000, with a validation bar or a NeMo record glued after it), else
    lands on the printed value, flagged (BioNeMo's 3.1e+4 at 34106, n counting validation
    batches); a Slurm log with srun's prefix and carriage returns; NeMo 2.0's printer."""
    last = []
    for source, lines in blocks("lightning-bars-public.txt"):
        stream = parse_log("\n".join(lines))
        point = stream.points[max(stream.points)]
        last.append((point["step"], point["loss"], "global_step_rounded" in point, "step_rounded" in point))
    assert last == [
        (3, 13.4, False, False), (4, 6.79, False, False), (190, 7.56, False, False), (424, 1.27, False, False),
        (4513, 2.45, False, False), (31001, 2.52, True, True), (4945, 2.65, False, False), (2000, 2.6, True, False),
        (40, 10.9, False, False), (3, 1.0, False, False), (2000, 0.139, True, False), (6024, 0.0252, False, False),
        (6, 11.0, False, False), (2, 5.07, False, False), (8, 5.07, False, False), (100, 2.85, False, False),
        (2, 9.761, False, False), (20, 11.03, False, False), (795, 3.09, False, False), (125, 1.375, False, False),
        (4, 8.796, False, False)]
    bionemo = parse_log("\n".join(blocks("lightning-bars-public.txt")[5][1])).points[31001]
    assert (bionemo["consumed_samples"], bionemo["consumed_samples_rounded"], bionemo["val_loss"]) == (2.54e8, 1.0, 2.51)


def _bar_point(block: int, step: int) -> dict:
    return parse_log("\n".join(blocks("lightning-bars-public.txt")[block][1])).points[step]


def test_published_bars_keep_every_value_they_print():
    """Every postfix key (unknown ones as printed, a misspelt one, one with spaces), the epoch,
    percentage, n/total, elapsed, remaining, the rate with its unit, Lightning 1.x's running loss,
    and v_num, empty or not."""
    dpo = _bar_point(1, 4)  # 5/62 [03:50<43:42,  0.02it/s, v_num=8-06, ..., global_step=3.000, ...]
    assert dpo == {"step": 4, "epoch": 0, "progress_pct": 8, "progress_count": 5, "progress_total": 62,
                   "elapsed_s": 230.0, "remaining_s": 43 * 60 + 42, "it_per_s": 0.02, "v_num": "8-06", "loss": 6.79,
                   "chosen_rewards": -0.628, "rejected_rewards": -0.64, "lr": 5.45e-5, "param_norm": 1950.0,
                   "global_step": 3.0, "consumed_samples": 64.0, "throughput_seq_s": 0.181,
                   "throughput_peak_seq_s": 0.146, "grad_norm": 6.59}
    llama = _bar_point(3, 424)  # neuronx-nemo-megatron's "thoughput_peak=11.30"
    assert (llama["throughput_peak_seq_s"], llama["v_num"], llama["s_per_it"], llama["running_loss"]) == (
        11.3, "1778", 5.9, 1.22)
    assert _bar_point(4, 4513)["iteration_time"] == 16.5  # an unknown key, kept as printed
    nemo = _bar_point(7, 2000)  # "Epoch 0: :   0%| | 2000/603000 [1:03:17<317:00:58, v_num=, ..."
    assert nemo == {"step": 2000, "epoch": 0, "progress_pct": 0, "progress_count": 2000, "progress_total": 603000,
                    "elapsed_s": 3797.0, "remaining_s": 317 * 3600 + 58, "v_num": "", "loss": 2.6,
                    "global_step": 2000.0, "consumed_samples": 1.28e6, "step_time_s": 1.9, "val_loss": 2.8,
                    "global_step_rounded": 1.0, "consumed_samples_rounded": 1.0}
    printer = _bar_point(17, 20)  # "(pretraining, pid=4112) Training epoch 1, iteration 0/999 | ..."
    assert printer == {"step": 20, "pid": 4112, "skypilot_name": "pretraining", "epoch": 1, "epoch_step": 0,
                       "max_steps": 999, "lr": 2.999e-6, "global_batch_size": 512, "global_step": 19, "loss": 11.03,
                       "step_time_s": 46.86, "consumed_samples": 10240}


def test_published_loop_bars_callbacks_and_stop_lines_keep_their_values():
    """Lightning's other bars (BioNeMo's sanity check under srun's label, with and without a total;
    its training bars before the first log; its validation bar; NeMo's validation counter drawn
    over the training bar, its head lost), the checkpoint callback's line on the step it names,
    and on the last step: early stopping, NeMo's removal of a checkpoint (its record's time,
    level and source), the limit that stopped the fit loop, each with the srun task of its line."""
    def stream(block: int):
        return parse_log("\n".join(blocks("lightning-bars-public.txt")[block][1]))

    # srun's " 0: " label comes before a carriage return here: like a training bar's, the bars
    # drawn after it carry none (the log is read in pieces that end at carriage returns)
    bars = stream(13).loop_bars
    assert [b["loop"] for b in bars] == ["sanity_check"] * 5 + ["training"] * 4
    sanity, training = bars[:5], bars[5:]
    assert sanity[0] == {"loop": "sanity_check", "after_step": 0, "progress_count": 0, "elapsed_s": 0.0}
    assert sanity[3] == {"loop": "sanity_check", "after_step": 0, "dataloader": 0, "progress_pct": 50,
                         "progress_count": 1, "progress_total": 2, "elapsed_s": 2.0, "remaining_s": 2.0, "s_per_it": 2.66}
    assert [(b["progress_count"], b.get("progress_total"), "dataloader" in b) for b in sanity] == [
        (0, None, False), (0, 2, False), (0, 2, True), (1, 2, True), (2, 2, True)]
    # "Training: 0it [00:00, ?it/s]", "Training:   0%| | 0/200 ...", then "Epoch 0:" before any metrics
    assert training[0] == {"loop": "training", "after_step": 0, "progress_count": 0, "elapsed_s": 0.0}
    assert [(b.get("epoch"), b.get("progress_total")) for b in training] == [(None, None), (None, 200), (0, 200),
                                                                            (0, 200)]
    assert training[3] == {"loop": "training", "after_step": 0, "epoch": 0, "progress_pct": 0, "progress_count": 1,
                           "progress_total": 200, "elapsed_s": 6.0, "remaining_s": 20 * 60 + 39, "s_per_it": 6.23}
    esm = stream(15)
    [validation] = esm.loop_bars
    # the block starts with it: no training step was read before it
    assert validation == {"loop": "validation", "after_step": 0, "dataloader": 0, "progress_pct": 100,
                          "progress_count": 50, "progress_total": 50, "elapsed_s": 39.0, "remaining_s": 0.0,
                          "it_per_s": 1.27}
    saved = esm.points[100]
    checkpoints = "/fsx/esm1nv-train/esm1nv_pretraining/esm1nv_batch256_gradacc1_nodes4-small/results/checkpoints/"
    assert {k: saved[k] for k in saved if k.startswith(("checkpoint_", "fit_", "srun_"))} == {
        "checkpoint_monitor": "val_loss", "checkpoint_score": 2.84952, "checkpoint_best_score": 2.84952,
        "checkpoint_path": checkpoints + "megatron_bert--val_loss=2.85-step=100-consumed_samples=819200.0.ckpt",
        "checkpoint_top_k": 10, "srun_task": 0,  # " 0: Epoch 0, global step 100: ..." and " 0: `Trainer.fit` ..."
        # "[NeMo I 2024-03-01 07:12:24 nlp_overrides:231] Removing checkpoint: ..." after a cursor-up
        "checkpoint_removed_path": checkpoints
        + "megatron_bert--val_loss=3.06-step=50-consumed_samples=409600.0-last.ckpt",
        "checkpoint_removed_time": datetime(2024, 3, 1, 7, 12, 24).timestamp(), "checkpoint_removed_log_level": "I",
        "checkpoint_removed_log_source": "nlp_overrides:231",
        # "`Trainer.fit` stopped: `max_steps=100` reached."
        "fit_stopped_limit": "max_steps", "fit_stopped_limit_value": 100}
    peft = stream(10).points[2000]  # the removal glued after the bar's closing "]"
    assert peft["checkpoint_removed_path"].endswith(
        "/mp_rank_00/megatron_llama_peft_tuning-lora--validation_loss=0.211-step=1800-consumed_samples=230400.0-last.ckpt")
    assert (peft["checkpoint_removed_time"], peft["checkpoint_removed_log_source"]) == (
        datetime(2024, 6, 17, 8, 36, 41).timestamp(), "nlp_overrides:480")
    [glued] = stream(7).loop_bars  # "...val_loss=2.800]dation DataLoader 0: : 51it [00:20,  2.53it/s]"
    assert glued == {"loop": "validation", "after_step": 2000, "dataloader": 0, "progress_count": 51,
                     "elapsed_s": 20.0, "it_per_s": 2.53}
    stopped = stream(11).points[6024]
    assert {k: stopped[k] for k in stopped if k.startswith("early_stop_")} == {
        "early_stop_monitor": "val_loss", "early_stop_records_without_improvement": 5, "early_stop_best_score": 0.074,
        "early_stop_rank": 1}
    # over every block: each such line printed is kept, and each loop's bar
    events = {"Removing checkpoint: ": "checkpoint_removed_path", "`Trainer.fit` stopped: ": "fit_stopped_limit",
              "Monitored metric ": "early_stop_monitor", "saving model to ": "checkpoint_path"}
    loops = ("Training: ", "Sanity Checking", "dation DataLoader")
    for source, lines in blocks("lightning-bars-public.txt"):
        text = "\n".join(lines)
        read = parse_log(text)
        assert {key: sum(key in p for p in read.points.values()) for key in events.values()} == {
            key: text.count(printed) for printed, key in events.items()}, source
        assert sum("epoch" not in b for b in read.loop_bars) == sum(map(text.count, loops)), source


def test_a_rounded_global_step_takes_its_step_from_the_bars_counter():
    """NeMo's bar counts optimizer steps: at n = 1001 the postfix's 1e+3 is global_step 1000, step
    1001 exactly; an exact update for that step later replaces the approximate one, flags and all."""
    bar = ("Epoch 0: :  10%|█         | {n}/10000 [1:00:00<9:00:00, v_num=, reduced_train_loss={loss}, "
           "global_step={g}, consumed_samples={c}]")
    stream = parse_log(bar.format(n=1001, loss="2.500", g=_bar_number(1000.0), c=_bar_number(1001.0 * 512)))
    assert stream.points[1001]["global_step"] == 1000.0 and stream.points[1001]["global_step_rounded"] == 1.0
    assert "step_rounded" not in stream.points[1001]
    parse_log(bar.format(n=1001, loss="2.400", g="1000.0", c="512512.0"), stream)
    assert stream.points[1001]["loss"] == 2.4 and "global_step_rounded" not in stream.points[1001]
    assert "consumed_samples_rounded" not in stream.points[1001] and stream.skipped == 0


def test_bar_updates_glued_to_each_other_or_to_other_output_each_parse():
    update = ("Epoch 0:   0%|          | {n}/1100000 [56:22<190:36:32,  1.60it/s, loss=2.64, v_num=, "
              "reduced_train_loss={loss}, global_step={g}.0, consumed_samples=4.")
    torn_then_whole = update.format(n=5395, loss="2.640", g=4943) + update.format(n=5395, loss="2.650", g=4944) + "1e+6]"
    stream = parse_log(torn_then_whole + "[NeMo I 2024-03-01 07:12:24 nlp_overrides:231] Removing checkpoint")
    # the torn update has no consumed_samples; the whole one has, rounded
    assert stream.points[4944]["loss"] == 2.64 and "consumed_samples" not in stream.points[4944]
    assert stream.points[4945]["consumed_samples"] == 4.1e6 and stream.points[4945]["consumed_samples_rounded"] == 1.0
    assert stream.skipped == 0


def test_published_preprocess_data_progress_lines_keep_every_value():
    """preprocess_data.py's progress line from Megatron-DeepSpeed, gpt-neox (its tqdm counter glued
    after the final ".") and PICL's fork (the counter first, instances counted)."""
    lines = [line for _, block in blocks("preprocess-data-public.txt") for line in block]
    assert len(lines) == 8
    read = [preprocess_progress(line) for line in lines]
    assert read[0] == {"documents": 987700, "docs_per_s": 21903.35820268358, "mib_per_s": 50.4128344196837}
    assert read[2] == {"documents": 521000, "docs_per_s": 24077.21, "mib_per_s": 5.05, "counter": 520000,
                       "counter_elapsed_s": 21.0, "counter_it_per_s": 24642.85}
    assert read[3] == {"documents": 19710000, "instances": 9454301, "docs_per_s": 16597.94547639502,
                       "mib_per_s": 34.033233214932274, "counter": 19709610, "counter_elapsed_s": 19 * 60 + 42,
                       "counter_it_per_s": 18230.21}
    assert [r["documents"] for r in read[3:]] == [19710000, 19720000, 19730000, 19740000, 19750000]
    # the stream of training metrics takes none of it
    assert not parse_log("\n".join(lines)).points and parse_log("\n".join(lines)).skipped == 0


@pytest.mark.parametrize("prefix, labels", [("0: ", {"srun_task": 0}), ("12:  ", {"srun_task": 12}), ("", {})])
def test_preprocess_progress_keeps_the_srun_task_that_printed_it(prefix, labels):
    line = prefix + "Processed 1000 documents (1234.5 docs/s, 2.10 MB/s)."
    assert preprocess_progress(line) == {"documents": 1000, "docs_per_s": 1234.5, "mib_per_s": 2.1, **labels}
    assert preprocess_progress(line[:-1]) is None  # torn before its final "."
    assert preprocess_progress("Processed 1000 samples") is None


def test_an_appended_node_log_names_each_failed_attempts_own_error(tmp_path):
    """Megatron-LM's node log, appended to by every attempt (``tee -a``): an attempt that died of
    the NCCL watchdog (NVIDIA/Megatron-LM#935) is named by the rank's what(); a whole real run's
    log (this project's H100 run: warnings, arguments, 60 iterations) holds no error; a later
    attempt that failed without printing one is not named by the earlier attempt's."""
    from jobs.contract import JobRequest
    from jobs.node import Command
    from tasks.attempts import COMPLETED, AppendedLog

    real_run = (Path(__file__).parent / "assets/logs/megatron-lm-0.16.1-h100.log").read_text()
    (_, died), = blocks("megatron-lm-failure-public.txt")
    log = tmp_path / "node-1.log"
    appended = AppendedLog(log)
    request = JobRequest("gpt-train", Command(["torchrun"]), 60)
    prepare = appended.submitting(lambda launch: request)
    attempts = [real_run[:len(real_run) // 2] + "\n".join(died) + "\n", real_run, "srun: error: node2: task 1: Killed\n"]
    outcomes = ["FAILED: job 7 ended FAILED with exit code 1:0", COMPLETED, "FAILED: job 9 ended FAILED with exit code 1:0"]
    explained = []
    for attempt, (text, outcome) in enumerate(zip(attempts, outcomes)):
        assert prepare(attempt, None) is request
        with open(log, "a") as f:
            f.write(text)
        explained.append(appended.explain(outcome))
    watchdog = died[1].split("what():", 1)[1].strip()
    assert explained[0] == f"{outcomes[0]} -- {watchdog}"
    assert explained[1:] == outcomes[1:]
    assert rank_error(real_run) is None  # no warning or argument line of a real run reads as an error


def test_a_resubmitted_attempts_report_of_a_step_replaces_the_earlier_attempts():
    """Within an attempt a later report of a step adds to the earlier one (progress bars print a
    step's fields over several updates); once the run is resubmitted, its first report of a step
    it had reached before replaces that step's values whole: an MFU the new line leaves out
    (torchtitan's uncounted "mfu: 0.00%") must not survive from the attempt that died."""
    from pretrain.log_parsers import MetricsStream

    stream = MetricsStream()
    stream.new_attempt()
    stream.add(22, {"loss": 2.91, "mfu_pct": 1.86})
    stream.add(22, {"tokens_per_s_per_device": 193831.0})  # the same attempt: merged
    assert stream.points[22] == {"step": 22, "loss": 2.91, "mfu_pct": 1.86, "tokens_per_s_per_device": 193831.0}
    stream.new_attempt()
    stream.add(22, {"loss": 2.92})
    stream.add(22, {"grad_norm": 0.83})  # the new attempt's second update of the step merges again
    stream.add(23, {"loss": 2.90})
    assert stream.as_list() == [{"step": 22, "loss": 2.92, "grad_norm": 0.83}, {"step": 23, "loss": 2.90}]
