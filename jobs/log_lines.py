"""Complete lines out of a log that arrives in pieces (a file read as it grows, a pod's log
stream), for both executors' log following."""

from __future__ import annotations


class LineSplitter:
    """Feeds text in, gets the lines it completed out; a line cut off at the end of a piece waits
    for the rest of it."""

    def __init__(self) -> None:
        self.partial = ""

    def feed(self, text: str) -> list[str]:
        *complete, self.partial = (self.partial + text).split("\n")
        # tqdm-style progress rewrites one line with carriage returns: keep the last state
        return [line.rsplit("\r", 1)[-1] for line in complete]
