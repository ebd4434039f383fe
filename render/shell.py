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


def require_program(path: str, fix: str, log: str) -> str:
    """A line that stops the node's job before its launch when ``path``, the program the launch
    runs, is not there: exit status 127 (as a shell's missing command), which the job layer never
    resubmits, where torchrun would exit 1 like any crash and spend the failure budget on a
    program that no retry brings. The line names the path and ``fix``, also in ``log``, where
    the task reads the rank's error."""
    message = f"pretrain: no program at {path}: {fix}"
    return (f"[ -e {shell_word(path)} ] || {{ echo {shell_word(message)} | tee -a {log} >&2; exit 127; }}")
