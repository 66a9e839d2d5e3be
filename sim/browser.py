"""Headless Chromium over the DevTools protocol on a pipe (no extra library): open a page, report what went
wrong while it rendered, take a full-page screenshot.  The HTML report's test and its screenshot in docs/
use it; Chromium comes from the system's package manager (scripts/bootstrap.sh), never a download.

    python -m sim.browser PAGE.html [--screenshot OUT.png] [--width 1100]

With ``--remote-debugging-pipe`` Chromium reads DevTools commands on fd 3 and writes replies and events on
fd 4, each message JSON ending in a NUL byte.  "Went wrong" means: a console error, an uncaught exception,
a browser log entry of level error (e.g. a resource that failed to load), an image that did not decode,
or any request for something other than the page itself or a data: URI (a self-contained page makes none).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dso.util.processes import reap, signal_group, spawn

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--mute-audio", "--remote-debugging-pipe"]
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
Message = dict[str, Any]  # one DevTools protocol message, as JSON from the browser
_BROKEN_IMAGES = "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt)"


class BrowserError(RuntimeError):
    """Chromium did not start, answer or render in time."""


def find_chromium() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageReport:
    url: str
    problems: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads, broken images
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    title: str = ""
    text: str = ""                                      # document.body.innerText
    screenshot: bytes | None = None                     # PNG of the whole page


class Chromium:
    """One headless browser process; ``with Chromium() as b: b.open(path)``."""

    def __init__(self, binary: str | None = None, timeout: float = 60.0):
        binary = binary or find_chromium()
        if binary is None:
            raise BrowserError(f"no Chromium found (looked for {', '.join(NAMES)})")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="dso-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds_3_and_4() -> None:  # in the child: the pipe ends where Chromium expects them (inheritable;
            # Python's other descriptors are not, so close_fds=False passes exactly these)
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)  # copies first: either may sit on 3 or 4
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._log = open(Path(self.profile) / "stderr.log", "wb")
        self.process = spawn([binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                             before_exec=fds_3_and_4, close_fds=False, stdin=subprocess.DEVNULL,
                             stdout=self._log, stderr=subprocess.STDOUT)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer, self._next_id = b"", 0
        self.events: list[Message] = []

    # ----------------------------------------------------------- protocol
    def send(self, method: str, params: Message | None = None, session: str | None = None) -> Message:
        """One command; its result (events that arrive meanwhile are kept in :attr:`events`)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                result: Message = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_event(self, method: str, session: str | None = None) -> Message:
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            event = self._receive()
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def _receive(self) -> Message:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, left))
            chunk = os.read(self._from_browser, 1 << 20) if ready else b""
            if not chunk:
                raise BrowserError(f"Chromium {'closed the pipe' if ready else 'did not answer'}: {self._tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        decoded: Message = json.loads(message)
        return decoded

    def _tail(self) -> str:
        self._log.flush()
        text = (Path(self.profile) / "stderr.log").read_text(errors="replace")
        return "\n".join(line for line in text.splitlines()[-8:] if "dbus" not in line)[-1500:]

    # ---------------------------------------------------------------- use
    def open(self, page: str | Path, screenshot: bool = False, width: int = 1100) -> PageReport:
        url = Path(page).resolve().as_uri() if not str(page).startswith(("file:", "http:", "https:")) else str(page)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": False}, session)
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        report = PageReport(url)
        report.title = self.evaluate("document.title", session)
        report.text = self.evaluate("document.body ? document.body.innerText : ''", session)
        broken = self.evaluate(_BROKEN_IMAGES, session)
        report.problems += [f"image did not render: {alt}" for alt in broken]
        if screenshot:
            size = self.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
                "x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}}, session)
            report.screenshot = base64.b64decode(shot["data"])
        self._collect(report, session, url)
        self.send("Target.closeTarget", {"targetId": target})
        return report

    def evaluate(self, expression: str, session: str) -> Any:
        out = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return out.get("result", {}).get("value")

    def _collect(self, report: PageReport, session: str, url: str) -> None:
        for event in self.events:
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                report.problems.append(f"console.{params['type']}: {args}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                report.problems.append(f"exception: {details.get('exception', {}).get('description') or details}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                report.problems.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Network.requestWillBeSent":
                requested = params.get("request", {}).get("url", "")
                report.requests.append(requested)
                if requested != url and not requested.startswith("data:"):
                    report.problems.append(f"request outside the page: {requested[:200]}")
            elif method == "Network.loadingFailed":
                report.problems.append(f"load failed: {params.get('errorText')}")

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        signal_group(self.process, signal.SIGTERM)  # the renderer and helper processes are in its group
        reap(self.process, 5.0)
        signal_group(self.process, signal.SIGKILL)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.browser", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("page", type=Path)
    p.add_argument("--screenshot", type=Path, help="write a PNG of the whole page here")
    p.add_argument("--width", type=int, default=1100, help="viewport width in CSS pixels (default 1100)")
    args = p.parse_args(argv)
    try:
        with Chromium() as browser:
            report = browser.open(args.page, screenshot=args.screenshot is not None, width=args.width)
    except BrowserError as e:
        print(f"sim.browser: {e}", file=sys.stderr)
        return 2
    if args.screenshot and report.screenshot:
        args.screenshot.write_bytes(report.screenshot)
    print(f"{report.url}: title {report.title!r}, {len(report.requests)} request(s), "
          f"{len(report.problems)} problem(s)")
    for problem in report.problems:
        print(f"  {problem}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
