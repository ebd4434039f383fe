"""One metrics stream from NxDT, NxD, Megatron-LM and native logs, on the runbooks' sample lines;
malformed lines are skipped and counted."""

from __future__ import annotations

from pretrain.log_parsers import parse_log

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
        MEGATRON,
    ])
    stream = parse_log(text)
    assert [p["step"] for p in stream.as_list()] == [10]
    assert stream.skipped == 4
