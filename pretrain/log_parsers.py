"""Training logs of every backend as one metrics stream: ``{"step", "loss", "lr", ...}`` dicts.

- NxDT: Lightning's TQDM progress bar, whose updates are separated by carriage returns
  (``reduced_train_loss=13.40, lr=7.5e-9, global_step=1.000, ...``), global_step counting from 0;
  counts tqdm rounded (``global_step=3.1e+4``) kept as printed and flagged (``step_rounded``,
  ``consumed_samples_rounded``). NeMo 2.0's printer (``iteration 0/999 | global_step: 19 | ...``).
  Lightning's sanity-check and validation bars and its training bars before the first log
  (``MetricsStream.loop_bars``); its checkpoint and early-stopping callbacks' lines, the limit that
  stopped its fit loop and NeMo's removal of a checkpoint, on their steps.
- torchtitan: its step line (``[titan] <time> - root - INFO - step: 200  loss: 6.1384 ...``) and its
  validator's (``validate step: 10  loss:  5.1234 ...``, as ``val_loss``),
  with or without ANSI colours and torchrun's ``[rank0]:`` prefix.
- NxD Llama examples: ``step 1 step_time 244.76s throughput 3.93 seq/s loss 13.41 grad norm 1.97``.
- Megatron-LM: ``training_log``'s iteration line, with or without its timestamp prefix (kept as
  ``time``, epoch seconds, the native stream's name for it), and ``evaluate_and_print_results``'s
  validation lines (``val_loss``, ``val_ppl``; ``test_...`` on the test set).
- The native trainer: JSON lines with a ``step``; those with an ``event`` (checkpoint saved, step
  skipped) record occurrences, not metrics; those with a ``kind`` (``device``: the device
  sampler's, ``pretrain/device_samples.py`` reads them) belong to other readers and are passed over.

Beside the stream, ``preprocess_progress`` reads the tokenize stage's progress line, which
Megatron-LM's ``tools/preprocess_data.py`` and ``trainer tokenize`` print alike.

Lines that look like metrics but do not parse are skipped and counted, never raised: a log is
evidence, and one garbled line must not hide the rest of a loss curve. The producers:
aws-neuron/neuronx-distributed-training ``src/neuronx_distributed_training/lightning_modules/model/base.py``
(``log_metrics``) drawn by Lightning-AI/pytorch-lightning
``src/lightning/pytorch/callbacks/progress/tqdm_progress.py``; NVIDIA/Megatron-LM
``megatron/training/training.py`` (``training_log``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime

# One name per quantity across backends: the Lightning postfix keys NxDT, NeMo and BioNeMo print
# (``thoughput_peak`` is how neuronx-nemo-megatron spells it; ``train_step_timing in s`` is NeMo's
# step time). Any other postfix key is kept as printed.
LIGHTNING_KEYS = {"reduced_train_loss": "loss", "lr": "lr", "gradient_norm": "grad_norm",
                  "parameter_norm": "param_norm", "consumed_samples": "consumed_samples",
                  "throughput": "throughput_seq_s", "throughput_peak": "throughput_peak_seq_s",
                  "thoughput_peak": "throughput_peak_seq_s", "val_loss": "val_loss",
                  "train_step_timing in s": "step_time_s", "loss": "running_loss"}
# Megatron-LM's labels (``training_log`` in NVIDIA/Megatron-LM megatron/training/training.py;
# energy and power with --log-energy, the decoupled lr in megatron-core 0.6-0.14), then the native trainer's additions under its JSON names, so its
# console parses to what its metrics file holds. Any other ``label: number`` field (MoE and MTP
# losses such as ``load_balancing_loss`` or ``mtp_1 loss``, fields of later versions) is kept
# under its snake_case label (``_snake``): a new Megatron-LM loses nothing.
MEGATRON_KEYS = {"lm loss": "loss", "learning rate": "lr", "decoupled learning rate": "decoupled_lr",
                 "grad norm": "grad_norm", "params norm": "param_norm", "num zeros": "num_zeros",
                 "consumed samples": "consumed_samples", "skipped samples": "skipped_samples",
                 "elapsed time per iteration (ms)": "step_time_ms",
                 "throughput per GPU (TFLOP/s/GPU)": "tflops_per_device",
                 "energy per GPU (J/iter/GPU)": "energy_per_device_j", "power per GPU (W/GPU)": "power_per_device_w",
                 "global batch size": "global_batch_size", "loss scale": "loss_scale",
                 "number of skipped iterations": "skipped_iterations", "number of nan iterations": "nan_iterations",
                 "tokens per second": "tokens_per_s", "MFU (%)": "mfu_pct", "max memory allocated (GiB)": "memory_gib",
                 # Megatron-DeepSpeed's model TFLOPs, divided by the world size (``throughput_calculator``
                 # in microsoft/Megatron-DeepSpeed megatron/utils.py): per GPU, as Megatron-LM's own.
                 "TFLOPs": "tflops_per_device",
                 # The Neuron reference fork's moving average of sequences per second over all ranks
                 # (``Throughput.get_throughput`` in aws-neuron/aws-neuron-reference-for-megatron-lm
                 # megatron/training.py: micro batch x data parallel x accumulation per iteration).
                 "throughput": "throughput_seq_s"}

# Lightning's TQDM bar: "Epoch 0:   3%|▎    | 3/91 [16:05<7:52:06, 321.89s/it, <postfix>]", the
# rate "321.89s/it" or "0.02it/s" ("?it/s" before the first update); NeMo 1.x's MegatronProgressBar
# prints "Epoch 0: :" and no rate (its bar_format "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}
# [{elapsed}<{remaining}{postfix}]"). Its head counts only whole, up to the "," or "]" after it: a
# clock cut mid-number ("[16:05<7:") is no time.
_BAR = re.compile(r"Epoch (\d+):(?: :)?\s+(\d+)%\|[^|]*\| (\d+)/(\d+) \[([\d:]+)<([\d:]+|\?)"
                  r"(?:, +(?:([\d.]+)(s/it|it/s)|\?it/s))?(?=[,\]])")
# A postfix pair counts only when "," or "]" ends it: a bar torn mid-value (the process died) must
# not report "consumed_samples=20" for 2048.0. Keys may hold spaces ("train_step_timing in s").
_BAR_PAIR = re.compile(r", ([^=,\]]+)=([^,\]]*)(?=[,\]])")
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+):?\s*\|")
# NeMo 2.0's printer: "Training epoch 1, iteration 0/999 | ..." (a 2024 draft: "Epoch 0, iteration 1/100: | ...").
_NEMO_EPOCH = re.compile(r"[Ee]poch (\d+), $")
# " [2024-05-04 12:00:01]" (core_v0.6 on) or with microseconds (2026 on), right before "iteration".
_MEGATRON_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]\s*$")
# ``evaluate_and_print_results``: "validation loss at iteration 20 | lm loss value: 6.75E+00 |
# lm loss PPL: 8.57E+02 |" during training; at its end the same with " on validation set" or
# " on test set" after the iteration (Megatron-DeepSpeed: " on 320-sample draw from test set";
# Megatron-LM before 2023: "at the end of training for val data", with no iteration). With
# --multiple-validation-sets each set's line says "validation-<index> loss at".
_MEGATRON_EVAL = re.compile(r"validation(?:-(\d+))? loss at (?:iteration\s+(\d+)(?: on (?:(\d+)-sample draw from )?"
                            r"(validation|test) set)?|the end of training for (val|test) data)\s*\|")
# What launchers put before a rank's line: srun --label's task id ("1: ", right-aligned, so
# " 1: " among ten or more tasks) and torchrun --tee's "[default7]:" (role and local rank).
_SRUN_LABEL = re.compile(r"^\s*(\d+):\s")
_TORCHRUN_TEE = re.compile(r"\[[A-Za-z_]\w*?(\d+)\]:")
# SkyPilot's prefix on a job's output (NeMo-Run's SkypilotExecutor runs through it; its forms as
# skypilot-org/skypilot sky/skylet/executor/slurm.py builds its coloured ``prefix``): the task's
# name on one node ("(pretraining, pid=4112) "), the node's name, rank and address on several
# ("(worker1, rank=1, pid=15406, ip=10.164.0.57) "), "(setup pid=8665) " for the setup script.
_SKY_PREFIX = re.compile(r"\((?:([^(),=\s]+),? )?(?:rank=(\d+), )?pid=(\d+)(?:, ip=([\d.]+))?\)(?:\x1b\[[0-9;]*m)? ")
# torchtitan's step line (``log`` in pytorch/torchtitan torchtitan/components/metrics.py), coloured
# with ANSI codes: "[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384
# grad_norm: 0.83  memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%"; grad_norm
# since 2025. tps and tflops are per device.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TITAN_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:")
# its validator's line (``log_validation`` in torchtitan 0.3.0's torchtitan/components/metrics.py):
# "validate step: 10  loss:  5.1234  memory: 12.34GiB(15.62%)  tps: 45,678", coloured the same way
_TITAN_VALIDATE = re.compile(r"\bvalidate step:\s*(\d+)\s+loss:\s*([-\d.]+|nan|inf)(?=\s|$)")
_TITAN_TIME = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_TITAN_RANK = re.compile(r"^\[rank(\d+)\]:")
_TITAN_FIELD = re.compile(r"(\w+):\s*([-\d,.]+|nan|inf)(?:GiB\(([\d.]+)%\)|%)?(?=\s|$)")
TITAN_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "memory": "memory_gib", "tps": "tokens_per_s_per_device",
              "tflops": "tflops_per_device", "mfu": "mfu_pct"}
# Lightning's other loops' bars, drawn between training updates: the sanity check before
# training, validation, and the training bar before its first epoch ("Training: 0it"), with a
# total ("Validation DataLoader 0: 100%|...| 50/50 [00:39<00:00, 1.27it/s]") or as a counter
# ("Sanity Checking: 0it [00:00, ?it/s]"). A bar drawn over another
# loses the head of its description ("dation DataLoader 0: : 51it [00:20,  2.53it/s]").
_LOOP_BAR = re.compile(r"(Sanity Checking|(?:Vali)?dation|Training)(?: DataLoader (\d+))?:(?: :)?\s+"
                       r"(?:(\d+)%\|[^|]*\| (\d+)/(\d+) \[([\d:]+)<([\d:]+|\?)|(\d+)it \[([\d:]+)),"
                       r" +(?:([\d.]+)(s/it|it/s)|\?it/s)\]")
# Lightning's callbacks (``ModelCheckpoint._update_best_and_save`` and ``EarlyStopping``'s
# stopping message in Lightning-AI/pytorch-lightning src/lightning/pytorch/callbacks/); the
# "[rank: N] " is Lightning's prefix when more than one process runs.
_CHECKPOINT = re.compile(r"Epoch (\d+), global step (\d+): '([^']+)' reached ([-+\w.]+) \(best ([-+\w.]+)\), "
                         r"saving model to '([^']+)' as top (\d+)")
_EARLY_STOP = re.compile(r"(?:\[rank: (\d+)\] )?Monitored metric (\S+) did not improve in the last (\d+) records\. "
                         r"Best score: ([-+\w.]+)\. Signaling Trainer to stop\.")
# NeMo's log record head ("[NeMo I 2024-06-17 08:36:41 nlp_overrides:480] ": level initial, the
# node's local time, module and line) before ``NLPDDPStrategy.remove_checkpoint``'s line in
# NVIDIA/NeMo nemo/collections/nlp/parts/nlp_overrides.py: a checkpoint that fell out of the top k,
# or the previous "-last" one, deleted once a new one is saved.
_REMOVED = re.compile(r"\[NeMo (\w) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (\w+):(\d+)\] Removing checkpoint: (\S+)")
# Lightning's fit loop ending on a limit ("`Trainer.fit` stopped: `max_steps=100` reached.", also
# max_epochs; ``_FitLoop.done`` in src/lightning/pytorch/loops/fit_loop.py).
_FIT_STOPPED = re.compile(r"`Trainer\.fit` stopped: `(\w+)=([^`]+)` reached\.")
_NXD_LINE = re.compile(r"\bstep (\d+) step_time ([\d.]+)s throughput ([\d.]+) seq/s loss ([\d.eE+-]+)"
                       r"(?: grad norm ([\d.eE+-]+))?")


@dataclass
class MetricsStream:
    # Values are numbers, but for a Lightning postfix value that is not one, kept as printed (v_num).
    points: dict[int, dict[str, float | str]] = field(default_factory=dict)
    skipped: int = 0
    events: int = 0  # the native trainer's event lines (checkpoint saved, export, ...): signs of life
    # Lightning's sanity-check and validation bars, and its training bars that carry no metrics yet,
    # in the order drawn, each with the step it ran at.
    loop_bars: list[dict[str, float | str]] = field(default_factory=list)

    # Steps an earlier attempt reported, which the attempt now running has not reported yet.
    earlier: set[int] = field(default_factory=set)

    def new_attempt(self) -> None:
        """A resubmitted run reports its steps after the checkpoint again: its first report of
        each replaces the earlier attempt's, whose values (an MFU the new line leaves out, say)
        no longer describe the run."""
        self.earlier = set(self.points)

    def add(self, step: int, metrics: dict[str, float | str]) -> None:
        # Progress bars repeat the same step between log intervals: the last report wins, and a
        # report without some field keeps that field's earlier value from the same attempt.
        kept = {} if step in self.earlier else self.points.get(step, {})
        self.earlier.discard(step)
        self.points[step] = {"step": step, **kept, **metrics}

    def as_list(self) -> list[dict[str, float | str]]:
        return [self.points[s] for s in sorted(self.points)]


def _number(text: str) -> float:
    return float(text.rstrip("|").strip())


def _snake(label: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")


def _rounded(text: str) -> bool:
    """Whether tqdm printed a count rounded: its ``format_num`` switches to ``'{:.3g}'`` (3
    significant digits, exponent form) when that is shorter than ``str(n)``, so consumed_samples
    100352 prints as ``1e+5`` and 102400.0 as ``1.02e+5`` (``Tqdm.format_num`` in
    Lightning-AI/pytorch-lightning src/lightning/pytorch/callbacks/progress/tqdm_progress.py).
    Counts print without an exponent only when exact; a float global_step is rounded already at 1000-1005
    (``1e+3``), in bands around later thousands, and from 99950 on always."""
    return "e" in text.lower()


def _within_rounding(count: int, printed: str) -> bool:
    """Whether ``count`` prints as ``printed`` at tqdm's 3 significant digits ("3.1e+4" is
    30950-31050)."""
    value = float(printed)
    return value > 0 and abs(count - value) <= 0.5 * 10 ** (math.floor(math.log10(value)) - 2)


def _seconds(clock: str) -> float:
    """tqdm's "[h:]mm:ss" (hours past 99 too) as seconds."""
    return float(sum(int(part) * 60 ** i for i, part in enumerate(reversed(clock.split(":")))))


def _value(text: str) -> float | str:
    """A postfix value: a number where it is one, else the text as printed."""
    try:
        return float(text)
    except ValueError:
        return text


def _bar_fields(bar: re.Match) -> dict[str, float | str]:
    """What the bar itself prints: epoch, percentage, n/total, elapsed, remaining and the rate."""
    epoch, pct, count, total, elapsed, remaining, rate, unit = bar.groups()
    fields: dict[str, float | str] = {"epoch": int(epoch), "progress_pct": int(pct), "progress_count": int(count),
                                      "progress_total": int(total), "elapsed_s": _seconds(elapsed)}
    if remaining != "?":
        fields["remaining_s"] = _seconds(remaining)
    if rate is not None:
        fields["s_per_it" if unit == "s/it" else "it_per_s"] = float(rate)
    return fields


def _bar_step(printed: str, count: int, stream: MetricsStream) -> tuple[int, dict[str, float]] | None:
    """The step of a bar update and the flags that say how it was found; None when the update must
    not land (an approximate one on a step printed exactly).

    global_step is Lightning's before its increment: 0 during the first step, whose
    consumed_samples is already 1 x GBS (``log_metrics`` in aws-neuron/neuronx-distributed-training
    src/neuronx_distributed_training/lightning_modules/model/base.py); steps count from 1, as
    Megatron-LM's iterations and the native trainer's do. Printed exactly, it is the step the
    postfix's values belong to. Rounded, the bar's exact counter n is the step where n - 1 prints
    as that global_step: NeMo's ``MegatronProgressBar`` (NVIDIA/NeMo) sets n to the optimizer
    steps of the epoch, global_step + 1 in epoch 0, and NxDT's bar runs at most one batch ahead of
    its postfix. Where n is no step (Lightning 1.x counts validation batches in it: ESM1nv's
    published log reads 200/200 at global_step=99.00; each epoch restarts it) the update lands on
    the printed value, flagged ``step_rounded``."""
    if not _rounded(printed):
        return round(float(printed)) + 1, {}
    flags = {"global_step_rounded": 1.0}
    if _within_rounding(count - 1, printed):
        step = count
    else:
        step, flags["step_rounded"] = round(float(printed)) + 1, 1.0
    if step in stream.points and "global_step_rounded" not in stream.points[step]:
        return None
    return step, flags


def _lightning_bar(line: str, stream: MetricsStream) -> bool:
    """Each training-bar update of ``line``: updates glued without a carriage return (a torn one
    before the next), a validation bar or a NeMo record glued after the closing "]"."""
    bars = list(_BAR.finditer(line))
    found = False
    for i, bar in enumerate(bars):
        end = bars[i + 1].start() if i + 1 < len(bars) else len(line)
        postfix, closed, _ = line[bar.end():end].partition("]")
        pairs = dict(_BAR_PAIR.findall(postfix + closed))
        labels = _launcher_labels(line[:bars[0].start()])
        if "global_step" not in pairs and "reduced_train_loss" not in pairs:
            if closed:  # Lightning's own bar before the first log: no step to put it on (a torn one: no news)
                stream.loop_bars.append({"loop": "training", "after_step": max(stream.points, default=0),
                                         **_bar_fields(bar), **labels, **_postfix(pairs)})
            continue
        found = True
        _bar_update(pairs, {**_bar_fields(bar), **labels}, stream)
    return found


def _postfix(pairs: dict[str, str]) -> dict[str, float | str]:
    """A bar's postfix pairs under the stream's names, numbers where they are; v_num, the
    logger's version, is a label ("8-06", "1778", or empty), never a quantity."""
    return {LIGHTNING_KEYS.get(key, key): value if key == "v_num" else _value(value) for key, value in pairs.items()}


def _bar_update(pairs: dict[str, str], fields: dict[str, float | str], stream: MetricsStream) -> None:
    """One update: every postfix key, the known ones under the stream's names, the others as printed."""
    try:
        metrics = _postfix(pairs)
        if any(isinstance(metrics[name], str) for key, name in LIGHTNING_KEYS.items() if key in pairs):
            raise ValueError("a known metric that is not a number")
        placed = _bar_step(pairs["global_step"], int(fields["progress_count"]), stream)
    except (KeyError, ValueError):
        stream.skipped += 1
        return
    if placed is None:
        stream.skipped += 1  # never over a step printed exactly
        return
    step, flags = placed
    if "consumed_samples" in pairs and _rounded(pairs["consumed_samples"]):
        flags["consumed_samples_rounded"] = 1.0
    if "global_step_rounded" not in flags and "global_step_rounded" in stream.points.get(step, {}):
        del stream.points[step]  # an exact update replaces an approximate one, flags and all
    stream.add(step, {**fields, **metrics, **flags})


def _loop_bars(line: str, stream: MetricsStream) -> None:
    """Every sanity-check, validation or early training bar drawn on ``line``: the loop, its
    dataloader, the bar's counts, times and rate, the launcher's label, and ``after_step``: the
    newest training step once the training bars of its line are read (0 before the first), the
    step the loop ran at."""
    bars = list(_LOOP_BAR.finditer(line))
    labels = _launcher_labels(line[:bars[0].start()]) if bars else {}
    for bar in bars:
        loop, loader, pct, count, total, elapsed, remaining, counter, counter_elapsed, rate, unit = bar.groups()
        fields: dict[str, float | str] = {"loop": {"Sanity Checking": "sanity_check", "Training": "training"}.get(
                                              loop, "validation"),
                                          "after_step": max(stream.points, default=0), **labels}
        if loader is not None:
            fields["dataloader"] = int(loader)
        if counter is not None:
            fields |= {"progress_count": int(counter), "elapsed_s": _seconds(counter_elapsed)}
        else:
            fields |= {"progress_pct": int(pct), "progress_count": int(count), "progress_total": int(total),
                       "elapsed_s": _seconds(elapsed)}
            if remaining != "?":
                fields["remaining_s"] = _seconds(remaining)
        if rate is not None:
            fields["s_per_it" if unit == "s/it" else "it_per_s"] = float(rate)
        stream.loop_bars.append(fields)


def _callbacks(line: str, stream: MetricsStream) -> None:
    """A checkpoint saved as one of the best (on the step it names: Lightning's global step once
    the step is done, as this stream counts); on the last step logged: early stopping, a
    checkpoint NeMo removed, and the limit that ended Lightning's fit loop. Each with the
    launcher's label of its line."""
    if saved := _CHECKPOINT.search(line):
        epoch, step, monitor, score, best, path, top_k = saved.groups()
        stream.add(int(step), {"epoch": int(epoch), "checkpoint_monitor": monitor, "checkpoint_score": float(score),
                               "checkpoint_best_score": float(best), "checkpoint_path": path,
                               "checkpoint_top_k": int(top_k), **_launcher_labels(line[:saved.start()])})
    if not stream.points:
        return
    if stop := _EARLY_STOP.search(line):
        rank, monitor, records, best = stop.groups()
        fields: dict[str, float | str] = {"early_stop_monitor": monitor, "early_stop_records_without_improvement":
                                          int(records), "early_stop_best_score": float(best),
                                          **_launcher_labels(line[:stop.start()])}
        if rank is not None:
            fields["early_stop_rank"] = int(rank)
        stream.add(max(stream.points), fields)
    if removed := _REMOVED.search(line):
        level, stamp, module, lineno, path = removed.groups()
        # the node's naive local time, read in this process's zone as Megatron-LM's is
        stream.add(max(stream.points), {"checkpoint_removed_path": path,
                                        "checkpoint_removed_time": datetime.fromisoformat(stamp).timestamp(),
                                        "checkpoint_removed_log_level": level,
                                        "checkpoint_removed_log_source": f"{module}:{lineno}",
                                        **_launcher_labels(line[:removed.start()])})
    if fit := _FIT_STOPPED.search(line):
        limit, value = fit.groups()
        stream.add(max(stream.points), {"fit_stopped_limit": limit, "fit_stopped_limit_value": _value(value),
                                        **_launcher_labels(line[:fit.start()])})


def _launcher_labels(head: str) -> dict[str, float | str]:
    """The srun task, torchrun local rank or SkyPilot's name, node rank, pid and node address that
    labelled a line, from the text before its metrics: which rank printed a value matters when
    ranks disagree."""
    labels: dict[str, float | str] = {}
    if srun := _SRUN_LABEL.match(head):
        labels["srun_task"] = int(srun.group(1))
    if tee := _TORCHRUN_TEE.search(head):
        labels["local_rank"] = int(tee.group(1))
    if sky := _SKY_PREFIX.search(head):
        name, rank, pid, ip = sky.groups()
        labels["pid"] = int(pid)
        labels |= {key: value for key, value in (("skypilot_name", name), ("node_rank", rank and int(rank)),
                                                   ("node_ip", ip)) if value is not None}
    return labels


def _megatron(line: str, stream: MetricsStream) -> bool:
    match = _MEGATRON_ITER.search(line)
    if not match:
        return False
    metrics: dict[str, float] = {"train_iters": int(match.group(2)), **_launcher_labels(line[:match.start()])}
    extra: dict[str, float] = {}
    try:
        stamp = _MEGATRON_TIME.search(line[:match.start()])
        if stamp:
            # Megatron-LM prints the node's naive local time; read in this process's zone, which
            # is the nodes' zone on a cluster that shares one (the native trainer writes it so).
            metrics["time"] = datetime.fromisoformat(stamp.group(1)).timestamp()
        # Every field ends with " |" and starts with a space: text after the last "|" is a line
        # torn mid-value, and a part without the leading space is another rank's output that
        # Slurm appended, not a field of this line. NeMo 2.0's printer (below) ends its last
        # field with the line instead.
        parts = line[match.end():].split("|")
        for part in parts if "| global_step: " in line else parts[:-1]:
            if not part[:1].isspace():
                break
            label, sep, value = part.partition(":")
            label = label.strip()
            if label in MEGATRON_KEYS:
                metrics[MEGATRON_KEYS[label]] = _number(value)
            elif sep:
                try:
                    extra[_snake(label)] = _number(value)
                except ValueError:
                    pass  # an unknown field that is not a number (a string of counts, say)
    except ValueError:
        stream.skipped += 1
        return True
    extra.pop("step", None)
    if "global_step" in extra:
        # NeMo 2.0's progress printer ("Training epoch 1, iteration 0/999 | lr: 3e-06 |
        # global_step: 19 | reduced_train_loss: 11.03 | ..."): its iteration counts the optimizer
        # steps of the epoch, out of max_steps (``ProgressPrinter.on_train_batch_end`` in
        # NVIDIA/NeMo nemo/lightning/pytorch/callbacks/progress_printer.py); the step is
        # Lightning's global_step as the training step logged it, before the increment, as in
        # NxDT's bars. Its keys are Lightning's, snake_cased here.
        step = int(extra["global_step"]) + 1
        metrics["epoch_step"], metrics["max_steps"] = int(match.group(1)), metrics.pop("train_iters")
        if epoch := _NEMO_EPOCH.search(line[:match.start()]):
            metrics["epoch"] = int(epoch.group(1))
        for label, name in LIGHTNING_KEYS.items():
            if _snake(label) in extra:
                metrics[name] = extra.pop(_snake(label))
        stream.add(step, {**extra, **metrics})
        return True
    # No loss is no error: Megatron-LM leaves a loss out when every iteration of the interval was
    # skipped (its average is 0), and the skip counters are then the news.
    stream.add(int(match.group(1)), {**extra, **metrics})
    return True


def _megatron_eval(line: str, stream: MetricsStream) -> bool:
    """An evaluation line: each ``<name> value`` and ``<name> PPL`` as ``val_<name>_loss`` and
    ``val_<name>_ppl`` (``test_`` on the test set, ``val_set<index>_`` for one of several
    validation sets), the lm loss as ``val_loss`` and ``val_ppl``, the native trainer's names. The
    end-of-training evaluation of the last iteration follows that iteration's periodic one, and
    its values win."""
    match = _MEGATRON_EVAL.search(line)
    if not match:
        return False
    index, step, drawn, split, end_split = match.groups()
    if step is None:  # the end of training: the last iteration logged
        if not stream.points:
            stream.skipped += 1
            return True
        step, split = max(stream.points), end_split
    prefix = "test" if split == "test" else "val" if index is None else f"val_set{index}"
    metrics: dict[str, float] = {}
    try:
        for part in line[match.end():].split("|")[:-1]:  # as in _megatron: after the last "|" is torn
            label, sep, value = part.partition(":")
            name, _, kind = label.strip().rpartition(" ")
            if sep and kind in ("value", "PPL"):
                base = name.removesuffix(" loss")  # "lm loss", "mtp_1 loss"
                scope = prefix if base == "lm" else f"{prefix}_{_snake(base)}"
                metrics[f"{scope}_{'ppl' if kind == 'PPL' else 'loss'}"] = _number(value)
    except ValueError:
        stream.skipped += 1
        return True
    if metrics:
        if drawn:  # Megatron-DeepSpeed evaluates a draw of samples at the end and says how many
            metrics[f"{prefix}_samples_drawn"] = int(drawn)
        stream.add(int(step), {**metrics, **_launcher_labels(line[:match.start()])})
    return True


def _torchtitan(line: str, stream: MetricsStream) -> bool:
    """A torchtitan step line, or its validator's line, whose loss is the step's ``val_loss`` (the
    native trainer's and Megatron-LM's name)."""
    if "step:" not in line:  # most lines of a log reach this parser: spare them the substitution
        return False
    line = _ANSI.sub("", line)
    validated = _TITAN_VALIDATE.search(line)
    match = validated or _TITAN_STEP.search(line)
    if not match:
        return False
    if validated:
        # the loss alone: the step's time and rank are its training line's
        stream.add(int(validated.group(1)), {"val_loss": float(validated.group(2))})
        return True
    metrics: dict[str, float] = {}
    if stamp := _TITAN_TIME.search(line):
        metrics["time"] = datetime.fromisoformat(f"{stamp.group(1)}.{stamp.group(2)}").timestamp()
    if rank := _TITAN_RANK.match(line):
        metrics["rank"] = int(rank.group(1))
    for name, value, memory_pct in _TITAN_FIELD.findall(line[match.start():]):
        if name in TITAN_KEYS:
            metrics[TITAN_KEYS[name]] = float(value.replace(",", ""))
            if memory_pct:
                metrics["memory_pct"] = float(memory_pct)
    if "loss" not in metrics:
        stream.skipped += 1
        return True
    if metrics.get("tflops_per_device") == 0 and metrics.get("tokens_per_s_per_device", 0) > 0:
        # A model whose flops torchtitan does not count prints "tflops: 0.00  mfu: 0.00%" at any
        # speed (FLUX: get_nparams_and_flops' TODO in torchtitan/models/flux/README.md): unknown, not 0.
        del metrics["tflops_per_device"], metrics["mfu_pct"]
    stream.add(int(match.group(1)), metrics)
    return True


def _nxd_llama(line: str, stream: MetricsStream) -> bool:
    match = _NXD_LINE.search(line)
    if not match:
        return False
    step, step_time, throughput, loss, grad = match.groups()
    metrics = {"step_time_ms": float(step_time) * 1000, "throughput_seq_s": float(throughput), "loss": float(loss)}
    if grad is not None:
        metrics["grad_norm"] = float(grad)
    stream.add(int(step), metrics)
    return True


def _native(line: str, stream: MetricsStream) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        record = json.loads(line)
        if "kind" in record:
            return True
        step = int(record["step"])
        metrics = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
    except (ValueError, KeyError, TypeError):
        stream.skipped += 1
        return True
    if "event" in record:
        stream.events += 1
    else:
        stream.add(step, metrics)
    return True


def parse_log(text: str, stream: MetricsStream | None = None) -> MetricsStream:
    """Every metrics line of ``text`` (any backend, mixed with other output) into ``stream``."""
    stream = stream or MetricsStream()
    for line in re.split(r"[\r\n]+", text):
        if line.strip():
            (_native(line, stream) or _megatron(line, stream) or _megatron_eval(line, stream) or _lightning_bar(line, stream)
             or _torchtitan(line, stream) or _nxd_llama(line, stream))
            if "dation" in line or "Sanity Checking" in line or "Training:" in line:  # spare most lines the expressions
                _loop_bars(line, stream)
            if "reached" in line or "Monitored metric" in line or "Removing checkpoint" in line:
                _callbacks(line, stream)
    return stream


# The error a trainer's rank printed as it died: a Python exception's last line
# ("torch.OutOfMemoryError: CUDA out of memory. ...") or a C++ exception's what() (the NCCL
# watchdog's "Watchdog caught collective operation timeout: ..."), behind torchrun's "[rankN]:"
# prefix. torchrun's own ChildFailedError only says that a rank failed.
_RANK_ERROR = re.compile(r"^(?:\[\w+\]:)?\s*(?:what\(\):\s+(?P<what>\S.*)|(?P<raised>[\w.]*(?:Error|Exception): \S.*))$")


# A program the node lacks, in the words of what could not start it: the shell
# ("train.sh: line 35: torchrun: command not found", exit status 127), or the Python torchrun
# hands the training script ("python: can't open file '/workspace/Megatron-LM/pretrain_gpt.py':
# [Errno 2] No such file or directory"), or the node script's own check before its launch
# ("pretrain: no program at /workspace/Megatron-LM/pretrain_gpt.py: ...", render/shell.py).
_MISSING_PROGRAM = re.compile(r"(?<=: )(?P<missing>[^:\s]+: command not found"
                              r"|can't open file '[^']+': \[Errno 2\] No such file or directory"
                              r"|no program at [^:\s]+: .+)$")


def rank_error(text: str) -> str | None:
    """The first error a rank printed in ``text`` (the root cause: what the others print after
    it is their reaction), or the program it found missing, or None."""
    for line in text.splitlines():
        match = _RANK_ERROR.match(line.rstrip())
        if match and "ChildFailedError" not in line:
            return (match["what"] or match["raised"]).strip()
        if missing := _MISSING_PROGRAM.search(line.rstrip()):
            return missing["missing"]
    return None


# Megatron-LM's tools/preprocess_data.py on stderr (``Partition.process_json_file``), and
# ``trainer tokenize`` after it: "Processed 1000 documents (1234.5 docs/s, 2.1 MB/s).", the MB
# being MiB (bytes / 1024 / 1024). gpt-neox's copy drives a tqdm counter whose redraws land right
# after the final "." (".: : 520000it [00:21, 24642.85it/s]"); PICL's fork prints the counter
# first and counts instances too ("19709610it [19:42, 18230.21it/s]Processed 19710000 documents.
# 9454301 instances. (...).").
_PREPROCESS = re.compile(r"Processed (\d+) documents(?:\. (\d+) instances\.)? \(([\d.]+) docs/s, ([\d.]+) MB/s\)\.")
_TQDM_COUNTER = re.compile(r"(\d+)it \[([\d:]+), +([\d.]+)it/s\]")


def preprocess_progress(line: str) -> dict[str, float] | None:
    """A tokenize progress line's values (``documents``, ``docs_per_s``, ``mib_per_s``, the srun
    task or torchrun rank that labelled it, a fork's ``instances``, a tqdm counter glued to it as
    ``counter``, ``counter_elapsed_s``, ``counter_it_per_s``); None for any other line."""
    match = _PREPROCESS.search(line)
    if not match:
        return None
    documents, instances, docs_per_s, mib_per_s = match.groups()
    progress = {"documents": int(documents), "docs_per_s": float(docs_per_s), "mib_per_s": float(mib_per_s),
                **_launcher_labels(line[:match.start()])}
    if instances is not None:
        progress["instances"] = int(instances)
    if counter := _TQDM_COUNTER.search(line):
        progress |= {"counter": int(counter.group(1)), "counter_elapsed_s": _seconds(counter.group(2)),
                     "counter_it_per_s": float(counter.group(3))}
    return progress
