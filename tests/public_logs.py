"""The public log fixtures in tests/assets/logs/: blocks of verbatim lines, each under a
``# <url>`` comment naming where it was published (SOURCES.md there describes each file)."""

from __future__ import annotations

from pathlib import Path

LOGS = Path(__file__).parent / "assets/logs"


def blocks(name: str) -> list[tuple[str, list[str]]]:
    """(source URL, its lines) for each block of ``LOGS/name``, in the file's order."""
    found: list[tuple[str, list[str]]] = []
    for line in (LOGS / name).read_text().split("\n"):
        if line.startswith("# http"):
            found.append((line[2:], []))
        elif found and line.strip() and not line.startswith("#"):
            found[-1][1].append(line)
    return found
