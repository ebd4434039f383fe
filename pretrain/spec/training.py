"""The optimisation (the training section) and the chain of jobs every backend's section carries."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pretrain.spec.strict import Strict


class TrainingSpec(Strict):
    train_steps: int | None = Field(None, gt=0, description="Optimizer steps; exclusive with train_samples.")
    train_samples: int | None = Field(None, gt=0, description="Samples; exclusive with train_steps.")
    micro_batch_size: int = Field(1, gt=0)
    global_batch_size: int = Field(gt=0)
    lr: float = Field(gt=0)
    min_lr: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    lr_decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = Field(0.1, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, ge=0)
    checkpoint_interval: int | Literal["auto"] = Field(
        1000, description="Steps between checkpoints; auto: the interval that loses the least time to saves and "
        "failures together (Young/Daly, docs/checkpoints.md), from the save stall and step time the run measures "
        "(training.step_time_s until it has) and the cluster's failure rate, re-derived at each job's launch.")
    step_time_s: float | None = Field(None, gt=0, description="Expected seconds per optimizer step at this scale (an "
                                      "earlier run's, or the runbook's log): the checkpoint advice and the time-limit "
                                      "check use it until the run has measured its own.")
    continue_run: bool = Field(True, description="A new flow run of this spec continues its run from the newest "
                               "checkpoint, reusing every finished stage; false: each flow run trains afresh in a "
                               "directory of its own (as training.benchmark does). Another name starts another run too.")
    eval_interval: int = Field(1000, gt=0, description="Steps between validation runs.")
    eval_iters: int = Field(10, ge=0, description="Validation batches per run; 0 disables evaluation.")
    seed: int = 1234
    precision: Literal["bf16", "fp32", "mixed_precision"] = "bf16"
    benchmark: bool = Field(False, description="Fixed steps, no evaluation: the nightly benchmark mode.")
    monitor_interval_s: float = Field(5.0, gt=0, description="Seconds between the device sampler's samples "
                                      "(python -m trainer monitor, one per node beside the ranks, every backend).")

    @field_validator("checkpoint_interval")
    @classmethod
    def _positive_interval(cls, value: int | str) -> int | str:
        if value != "auto" and value <= 0:
            raise ValueError(f"training.checkpoint_interval={value}: give a positive number of steps, or auto")
        return value

    @model_validator(mode="after")
    def _steps_xor_samples(self) -> TrainingSpec:
        if self.train_steps and self.train_samples:
            raise ValueError("training.train_steps and training.train_samples are both set: keep one "
                             "(set the other to null)")
        if not (self.train_steps or self.train_samples):
            raise ValueError("set training.train_steps or training.train_samples")
        if self.min_lr > self.lr:
            raise ValueError(f"training.min_lr={self.min_lr} is above training.lr={self.lr}")
        if self.checkpoint_interval == "auto" and not self.step_time_s:
            raise ValueError("training.checkpoint_interval=auto needs training.step_time_s, the expected seconds per "
                             "step, for the first job (later jobs use the step time the run measures)")
        return self

    @property
    def steps(self) -> int:
        """Optimizer steps of the run, as every backend is launched: ``train_steps``, or
        ``train_samples`` over the global batch, rounded up."""
        return self.train_steps or -(-self.train_samples // self.global_batch_size)

    @property
    def checkpoint_steps(self) -> int:
        """The interval every backend is launched with: ``auto`` is resolved into a number of steps
        before anything is rendered (pretrain/checkpoint_interval.py)."""
        if self.checkpoint_interval == "auto":
            raise ValueError("training.checkpoint_interval=auto reached a launch unresolved: resolve it first "
                             "(pretrain.checkpoint_interval.resolved)")
        return self.checkpoint_interval

    @property
    def eval_batches(self) -> int:
        """Validation batches per evaluation as every backend is launched: none in benchmark mode."""
        return 0 if self.benchmark else self.eval_iters


# Fields renamed when a run became a chain of jobs: the old name is refused, saying the new one.
RENAMED_RESTART_FIELDS = {
    "max_restarts": ("max_attempts_without_checkpoint", "it counted every resubmission, a time limit included, so a "
                     "run of weeks gave up after a few jobs; the new field counts the jobs in a row that ended without "
                     "advancing the newest checkpoint"),
    "stop_signal_delay_s": ("save_before_limit_s", "every backend now saves before its time limit, by its own means"),
}


class Restarts(Strict):
    """How the train stage carries a run through the jobs it takes, for every backend."""

    max_attempts_without_checkpoint: int = Field(
        3, ge=0, description="The failure budget: jobs in a row that may end without advancing the run's newest "
        "checkpoint (a crash, a hang, a node failure, a job that never got to save) before the run fails, naming "
        "each job's error. A job that advanced it spends none, whatever ended it: at its time limit, preempted or "
        "requeued, the next job goes out at once and the count starts again.")
    hang_timeout_min: float = Field(10.0, gt=0, description="Cancel and resubmit a run whose metrics have "
                                    "not advanced for this long.")
    save_before_limit_s: int = Field(
        600, ge=0, description="How long before each job's time limit it saves a checkpoint and exits, by the "
        "backend's own means: Slurm's USR2 to the native trainer; Megatron-LM's --exit-duration-in-mins; NxD "
        "Training's trainer.max_time. torchtitan has none: its checkpoint.interval alone. At least one step "
        "(training.step_time_s) and a save.")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        for old, (new, why) in RENAMED_RESTART_FIELDS.items():
            if isinstance(data, dict) and old in data:
                raise ValueError(f"{old}={data[old]} is no longer read ({why}): use {new}")
        return data
