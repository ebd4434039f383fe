"""Helpers every stage task shares: artifact keys that are stable per spec and stage, so the
Prefect UI keeps each one's history, and the retry condition."""

from __future__ import annotations

import re


def artifact_key(spec_name: str, stage: str) -> str:
    """Prefect allows only lowercase letters, digits and dashes in a key."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{spec_name}-{stage}".lower()).strip("-")
    return slug or stage


def retryable(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: no retry for an error that says trying again cannot help
    (``retryable = False`` on the exception: bad input, a missing earlier output)."""
    exc = state.result(raise_on_failure=False)
    return getattr(exc, "retryable", True)
