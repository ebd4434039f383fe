"""Screenshots of the Prefect UI with Debian's headless Chromium, and what the rendered DOM shows.

A helper for tests, not a test module. ``screenshot`` loads a page of the Prefect V2 (React) UI
in ``chromium --headless=new`` and writes a PNG of it, returning the DOM as the browser
rendered it; ``xychart`` reads a mermaid xychart (the loss-curve artifact's chart) out of that
DOM: title, axis titles and labels, and per line its colour and vertices.

Where the loss curve is drawn (ui-v2 of prefect 3.8.8, base path ``/v2``):

- ``/v2/artifacts/artifact/<artifact id>`` (tab ``Artifact``, the default) renders the markdown
  through ``lazy-markdown``: a ```` ```mermaid ```` block becomes an ``<svg
  aria-roledescription="xychart">`` drawn by the bundled mermaid (12.0.0), loaded lazily.
- ``/v2/runs/flow-run/<flow run id>?tab=Artifacts`` lists the run's artifacts as cards (type, key,
  created, description); it does not render their data, so no chart appears there.
- ``/v2/artifacts/key/<key>`` is the key's timeline of versions, also without the data.

Chromium comes from the ``chromium`` Debian package, which ``make system-deps``
(``deployments/stack/install-debian.sh``, as root) installs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

# What mermaid puts on the <svg> of an xychart it has drawn (mermaid sets aria-roledescription to
# the diagram type); the UI inserts the svg only after mermaid.render() has resolved.
XYCHART_MARKER = 'aria-roledescription="xychart"'
# The UI's block for a mermaid block that failed to parse or render (ui-v2 lazy-markdown).
MERMAID_FAILED = "Failed to render mermaid diagram"

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# Chromium reads --virtual-time-budget as a 32-bit int: a larger one ends the load with no DOM.
MAX_BUDGET_MS = 2**31 - 1


def chromium_binary() -> str:
    """The Chromium executable: ``$CHROMIUM`` if set, else the first of ``CHROMIUM_NAMES`` on PATH."""
    for name in (os.environ.get("CHROMIUM"), *CHROMIUM_NAMES):
        if name and (found := shutil.which(name)):
            return found
    raise RuntimeError(
        "no Chromium for the UI screenshots: install Debian's `chromium` with `make system-deps` "
        "(runs deployments/stack/install-debian.sh as root; or `apt-get install -y --no-install-recommends "
        "chromium`), or set CHROMIUM to a Chrome/Chromium executable")


def _visible_text(dom: str, limit: int = 600) -> str:
    """The page's text, from its <main> (the UI's content, without the navigation) when it has one."""
    main = re.search(r"<main\b.*?</main>", dom, flags=re.S | re.I)
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", main.group(0) if main else dom, flags=re.S | re.I)
    text = " ".join(re.sub(r"<[^>]+>", " ", text).split())
    return text[:limit]


def screenshot(url: str, png: Path, wait_for: str | None = XYCHART_MARKER, timeout_s: float = 60.0,
               window: tuple[int, int] = (1280, 1600), budget_ms: int = 10_000,
               fail_on: tuple[str, ...] = (MERMAID_FAILED,)) -> str:
    """Load ``url`` in headless Chromium, write a ``window``-sized PNG of it to ``png`` and
    return the rendered DOM (``document.documentElement.outerHTML``).

    With ``wait_for`` (a substring of the DOM; by default an xychart's svg) the page is loaded
    again, with twice the virtual-time budget each time (up to Chromium's largest), until its DOM
    holds ``wait_for``; a ``TimeoutError`` after ``timeout_s`` seconds names what the page showed
    instead. A ``RuntimeError`` when the DOM holds one of ``fail_on`` (by default the UI's "Failed to render
    mermaid diagram", whose details it quotes) or Chromium fails.

    Each load is one Chromium run that writes both the screenshot and the DOM, so the PNG shows
    the page in exactly the state the returned DOM describes (two runs could differ). About 3 s
    per load on 2 cores.
    """
    chromium = chromium_binary()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    budget = budget_ms
    while True:
        # Waiting with --virtual-time-budget, not wall-clock sleeps: Chromium runs the page on
        # virtual time, which does not advance while a network fetch is pending (the API calls,
        # the 4.9 MB mermaid chunk the UI imports lazily) and jumps ahead when the page is idle,
        # and it takes the screenshot and DOM only when the budget is used up. So the lazy import
        # and mermaid's asynchronous render finish first however slow the machine is: measured,
        # 100 virtual ms already showed the chart, also with the 2 cores saturated, and a 120 s
        # budget costs no more wall time (2-4 s a load) than 5 s. The retry with a larger budget
        # is for what virtual time cannot see, e.g. a server still starting.
        png.unlink(missing_ok=True)  # so a PNG left from an earlier load is never taken for this one
        # A fresh profile per run, and XDG dirs in it (Chromium keeps crash-report settings and
        # dconf there): no state shared between runs, nothing written to the user's home.
        with tempfile.TemporaryDirectory(prefix="ui-screenshot-") as profile:
            env = {**os.environ, "XDG_CONFIG_HOME": f"{profile}/config", "XDG_CACHE_HOME": f"{profile}/cache"}
            command = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                       # /dev/shm is 64 MB in containers; the Debian wrapper's own check misfires
                       "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                       f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}",
                       f"--virtual-time-budget={budget}", f"--screenshot={png}", "--dump-dom", url]
            try:
                done = subprocess.run(command, capture_output=True, text=True, env=env,
                                      timeout=max(30.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as error:
                raise TimeoutError(f"chromium did not finish loading {url} in {error.timeout:.0f} s") from error
        dom = done.stdout
        if done.returncode != 0 or not dom.strip() or not png.exists():
            noise = ("dbus", "unexpected operator", "bytes written to file")
            stderr = "\n".join(line for line in done.stderr.splitlines() if not any(n in line for n in noise))
            wrote = "no DOM" if not dom.strip() else "no PNG" if not png.exists() else "DOM and PNG written"
            raise RuntimeError(f"chromium exited with {done.returncode} on {url} ({wrote}):\n{stderr[-2000:]}")
        for failure in fail_on:
            if failure in dom:
                raise RuntimeError(f"{url} shows {failure!r}: {mermaid_errors(dom) or _visible_text(dom)}")
        if wait_for is None or wait_for in dom:
            return dom
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{url}: no {wait_for!r} in the DOM after {timeout_s:.0f} s (last virtual-time "
                               f"budget {budget} ms); the page showed: {_visible_text(dom)!r}; screenshot {png}")
        budget = min(budget * 2, MAX_BUDGET_MS)


def mermaid_errors(dom: str) -> list[str]:
    """The messages of the UI's "Failed to render mermaid diagram" blocks, and of mermaid's own
    error diagrams (``aria-roledescription="error"``), in the DOM."""
    parser = _MermaidErrors()
    parser.feed(dom)
    return parser.errors


@dataclass
class Line:
    stroke: str
    """The line's colour as mermaid drew it (the chart's ``plotColorPalette``)."""
    points: list[tuple[float, float]]
    """Its vertices in the svg's coordinates (y grows downwards): one per value of the line."""


@dataclass
class XYChart:
    """A mermaid xychart as drawn in the DOM."""

    title: str = ""
    x_title: str = ""
    y_title: str = ""
    x_labels: list[str] = field(default_factory=list)
    y_labels: list[str] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    bars: int = 0
    """The number of bar plots."""
    width: float = 0.0
    height: float = 0.0
    """The svg's viewBox size."""


def xycharts(dom: str) -> list[XYChart]:
    """Every mermaid xychart drawn in ``dom`` (an svg with ``aria-roledescription="xychart"``),
    in document order; empty when there is none, e.g. while the UI still shows its placeholder,
    or when it shows the chart's source as code instead."""
    parser = _XYChartParser()
    parser.feed(dom)
    return parser.charts


def xychart(dom: str) -> XYChart | None:
    """The first xychart in ``dom``, or None."""
    charts = xycharts(dom)
    return charts[0] if charts else None


_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


def _vertices(path: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(rf"({_NUMBER})[ ,]({_NUMBER})", path)]


class _XYChartParser(HTMLParser):
    """Walks the svg subtrees of xycharts. Inside an svg every element has an end tag in
    Chromium's serialisation, so a stack of the open elements' classes locates each one."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.charts: list[XYChart] = []
        self.stack: list[tuple[str, set[str]]] = []  # (tag, classes) inside the current chart's svg
        self.text_target: str | None = None

    def _within(self, *classes: str) -> bool:
        return all(any(c in cls for _, cls in self.stack) for c in classes)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if not self.stack:
            if tag == "svg" and a.get("aria-roledescription") == "xychart":
                box = [float(v) for v in a.get("viewbox", "").split()] or [0, 0, 0, 0]
                self.charts.append(XYChart(width=box[2], height=box[3]))
                self.stack.append((tag, set()))
            return
        classes = set(a.get("class", "").split())
        self.stack.append((tag, classes))
        chart = self.charts[-1]
        if tag == "path" and any(c.startswith("line-plot-") for _, cls in self.stack for c in cls):
            chart.lines.append(Line(a.get("stroke", ""), _vertices(a.get("d", ""))))
        elif tag == "g" and any(c.startswith("bar-plot-") for c in classes):
            chart.bars += 1
        elif tag == "text":
            if self._within("chart-title"):
                self.text_target = "title"
            elif self._within("bottom-axis", "title"):
                self.text_target = "x_title"
            elif self._within("left-axis", "title"):
                self.text_target = "y_title"
            elif self._within("bottom-axis", "label"):
                self.text_target = "x_labels"
            elif self._within("left-axis", "label"):
                self.text_target = "y_labels"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack:
            return
        # Pop to the matching element (tolerates an element serialised without an end tag).
        for depth in range(len(self.stack) - 1, -1, -1):
            if self.stack[depth][0] == tag:
                del self.stack[depth:]
                break
        if tag == "text":
            self.text_target = None

    def handle_data(self, data: str) -> None:
        if not self.stack or not self.text_target or not data.strip():
            return
        chart = self.charts[-1]
        if self.text_target in ("x_labels", "y_labels"):
            getattr(chart, self.text_target).append(data.strip())
        else:
            setattr(chart, self.text_target, (getattr(chart, self.text_target) + " " + data.strip()).strip())


class _MermaidErrors(HTMLParser):
    """Text of the UI's failure block (``<p>Failed to render mermaid diagram</p>`` then a
    ``<details>`` whose ``<pre>`` holds the message) and of mermaid's error svgs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.errors: list[str] = []
        self.after_failure = False  # the failure <p> was seen; the next <pre> holds the message
        self.capture: str | None = None  # "pre" or "svg" while capturing their text
        self.depth = 0
        self.text: list[str] = []
        self.in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.capture:
            self.depth += tag == self.capture
            self.in_style = tag == "style"
            return
        if tag == "pre" and self.after_failure:
            self.capture, self.depth, self.text, self.after_failure = "pre", 1, [], False
        elif tag == "svg" and dict(attrs).get("aria-roledescription") == "error":
            self.capture, self.depth, self.text = "svg", 1, []

    def handle_endtag(self, tag: str) -> None:
        self.in_style = False
        if self.capture and tag == self.capture:
            self.depth -= 1
            if self.depth == 0:
                message = " ".join("".join(self.text).split())
                if message not in self.errors:
                    self.errors.append(message)
                self.capture = None

    def handle_data(self, data: str) -> None:
        if self.capture:
            if not self.in_style:  # an svg's <style> is CSS, not the message
                self.text.append(data)
        elif data.strip() == MERMAID_FAILED:
            self.after_failure = True
