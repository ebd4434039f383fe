"""The trainer's metrics: JSON lines tailed while open, rank 0 only, a resume that keeps each step
once (also when killed mid-rewrite), TensorBoard scalars, a console line that the control plane's
Megatron-LM parser reads back, and FLOPs per token checked against real models."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.pytorch_utils import Conv1D

from pretrain.log_parsers import parse_log
from pretrain.metrics_records import metrics_records
from tests.public_logs import blocks
from trainer.train.config import ModelConfig
from trainer.train.metrics import MetricsConfig, MetricsWriter, flops_per_token, mfu, model_flops_per_token

pytestmark = pytest.mark.pure  # no stack, no Prefect API: `make check` runs it

REPO = Path(__file__).resolve().parents[1]


def step_metrics(step: int, loss: float | None = None) -> dict[str, float]:
    return {"loss": 10.0 / step if loss is None else loss, "lr": 3e-4, "grad_norm": 1.25, "tokens_per_s": 2048.0,
            "step_time_ms": 500.0, "mfu_pct": 41.5, "memory_gib": 12.5, "consumed_samples": 16 * step,
            "nan_iterations": 0}


def test_jsonl_has_every_step_eval_and_event_flushed_while_open(tmp_path, capsys):
    path = tmp_path / "run" / "metrics.jsonl"
    writer = MetricsWriter(MetricsConfig(jsonl_path=str(path)), rank=0, train_steps=10)
    before = time.time()
    writer.log_step(1, step_metrics(1))
    writer.log_step(2, {**step_metrics(2), "loss": float("nan"), "nan_iterations": 1, "mfu_pct": None})
    writer.log_eval(2, {"val_loss": 4.5, "val_ppl": math.exp(4.5)})
    writer.log_event(2, "checkpoint_saved", path=tmp_path / "step-2", bytes=4096)

    records = metrics_records(path)  # the writer is still open: every line must already be on disk
    assert [r["step"] for r in records] == [1, 2, 2, 2]
    first, nan_step, evaluation, event = records
    assert first == {"step": 1, **step_metrics(1), "time": first["time"]} and before <= first["time"] <= time.time()
    assert first["consumed_samples"] == 16 and isinstance(first["consumed_samples"], int)
    assert nan_step["loss"] is None and nan_step["nan_iterations"] == 1 and "mfu_pct" not in nan_step
    assert evaluation == {"step": 2, "val_loss": 4.5, "val_ppl": math.exp(4.5)}
    assert event == {"step": 2, "event": "checkpoint_saved", "path": str(tmp_path / "step-2"), "bytes": 4096,
                     "time": event["time"]}
    writer.close()

    # The control plane's parser: metrics and evaluation merge per step; the event is no metric.
    stream = parse_log(path.read_text())
    assert stream.skipped == 0
    points = stream.as_list()
    assert [p["step"] for p in points] == [1, 2]
    assert points[1]["val_loss"] == 4.5 and "loss" not in points[1] and "bytes" not in points[1]


def test_only_rank_zero_writes(tmp_path, capsys):
    cfg = MetricsConfig(jsonl_path=str(tmp_path / "metrics.jsonl"), tensorboard_dir=str(tmp_path / "tb"))
    writer = MetricsWriter(cfg, rank=1, train_steps=10)
    writer.log_step(1, step_metrics(1))
    writer.log_eval(1, {"val_loss": 4.5})
    writer.log_event(1, "checkpoint_saved")
    writer.close()
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out == ""


def test_resume_drops_the_dead_attempts_steps_after_its_checkpoint(tmp_path, capsys):
    cfg = MetricsConfig(jsonl_path=str(tmp_path / "metrics.jsonl"))
    dead = MetricsWriter(cfg, rank=0, train_steps=8)
    for step in range(1, 7):
        dead.log_step(step, step_metrics(step))
        if step == 4:
            dead.log_event(step, "checkpoint_saved")
    dead.close()
    with open(cfg.jsonl_path, "a") as torn:  # killed in the middle of writing step 7
        torn.write('{"step": 7, "loss": 1.4')

    resumed = MetricsWriter(cfg, rank=0, train_steps=8, resume_step=4)
    resumed.log_event(4, "resumed")
    for step in range(5, 9):
        resumed.log_step(step, step_metrics(step, loss=100.0 + step))
    resumed.close()

    records = metrics_records(Path(cfg.jsonl_path))
    assert [(r["step"], r.get("event")) for r in records] == [
        (1, None), (2, None), (3, None), (4, None), (4, "checkpoint_saved"), (4, "resumed"),
        (5, None), (6, None), (7, None), (8, None)]
    assert [p["loss"] for p in parse_log(Path(cfg.jsonl_path).read_text()).as_list()] == [
        10.0, 5.0, 10.0 / 3, 2.5, 105.0, 106.0, 107.0, 108.0]
    assert not Path(cfg.jsonl_path + ".tmp").exists()


def test_fresh_start_drops_an_attempt_that_died_before_its_first_checkpoint(tmp_path, capsys):
    cfg = MetricsConfig(jsonl_path=str(tmp_path / "metrics.jsonl"))
    dead = MetricsWriter(cfg, rank=0, train_steps=8)
    for step in (1, 2):
        dead.log_step(step, step_metrics(step))
    dead.close()
    retry = MetricsWriter(cfg, rank=0, train_steps=8)
    retry.log_step(1, step_metrics(1, loss=7.0))
    retry.close()
    assert [(r["step"], r["loss"]) for r in metrics_records(Path(cfg.jsonl_path))] == [(1, 7.0)]


def test_a_reader_waits_for_the_line_being_written_and_names_a_damaged_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(MetricsConfig(jsonl_path=str(path)), rank=0, train_steps=8)
    for step in (1, 2):
        writer.log_step(step, step_metrics(step))
    writer.close()
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')  # being written now
    assert [r["step"] for r in metrics_records(path)] == [1, 2]
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:20], lines[2]]))  # damaged on disk, not being written
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON record"):
        metrics_records(path)


def test_resume_killed_mid_rewrite_leaves_the_file_whole(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s, "time": 1.7e9 + s}) + "\n" for s in range(1, 300_001)]
    original, purged = "".join(lines), "".join(lines[:1000])
    path.write_text(original)
    tmp = Path(f"{path}.tmp")
    resume = ("from trainer.train.metrics import MetricsConfig, MetricsWriter\n"
              f"MetricsWriter(MetricsConfig(jsonl_path={str(path)!r}), rank=0, train_steps=300000, resume_step=1000)")
    proc = subprocess.Popen([sys.executable, "-c", resume], cwd=REPO)
    while not tmp.exists() and proc.poll() is None:
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the rewrite finished before it could be interrupted"
    assert tmp.exists() and path.read_text() == original

    # The retry overwrites the half-written temporary file and completes the purge.
    MetricsWriter(MetricsConfig(jsonl_path=str(path)), rank=0, train_steps=300000, resume_step=1000).close()
    assert path.read_text() == purged and not tmp.exists()


def test_tensorboard_scalars_with_unit_tags_purged_on_resume(tmp_path, capsys):
    cfg = MetricsConfig(jsonl_path=str(tmp_path / "metrics.jsonl"), tensorboard_dir=str(tmp_path / "tb"))
    dead = MetricsWriter(cfg, rank=0, train_steps=8)
    for step in range(1, 7):
        dead.log_step(step, step_metrics(step))
    dead.log_eval(4, {"val_loss": 4.5, "val_ppl": math.exp(4.5)})
    dead.close()
    # TensorBoard orders event files by name, which starts with whole seconds: a second attempt
    # within the same second could sort before the first (real restarts take far longer).
    time.sleep(1.05 - time.time() % 1)
    resumed = MetricsWriter(cfg, rank=0, train_steps=8, resume_step=4)
    for step in range(5, 9):
        resumed.log_step(step, step_metrics(step, loss=100.0 + step))
    resumed.close()

    events = EventAccumulator(cfg.tensorboard_dir)
    events.Reload()
    assert {"loss_metrics/loss", "lr", "grad_norm", "throughput/tokens_per_s", "time_metrics/step_time(ms)",
            "mfu(%)", "memory/max_allocated(GiB)", "progress/consumed_samples", "loss_metrics/nan_iterations",
            "validation_metrics/loss", "validation_metrics/perplexity"} == set(events.Tags()["scalars"])
    losses = [(e.step, e.value) for e in events.Scalars("loss_metrics/loss")]
    assert losses == [(1, 10.0), (2, 5.0), (3, pytest.approx(10.0 / 3)), (4, 2.5),
                      (5, 105.0), (6, 106.0), (7, 107.0), (8, 108.0)]
    assert [(e.step, e.value) for e in events.Scalars("validation_metrics/loss")] == [(4, 4.5)]


def test_console_line_round_trips_through_the_megatron_parser(tmp_path, capsys):
    cfg = MetricsConfig(jsonl_path=str(tmp_path / "metrics.jsonl"), log_interval=5)
    values = {"loss": 4.123456, "lr": 3e-4, "grad_norm": 1.234, "step_time_ms": 512.3, "tokens_per_s": 31961.5,
              "mfu_pct": 38.25, "memory_gib": 61.5, "global_batch_size": 16, "nan_iterations": 0}
    writer = MetricsWriter(cfg, rank=0, train_steps=200)
    for step in range(1, 13):
        writer.log_step(step, {**values, "consumed_samples": 16 * step})
    writer.log_eval(10, {"val_loss": 4.0, "val_ppl": math.exp(4.0)})
    writer.log_event(10, "checkpoint_saved", path="/ckpt/step-10")
    writer.close()
    resumed = MetricsWriter(cfg, rank=0, train_steps=200, resume_step=10)
    for step in (11, 12):
        resumed.log_step(step, {**values, "consumed_samples": 16 * step})
    resumed.close()

    console = capsys.readouterr().out
    line = console.splitlines()[0]
    assert line.startswith(" [") and line.endswith(
        "] iteration        1/     200 | consumed samples:           16 | elapsed time per iteration (ms): 512.3 |"
        " tokens per second: 31961.5 | MFU (%): 38.25 | max memory allocated (GiB): 61.50 |"
        " learning rate: 3.000000E-04 | global batch size:    16 | lm loss: 4.123456E+00 | grad norm: 1.234 |"
        " number of nan iterations:   0 |")
    assert "validation loss at iteration 10 | lm loss value: 4.000000E+00 | lm loss PPL: 5.459815E+01 |" in console
    assert "checkpoint_saved at iteration 10 | path: /ckpt/step-10 |" in console

    stream = parse_log(console)
    assert stream.skipped == 0
    # Step 1, every 5th step, and the first step after the resume.
    assert [p["step"] for p in stream.as_list()] == [1, 5, 10, 11]
    for point in stream.as_list():
        # the validation line, in Megatron-LM's format, joins its iteration's point
        validation = {"val_loss": 4.0, "val_ppl": float(f"{math.exp(4.0):.6E}")} if point["step"] == 10 else {}
        assert point == {"step": point["step"], "train_iters": 200, "consumed_samples": 16 * point["step"],
                         "step_time_ms": 512.3, "lr": 3e-4, "global_batch_size": 16, "loss": 4.123456,
                         "grad_norm": 1.234, "nan_iterations": 0, "time": point["time"], "tokens_per_s": 31961.5,
                         "mfu_pct": 38.25, "memory_gib": 61.5, **validation}
        assert abs(point["time"] - time.time()) < 3600  # the line's timestamp, in epoch seconds


def test_log_interval_must_be_positive():
    with pytest.raises(ValueError, match="metrics.log_interval=0"):
        MetricsConfig(jsonl_path="m.jsonl", log_interval=0)


# Eager attention: scores and values as plain matmuls over the full causal square, which is what
# flops_per_token counts and what FlopCounterMode sees.
def llama():
    config = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=320, max_position_embeddings=32,
                         tie_word_embeddings=False, attn_implementation="eager")
    shape = dict(num_layers=3, hidden_size=64, ffn_hidden_size=176, num_attention_heads=8, num_kv_heads=2,
                 vocab_size=320, gated_mlp=True)
    return LlamaForCausalLM(config), shape


def gpt2():
    config = GPT2Config(n_embd=64, n_inner=256, n_layer=2, n_head=4, vocab_size=320, n_positions=32,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    shape = dict(num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, num_kv_heads=4,
                 vocab_size=320, gated_mlp=False)
    return GPT2LMHeadModel(config), shape


@pytest.mark.parametrize("build", [llama, gpt2])
def test_flops_per_token_counts_every_weight_matmul_and_attention(build):
    model, shape = build()
    # GPT-2's projections are Conv1D (a transposed Linear); its lm_head shares the embedding's weight
    # but is a matmul of its own.
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, (nn.Linear, Conv1D)))
    for seq_length in (16, 32):
        # Scores and values: 2 matmuls of seq_length x hidden per token and layer, 2 FLOPs per
        # multiply-add, forward and backward 3x.
        attention = 3 * 2 * 2 * shape["num_layers"] * seq_length * shape["hidden_size"]
        assert flops_per_token(seq_length=seq_length, **shape) == 6 * matmul_weights + attention


@pytest.mark.parametrize("build", [llama, gpt2])
def test_flops_per_token_equals_torch_flop_counter_on_a_training_step(build):
    torch.manual_seed(0)
    model, shape = build()
    batch, seq_length = 2, 32
    ids = torch.randint(0, shape["vocab_size"], (batch, seq_length))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    assert counter.get_total_flops() == flops_per_token(seq_length=seq_length, **shape) * batch * seq_length
    # the count the trainer reports its MFU with, from its own model config
    fields = {key: value for key, value in shape.items() if key != "gated_mlp"}
    config = ModelConfig(family="llama" if shape["gated_mlp"] else "gpt", max_position_embeddings=seq_length, **fields)
    assert counter.get_total_flops() == model_flops_per_token(config, seq_length) * batch * seq_length


def test_flops_per_token_is_torchtitans_count_on_its_own_published_lines():
    """One FLOP count serves every backend (benchmarks/side_by_side_gpu.py): on torchtitan's own
    step lines for Llama 3 8B at sequence 8192 (pytorch/torchtitan pull 1287 and its graph_trainer
    notes), the TFLOP/s it printed over the tokens/s it printed is this count for that shape, to
    the lines' rounding."""
    points = [p for source, lines in blocks("torchtitan-public-lines.txt") if source.endswith(("/pull/1287", "CLAUDE.md#L252"))
              for p in parse_log("\n".join(lines)).points.values() if p.get("tflops_per_device")]
    assert len(points) >= 3
    llama3_8b = flops_per_token(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                                num_kv_heads=8, vocab_size=128256, seq_length=8192, gated_mlp=True)
    for point in points:
        assert point["tflops_per_device"] * 1e12 / point["tokens_per_s_per_device"] == pytest.approx(llama3_8b, rel=2e-3)


def test_mfu_in_percent_and_unknown_without_a_peak():
    assert mfu(2000.0, 6e9, 1e14) == pytest.approx(12.0)
    assert mfu(2000.0, 6e9, None) is None
