"""Artifact keys: stable per spec and stage, so the Prefect UI keeps each one's history."""

from __future__ import annotations

import re


def artifact_key(spec_name: str, stage: str) -> str:
    """Prefect allows only lowercase letters, digits and dashes in a key."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{spec_name}-{stage}".lower()).strip("-")
    return slug or stage
