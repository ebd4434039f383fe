"""Screenshots of the Prefect UI with Debian's headless Chromium, and what the rendered DOM shows.

A helper for tests, not a test module. ``screenshot`` loads a page of the Prefect V2 (React) UI
in ``chromium --headless=new``, driven over the DevTools protocol, and writes a PNG of it,
returning the DOM as the browser rendered it; ``xychart`` reads a mermaid xychart (the
loss-curve artifact's chart) out of that DOM: title, axis titles and labels, and per line its
colour and vertices.

Where the loss curve is drawn (ui-v2 of prefect 3.8.8, base path ``/v2``):

- ``/v2/artifacts/artifact/<artifact id>`` (tab ``Artifact``, the default) renders the markdown
  through ``lazy-markdown``: a ```` ```mermaid ```` block becomes an ``<svg
  aria-roledescription="xychart">`` drawn by the bundled mermaid (12.0.0), loaded lazily.
- ``/v2/runs/flow-run/<flow run id>?tab=Artifacts`` lists the run's artifacts as cards (type, key,
  created, description); it does not render their data, so no chart appears there.
- ``/v2/artifacts/key/<key>`` is the key's timeline of versions, also without the data.

A server with basic authentication (the stack's) shows the UI's login until the page's origin
holds the credential where the UI's login keeps it: ``localStorage["prefect-password"]``, the
base64 of the auth string (ui-v2's ``AuthProvider``, which checks it against
``/api/admin/version``). ``screenshot(..., auth=...)`` puts it there before loading the page,
as a person's login would.

Chromium comes from the ``chromium`` Debian package, which ``make system-deps``
(``deployments/stack/install-debian.sh``, as root) installs; the DevTools client is the
``websockets`` package Prefect depends on.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from websockets.sync.client import connect

# What mermaid puts on the <svg> of an xychart it has drawn (mermaid sets aria-roledescription to
# the diagram type); the UI inserts the svg only after mermaid.render() has resolved.
XYCHART_MARKER = 'aria-roledescription="xychart"'
# The UI's block for a mermaid block that failed to parse or render (ui-v2 lazy-markdown).
MERMAID_FAILED = "Failed to render mermaid diagram"
# Where ui-v2 keeps the credential of a server with basic authentication.
PASSWORD_KEY = "prefect-password"

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


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


class _Page:
    """One page of a headless Chromium, over the DevTools protocol's websocket
    (https://chromedevtools.github.io/devtools-protocol/): commands and their answers; events are
    not needed and skipped."""

    def __init__(self, websocket_url: str) -> None:
        self.socket = connect(websocket_url, max_size=None, open_timeout=30)  # screenshots exceed 1 MiB
        self.ids = itertools.count(1)

    def call(self, method: str, timeout_s: float = 60, **params) -> dict:
        ident = next(self.ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            message = json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"chromium: {method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"chromium: {expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def load(self, url: str, deadline: float) -> None:
        """Navigate and wait for the document to finish loading (the UI's API calls go on after)."""
        self.call("Page.navigate", url=url)
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() >= deadline:
                raise TimeoutError(f"chromium did not finish loading {url}")
            time.sleep(0.2)


def _devtools_page(profile: str, proc: subprocess.Popen, deadline: float) -> _Page:
    """The page Chromium opened, once it has written the port it listens on into the profile."""
    active = Path(profile) / "DevToolsActivePort"
    while not (active.exists() and active.read_text().strip()):
        if proc.poll() is not None or time.monotonic() >= deadline:
            stderr = proc.stderr.read() if proc.poll() is not None else ""
            raise RuntimeError(f"chromium did not open its DevTools port (exit {proc.poll()}):\n{stderr[-2000:]}")
        time.sleep(0.1)
    port = active.read_text().split()[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
        targets = json.loads(resp.read())
    return _Page(next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"))


def screenshot(url: str, png: Path, wait_for: str | None = XYCHART_MARKER, timeout_s: float = 60.0,
               window: tuple[int, int] = (1280, 1600), auth: str | None = None,
               fail_on: tuple[str, ...] = (MERMAID_FAILED,)) -> str:
    """Load ``url`` in headless Chromium, write a ``window``-sized PNG of it to ``png`` and
    return the rendered DOM (``document.documentElement.outerHTML``).

    ``auth``: the server's basic-authentication string, given to the UI as its login keeps it.
    With ``wait_for`` (a substring of the DOM; by default an xychart's svg) the page is watched
    until its DOM holds it; a ``TimeoutError`` after ``timeout_s`` seconds names what the page
    showed instead. A ``RuntimeError`` when the DOM holds one of ``fail_on`` (by default the UI's
    "Failed to render mermaid diagram", whose details it quotes) or Chromium fails.

    The screenshot is taken right after the DOM that satisfied ``wait_for`` was read, of the same
    page: the UI changes nothing more once the chart is drawn. A few seconds on 2 cores.
    """
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)  # so a PNG left from an earlier run is never taken for this one
    deadline = time.monotonic() + timeout_s
    # A fresh profile per run, and XDG dirs in it (Chromium keeps crash-report settings and dconf
    # there): no state shared between runs, nothing written to the user's home.
    with tempfile.TemporaryDirectory(prefix="ui-screenshot-") as profile:
        env = {**os.environ, "XDG_CONFIG_HOME": f"{profile}/config", "XDG_CACHE_HOME": f"{profile}/cache"}
        command = [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   # /dev/shm is 64 MB in containers; the Debian wrapper's own check misfires
                   "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                   f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}",
                   "--remote-debugging-port=0", "about:blank"]
        # In a session of its own: its renderer and utility processes write into the profile too,
        # and all must be gone before the profile is removed.
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            page = _devtools_page(profile, proc, deadline)
            page.call("Emulation.setDeviceMetricsOverride", width=window[0], height=window[1],
                      deviceScaleFactor=1, mobile=False)
            if auth is not None:
                # Any page of the server's origin can write the origin's storage; its health check
                # needs no credential.
                origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(url))
                page.load(f"{origin}/api/health", deadline)
                page.evaluate(f"localStorage.setItem({json.dumps(PASSWORD_KEY)}, "
                              f"{json.dumps(base64.b64encode(auth.encode()).decode())})")
            page.load(url, deadline)
            while True:
                dom = page.evaluate("document.documentElement.outerHTML")
                for failure in fail_on:
                    if failure in dom:
                        raise RuntimeError(f"{url} shows {failure!r}: {mermaid_errors(dom) or _visible_text(dom)}")
                if wait_for is None or wait_for in dom:
                    png.write_bytes(base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"]))
                    return dom
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{url}: no {wait_for!r} in the DOM after {timeout_s:.0f} s; the page "
                                       f"showed: {_visible_text(dom)!r}")
                time.sleep(0.5)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            _wait_for_group_gone(proc.pid)


def _wait_for_group_gone(group: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


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
