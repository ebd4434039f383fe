"""Faults the tests inject into the local Slurm cluster."""

from __future__ import annotations

import subprocess

from deployments.stack.slurm import PREEMPT_GRES


def preempt() -> str:
    """A job in the `urgent` partition (the stack's highest priority tier) takes the node's
    preemption slot from the job holding it, in `preemptible` (requeued) or `spot` (cancelled after
    its grace time). Jobs in `debug` are never preempted, so the other tests' jobs run on."""
    out = subprocess.run(["sbatch", "--parsable", "-p", "urgent", f"--gres={PREEMPT_GRES}", "-J", "urgent-preemptor",
                          "-o", "/dev/null", "--wrap", "sleep 3"], capture_output=True, text=True, check=True)
    return out.stdout.strip()
