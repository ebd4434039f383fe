"""Shell text for the scripts a job runs on its nodes."""

from __future__ import annotations

import re
import shlex


def node_path(path: str) -> str:
    """``~`` is the home directory on the compute node, not where the script was rendered."""
    return "$HOME" + path[1:] if path == "~" or path.startswith("~/") else path


def shell_word(arg: str) -> str:
    """One shell word; ``$NAME`` stays expandable on the node (``trainer.num_nodes=$NNODES``)."""
    if "$" not in arg:
        return shlex.quote(arg)
    return '"' + re.sub(r'(["\\`])', r"\\\1", arg) + '"'


def shell_line(argv: list[str]) -> str:
    return " ".join(shell_word(a) for a in argv)
