"""Faults the tests inject into the local Slurm cluster."""

from __future__ import annotations

import subprocess


def preempt_node() -> str:
    """A job in the `urgent` partition (the stack's highest priority tier) takes the whole node,
    preempting what runs in `debug` (requeued) and `spot` (cancelled after its grace time)."""
    out = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-J", "urgent-preemptor",
                          "-o", "/dev/null", "--wrap", "sleep 3"], capture_output=True, text=True, check=True)
    return out.stdout.strip()
