"""The training loop: build everything from the config, resume, step, evaluate, checkpoint.

Numerics (micro-batches, clipping, the finite-loss check before the optimizer step) live in
:meth:`Trainer.train_step`; :meth:`Trainer.train` is the short outer loop.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from trainer.run_layout import grad_accumulation
from trainer.train import device as devices
from trainer.train import model as models
from trainer.train import stop_signals
from trainer.train.checkpoint import Checkpointer, ModelAndOptimizer
from trainer.train.config import TrainConfig
from trainer.train.data import BatchLoader, build_datasets
from trainer.train.loss import loss_function
from trainer.train.metrics import MetricsWriter, mfu, model_flops_per_token
from trainer.train.optimizer import build_optimizer, build_scheduler
from trainer.train.parallelize import build_mesh, clip_gradients, parallelize

# Exit status of a run that saved a checkpoint and stopped on a signal (time limit ahead,
# preemption): not finished, resumable. The job layer resubmits; the run resumes.
EXIT_STOPPED = 3


class NonFiniteLoss(RuntimeError):
    pass


class TrainState(Stateful):
    """What resumes the loop exactly: the step, the schedule, the NaN counters."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        t = self.trainer
        return {"step": t.step, "nan_in_a_row": t.nan_in_a_row, "nan_total": t.nan_total,
                "scheduler": t.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        t = self.trainer
        t.step, t.nan_in_a_row, t.nan_total = state["step"], state["nan_in_a_row"], state["nan_total"]
        t.scheduler.load_state_dict(state["scheduler"])


class RngState(Stateful):
    """This rank's random generators: the CPU's and its accelerator's (device.rng_states)."""

    def __init__(self, device: torch.device):
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        return devices.rng_states(self.device)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        devices.set_rng_states(self.device, state)


def _init_distributed(device: torch.device) -> None:
    """torchrun sets the rendezvous variables; a plain ``python -m trainer train`` is a world of one."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group(backend=devices.process_group_backend(device))


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        # First of all: a stop signal during start-up (imports: stop_signals.catch() in
        # trainer/__main__.py; loading, resuming: this handler) is honoured after the first step
        # instead of killing the rank.
        self.stop_signal: int | None = None
        self.stopping = False  # every rank's common decision, from the step's all-reduce
        for sig in stop_signals.STOP_SIGNALS:
            signal.signal(sig, self._on_stop_signal)
        self.stop_signal = self.stop_signal or stop_signals.noted()
        self.device = devices.resolve(cfg.device)
        if cfg.parallel.float8:
            devices.check_float8(self.device)
        devices.return_freed_units()
        _init_distributed(self.device)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        mesh = build_mesh(self.device, self.world, cfg.parallel.tp)
        dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
        self.grad_accumulation = grad_accumulation(cfg.global_batch_size, cfg.micro_batch_size, dp_size)

        self.model = models.build(cfg.model)  # on the meta device: split first, then given values
        self.sharded = parallelize(self.model, mesh, cfg, self.device)
        models.materialize(self.model, cfg.model, cfg.seed, self.device)
        devices.keep_freed_memory(self.device)  # from here on the steps' tensors, not the units'
        # Unsharded, autocast gives the compute dtype that FSDP's mixed precision gives sharded.
        dtype = devices.compute_dtype(self.device, cfg.precision)
        self.autocast = torch.autocast(self.device.type, dtype=dtype, enabled=not self.sharded and dtype != torch.float32)
        self.token_loss = loss_function(self.device, cfg.parallel.compile)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.model, cfg.optim, fused=devices.fused_optimizer(self.device))
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, cfg.steps)

        valid_samples = cfg.eval_iters * cfg.micro_batch_size * dp_size if cfg.evaluates else 0
        train_set, self.valid_set = build_datasets(
            cfg.data, seq_length=cfg.seq_length, seed=cfg.seed, train_samples=cfg.steps * cfg.global_batch_size,
            valid_samples=valid_samples, eod_id=cfg.eod_id)
        if cfg.evaluates and self.valid_set is None:
            raise ValueError(f"eval_iters={cfg.eval_iters} but data.split={cfg.data.split!r} leaves no validation "
                             "samples: give the split a validation weight, or set eval_iters=0 or benchmark=true")
        self.loader = BatchLoader(train_set, micro_batch_size=cfg.micro_batch_size, dp_rank=dp_rank, dp_size=dp_size)
        self.dp_rank, self.dp_size = dp_rank, dp_size

        self.step = self.nan_in_a_row = self.nan_total = 0
        self.checkpointer = Checkpointer(cfg.checkpoint, self.rank, devices.checkpoint_staging(self.device))
        self.resumed_from = self._resume()
        self.metrics = MetricsWriter(cfg.metrics, rank=self.rank, train_steps=cfg.steps, resume_step=self.step)
        self.flops_per_token = model_flops_per_token(cfg.model, cfg.seq_length)
        self.peak_flops = devices.peak_flops(self.device)

    # ------------------------------------------------------------------ state

    def state(self) -> dict[str, Any]:
        return {"model_optim": ModelAndOptimizer(self.model, self.optimizer), "train": TrainState(self),
                "data": self.loader, f"rng_rank{self.rank}": RngState(self.device)}

    def _resume(self) -> int | None:
        latest = torch.tensor([self.checkpointer.latest() or -1])
        dist.broadcast(latest, src=0)  # every rank resumes from the step rank 0 found
        step = int(latest.item())
        if step < 0:
            return None
        self.checkpointer.load(self.state(), step)
        return step

    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signal = signum

    # ------------------------------------------------------------------ steps

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with self.autocast:
            logits = self.model(input_ids=batch["tokens"].to(self.device), use_cache=False).logits
        return self.token_loss(logits, batch["labels"].to(self.device), batch["loss_mask"].to(self.device))

    def train_step(self) -> dict[str, float]:
        total = torch.zeros((), device=self.device)
        for micro in range(self.grad_accumulation):
            # Gradients are reduced across data-parallel ranks once, after the last micro-batch.
            if self.sharded:
                self.model.set_requires_gradient_sync(micro == self.grad_accumulation - 1)
            loss = self._loss(self.loader.next_batch()) / self.grad_accumulation
            loss.backward()
            total += loss.detach()
        # One all-reduce carries the loss and whether any rank was asked to stop.
        packed = torch.stack([total.float(), torch.tensor(float(self.stop_signal is not None), device=self.device)])
        dist.all_reduce(packed)
        loss_value = packed[0].item() / self.world
        # Stop on the reduced flag only: a signal landing after this all-reduce is seen by some
        # ranks alone, and acting on it there would leave the others in the next step's collectives.
        self.stopping = packed[1].item() > 0
        if self.stopping and self.stop_signal is None:
            self.stop_signal = signal.SIGTERM
        norm = clip_gradients(self.params, self.cfg.optim.grad_clip)
        finite = torch.isfinite(torch.tensor(loss_value)) and torch.isfinite(norm)
        if finite:
            self.checkpointer.wait_for_staging()
            self.optimizer.step()
            self.scheduler.step()
            self.nan_in_a_row = 0
        else:
            # As Megatron: the iteration counts, the update and the schedule step do not.
            self.nan_in_a_row += 1
            self.nan_total += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"loss": loss_value, "grad_norm": float(norm), "nan_iterations": self.nan_total}

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """The same first batches of the validation set every time, so evaluations compare."""
        self.model.eval()
        loader = BatchLoader(self.valid_set, micro_batch_size=self.cfg.micro_batch_size, dp_rank=self.dp_rank,
                             dp_size=self.dp_size)
        total = torch.zeros((), device=self.device)
        for _ in range(self.cfg.eval_iters):
            total += self._loss(loader.next_batch()).float()
        dist.all_reduce(total)
        self.model.train()
        val_loss = total.item() / (self.cfg.eval_iters * self.world)
        return {"val_loss": val_loss, "val_ppl": float(torch.tensor(val_loss).exp())}

    # ------------------------------------------------------------------ outer loop

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.resumed_from is not None:
            # The world may be smaller than the one that saved (a node lost, the run shrunk to the
            # nodes left): the global batch stays, each rank accumulates more micro-batches.
            self.metrics.log_event(self.step, "resumed", from_step=self.resumed_from, data_parallel=self.dp_size,
                                   grad_accumulation=self.grad_accumulation)
        tokens_per_step = cfg.global_batch_size * cfg.seq_length
        last: dict[str, float] = {}
        warmed = False
        self.model.train()
        while self.step < cfg.steps:
            start = time.perf_counter()
            lr = self.scheduler.get_last_lr()[0]
            metrics = self.train_step()
            devices.synchronize(self.device)
            elapsed = time.perf_counter() - start
            tokens_per_s = tokens_per_step / elapsed
            metrics.update(lr=lr, step_time_ms=elapsed * 1000, tokens_per_s=tokens_per_s,
                           consumed_samples=self.step * cfg.global_batch_size,
                           memory_gib=devices.max_memory_gib(self.device))
            if (pct := mfu(tokens_per_s / self.world, self.flops_per_token, self.peak_flops)) is not None:
                metrics["mfu_pct"] = pct
            self.metrics.log_step(self.step, metrics)
            if self.nan_in_a_row >= cfg.optim.max_nan_steps_in_a_row:
                raise NonFiniteLoss(f"loss or gradient norm was not finite for {self.nan_in_a_row} steps in a row "
                                    f"(up to step {self.step}); lower optim.lr or check the data, then resume "
                                    "from the last checkpoint")
            last.update(metrics)
            self.checkpointer.poll()
            if not warmed:  # the optimizer has made its state in this first step
                self.checkpointer.warm({"model_optim": ModelAndOptimizer(self.model, self.optimizer)})
                warmed = True
            if cfg.evaluates and self.step % cfg.eval_interval == 0:
                val = self.validate()
                self.metrics.log_eval(self.step, val)
                last.update(val)
            if self.stopping:
                return self._stop()
            if self.step % cfg.checkpoint.interval == 0 and self.step < cfg.steps:
                self.checkpointer.save(self.state(), self.step)
                self.metrics.log_event(self.step, "checkpoint", path=str(self.checkpointer.root))
        if cfg.evaluates and self.step % cfg.eval_interval:
            last.update(self.validate())
            self.metrics.log_eval(self.step, {k: last[k] for k in ("val_loss", "val_ppl")})
        if cfg.checkpoint.final and self.checkpointer.latest() != self.step:
            self.checkpointer.save(self.state(), self.step, blocking=True)
        if cfg.export_hf:
            # A sign of life for the control plane's hang check: a large model exports for minutes.
            self.metrics.log_event(self.step, "export", path=cfg.export_hf)
            self._export()
        return {"status": "finished", "step": self.step, "resumed_from": self.resumed_from, **last}

    def _stop(self) -> dict[str, Any]:
        name = signal.Signals(self.stop_signal).name
        self.checkpointer.save(self.state(), self.step, blocking=True)
        self.metrics.log_event(self.step, "stopped", signal=name)
        print(f"stopped by {name} at step {self.step}: checkpoint saved, resume by running again", flush=True)
        return {"status": "stopped", "step": self.step, "signal": name, "resumed_from": self.resumed_from}

    def _export(self) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            models.export(self.model.config, full, self.cfg.export_hf)
        dist.barrier()

    def close(self) -> None:
        self.checkpointer.close()
        self.metrics.close()
        if dist.is_initialized():
            dist.destroy_process_group()
