"""The run summary artifact's tables read back, cell by cell, as a reader of the UI sees them."""

from __future__ import annotations


def section_rows(summary: str, heading: str) -> list[list[str]]:
    """The body rows of the table under ``#### {heading}``, each as its stripped cells (the
    header row is left out; the ``|---|`` rule does not start with ``| ``)."""
    section = summary.split(f"#### {heading}")[1].split("####")[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[1:]]
