"""The base of every section of the spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A typo'd field is an error that names it, not a silently ignored key."""

    model_config = ConfigDict(extra="forbid")
