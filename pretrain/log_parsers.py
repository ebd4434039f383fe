"""Training logs of every backend as one metrics stream: ``{"step", "loss", "lr", ...}`` dicts.

- NxDT: Lightning's TQDM progress bar, whose updates are separated by carriage returns
  (``reduced_train_loss=13.40, lr=7.5e-9, global_step=1.000, ...``), global_step counting from 0;
  counts tqdm rounded (``global_step=3.1e+4``) kept as printed and flagged (``step_rounded``,
  ``consumed_samples_rounded``). NeMo 2.0's printer (``iteration 0/999 | global_step: 19 | ...``).
- torchtitan: its step line (``[titan] <time> - root - INFO - step: 200  loss: 6.1384 ...``),
  with or without ANSI colours and torchrun's ``[rank0]:`` prefix.
- NxD Llama examples: ``step 1 step_time 244.76s throughput 3.93 seq/s loss 13.41 grad norm 1.97``.
- Megatron-LM: ``training_log``'s iteration line, with or without its timestamp prefix (kept as
  ``time``, epoch seconds, the native stream's name for it), and ``evaluate_and_print_results``'s
  validation lines (``val_loss``, ``val_ppl``; ``test_...`` on the test set).
- The native trainer: JSON lines with a ``step``; those with an ``event`` (checkpoint saved, step
  skipped) record occurrences, not metrics; those with a ``kind`` (``device``: the device
  sampler's, ``pretrain/device_samples.py`` reads them) belong to other readers and are passed over.

Lines that look like metrics but do not parse are skipped and counted, never raised: a log is
evidence, and one garbled line must not hide the rest of a loss curve. The producers:
aws-neuron/neuronx-distributed-training ``src/neuronx_distributed_training/lightning_modules/model/base.py``
(``log_metrics``) drawn by Lightning-AI/pytorch-lightning
``src/lightning/pytorch/callbacks/progress/tqdm_progress.py``; NVIDIA/Megatron-LM
``megatron/training/training.py`` (``training_log``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime

# One name per quantity across backends.
NXDT_KEYS = {"reduced_train_loss": "loss", "lr": "lr", "gradient_norm": "grad_norm",
             "parameter_norm": "param_norm", "consumed_samples": "consumed_samples",
             "throughput": "throughput_seq_s", "throughput_peak": "throughput_peak_seq_s", "val_loss": "val_loss"}
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
                 "tokens per second": "tokens_per_s", "MFU (%)": "mfu_pct", "max memory allocated (GiB)": "memory_gib"}

# A value counts only when "," or "]" ends it: a bar torn mid-value (the process died) must not
# report "consumed_samples=20" for 2048.0.
_NXDT_PAIR = re.compile(r"([A-Za-z_]\w*)=([^,\]\s]+)(?=[,\]])")
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
# " [2024-05-04 12:00:01]" (core_v0.6 on) or with microseconds (2026 on), right before "iteration".
_MEGATRON_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]\s*$")
# ``evaluate_and_print_results``: "validation loss at iteration 20 | lm loss value: 6.75E+00 |
# lm loss PPL: 8.57E+02 |" during training; at its end the same with " on validation set" or
# " on test set" after the iteration (Megatron-DeepSpeed: " on 320-sample draw from test set";
# Megatron-LM before 2023: "at the end of training for val data", with no iteration). With
# --multiple-validation-sets each set's line says "validation-<index> loss at".
_MEGATRON_EVAL = re.compile(r"validation(?:-(\d+))? loss at (?:iteration\s+(\d+)(?: on (?:\d+-sample draw from )?"
                            r"(validation|test) set)?|the end of training for (val|test) data)\s*\|")
# What launchers put before a rank's line: srun --label's task id ("1: ", right-aligned, so
# " 1: " among ten or more tasks) and torchrun --tee's "[default7]:" (role and local rank).
_SRUN_LABEL = re.compile(r"^\s*(\d+):\s")
_TORCHRUN_TEE = re.compile(r"\[[A-Za-z_]\w*?(\d+)\]:")
# torchtitan's step line (``log`` in pytorch/torchtitan torchtitan/components/metrics.py), coloured
# with ANSI codes: "[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384
# grad_norm: 0.83  memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%"; grad_norm
# since 2025. tps and tflops are per device.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TITAN_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:")
_TITAN_TIME = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_TITAN_RANK = re.compile(r"^\[rank(\d+)\]:")
_TITAN_FIELD = re.compile(r"(\w+):\s*([-\d,.]+|nan|inf)(?:GiB\(([\d.]+)%\)|%)?(?=\s|$)")
TITAN_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "memory": "memory_gib", "tps": "tokens_per_s_per_device",
              "tflops": "tflops_per_device", "mfu": "mfu_pct"}
_NXD_LINE = re.compile(r"\bstep (\d+) step_time ([\d.]+)s throughput ([\d.]+) seq/s loss ([\d.eE+-]+)"
                       r"(?: grad norm ([\d.eE+-]+))?")


@dataclass
class MetricsStream:
    points: dict[int, dict[str, float]] = field(default_factory=dict)
    skipped: int = 0
    events: int = 0  # the native trainer's event lines (checkpoint saved, export, ...): signs of life

    def add(self, step: int, metrics: dict[str, float]) -> None:
        # Progress bars repeat the same step between log intervals: the last report wins.
        self.points[step] = {"step": step, **self.points.get(step, {}), **metrics}

    def as_list(self) -> list[dict[str, float]]:
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


def _nxdt(line: str, stream: MetricsStream) -> bool:
    if "reduced_train_loss=" not in line and "global_step=" not in line:
        return False
    pairs = dict(_NXDT_PAIR.findall(line.split("[", 1)[-1] if "[" in line else line))
    try:
        # Lightning's global_step before its increment: 0 during the first step, whose
        # consumed_samples is already 1 x GBS (``log_metrics`` in aws-neuron/neuronx-distributed-training
        # src/neuronx_distributed_training/lightning_modules/model/base.py). Steps count from 1, as
        # Megatron-LM's iterations and the native trainer's do.
        step = round(float(pairs["global_step"])) + 1
        metrics = {name: _number(pairs[key]) for key, name in NXDT_KEYS.items() if key in pairs}
    except (KeyError, ValueError):
        stream.skipped += 1
        return True
    # tqdm prints a count rounded to 3 significant digits when that is shorter (global_step=3.1e+4
    # is any of 30950-31049; from step 99950 on every one is): such an update is kept at the
    # printed value, and the record says so. The bar's n/total is no exact substitute: Lightning
    # 1.x counts validation batches in it (ESM1nv's published log reads 200/200 at
    # global_step=99.00), and the postfix lags n.
    if _rounded(pairs["global_step"]):
        if step in stream.points and "step_rounded" not in stream.points[step]:
            stream.skipped += 1  # never over a step printed exactly
            return True
        metrics["step_rounded"] = 1.0
    if "consumed_samples" in pairs and _rounded(pairs["consumed_samples"]):
        metrics["consumed_samples_rounded"] = 1.0
    stream.add(step, metrics)
    return True


def _launcher_labels(head: str) -> dict[str, float]:
    """The srun task and torchrun local rank that labelled a line, from the text before its
    metrics: which rank printed a value matters when ranks disagree."""
    labels: dict[str, float] = {}
    if srun := _SRUN_LABEL.match(head):
        labels["srun_task"] = int(srun.group(1))
    if tee := _TORCHRUN_TEE.search(head):
        labels["local_rank"] = int(tee.group(1))
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
        # global_step: 19 | reduced_train_loss: 11.03 | ..."): its iteration counts within the
        # epoch; the step is Lightning's global_step as the training step logged it, before the
        # increment, as in NxDT's bars.
        step = int(extra.pop("global_step")) + 1
        metrics.pop("train_iters")
        for label, name in (("reduced_train_loss", "loss"), ("lr", "lr"), ("train_step_timing_in_s", "step_time_s")):
            if label in extra:
                metrics[name] = extra.pop(label)
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
    index, step, split, end_split = match.groups()
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
        stream.add(int(step), {**metrics, **_launcher_labels(line[:match.start()])})
    return True


def _torchtitan(line: str, stream: MetricsStream) -> bool:
    """A torchtitan step line; its validation line ("validate step:") is not read: no published
    one could be traced to its source."""
    if "step:" not in line:  # most lines of a log reach this parser: spare them the substitution
        return False
    line = _ANSI.sub("", line)
    match = _TITAN_STEP.search(line)
    if not match:
        return False
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
            (_native(line, stream) or _megatron(line, stream) or _megatron_eval(line, stream) or _nxdt(line, stream)
             or _torchtitan(line, stream) or _nxd_llama(line, stream))
    return stream
