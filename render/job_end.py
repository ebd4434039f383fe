"""How each backend's training job saves a checkpoint and exits before its time limit, by that
backend's own means, ``backend.<kind>.save_before_limit_s`` ahead of it; without one, Slurm's
SIGTERM at the limit and KillWait's SIGKILL after it end the job with what its last periodic
checkpoint holds. One rule for the train tasks and the dry run.

- native: Slurm sends USR2 that long ahead (``--signal=USR2@N``); torchrun forwards it to the
  ranks (``--signals_to_handle``, render/native.py), which save at the end of their step and exit.
- megatron-lm: ``--exit-duration-in-mins``: Megatron-LM checks, after every iteration and agreed
  over the ranks, the minutes since its process started (``_PROGRAM_START_TIME`` in
  pretrain_gpt.py), saves a checkpoint and exits 0 (``checkpoint_and_decide_exit`` in
  megatron/training/training.py at core_v0.16.1). No Slurm signal: torchrun before torch 2.10
  handles no USR2, and the signal would end torchrun itself.
- neuron: Lightning's ``trainer.max_time`` (``DD:HH:MM:SS``, counted from the start of training,
  so less the start-up): its Timer stops the fit loop after a step, and NxD Training's checkpoint
  callback saves the last checkpoint on the way out when ``save_last`` is on.
- torchtitan: none; torchtitan 0.3.0 installs no signal handler and has no time limit. Its
  ``checkpoint.interval`` alone, which the spec requires to fit in a job
  (``PretrainSpec._check_time_limit``).
"""

from __future__ import annotations

from pretrain.spec import PretrainSpec


def signal_delay_s(spec: PretrainSpec) -> int:
    """Seconds before the limit Slurm signals the training job's steps (0: no signal ahead)."""
    return spec.backend.native.save_before_limit_s if spec.backend.kind == "native" else 0


def megatron_exit_duration_min(spec: PretrainSpec) -> int:
    """``--exit-duration-in-mins``: the time limit less the save, in whole minutes, at least 1."""
    lead_min = -(-spec.restarts.save_before_limit_s // 60)
    return max(spec.cluster.time_limit_min - lead_min, 1)


def nxdt_max_time(spec: PretrainSpec) -> str:
    """``trainer.max_time``: the time limit less the start-up and the save, as Lightning's
    ``DD:HH:MM:SS``, at least a minute."""
    seconds = spec.cluster.time_limit_min * 60 - spec.cluster.startup_min * 60 - spec.restarts.save_before_limit_s
    minutes = max(int(seconds // 60), 1)
    return f"{minutes // 1440:02d}:{minutes // 60 % 24:02d}:{minutes % 60:02d}:00"
