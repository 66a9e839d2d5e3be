"""The self-contained HTML report (sim/report_html.py), and how it renders in a real browser (headless
Chromium from the system's packages; skipped with the reason where there is none)."""
from __future__ import annotations

import math
import re
import struct

import pytest

from sim import report as run_report
from sim.browser import Chromium, find_chromium
from sim.report_html import render

PEERS = {1: ("miner0", "honest"), 2: ("diligent0", "diligent"), 3: ("late0", "late"),
         4: ("<img src=x onerror=alert(1)>", "malformed")}


def fake_report(windows: int = 6, samples: list | None = None) -> dict:
    lines = [{"window": 10 + i, "val_loss": 5.0 - 0.2 * i, "val_bits_per_byte": (5.0 - 0.2 * i) / math.log(2),
              "weights": {"1": 0.4, "2": 0.6, "3": 0.0, "4": 0.0}, "loss_ratings": {"1": i, "2": 1.5 * i},
              "rejections": {"3": "too_late", **({"4": "malformed"} if i % 2 else {"4": "wrong_count"})}}
             for i in range(windows)]
    report = run_report.build(lines, PEERS, {1: 0.45, 2: 0.55})
    if samples is not None:
        report["samples"] = samples
    return report


def test_report_is_one_self_contained_escaped_page():
    page = render(fake_report(), command="python scripts/localnet.py --windows 6")
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page               # a peer's name is text, never markup
    assert re.findall(r'(?:src|href)="(?!data:)', page) == []          # nothing fetched from anywhere
    assert page.count('src="data:image/svg+xml;base64,') == len(run_report.PLOTS)
    assert "5.0000 nats/token · 7.213 bits/byte" in page               # as recorded: 5 / ln 2 = 7.2135
    assert 'id="sampled-text"' in page and "carries no sampled text" in page
    # rejections: reason × peer counts over the run (late0 was late in all six windows)
    table = page[page.index('<table id="rejections">'):]
    assert "too_late" in table and ">6<" in table and "wrong_count" in table


def test_sampled_text_fills_its_slot_escaped():
    page = render(fake_report(samples=[{"window": 15, "prompt": "ROMEO:", "text": "Wherefore <art> thou"}]))
    assert "window 15" in page and "ROMEO:" in page and "Wherefore &lt;art&gt; thou" in page
    assert "carries no sampled text" not in page


def test_run_report_writes_the_html_beside_markdown_and_pngs(tmp_path):
    run_report.write(fake_report(), tmp_path, "cmd")
    for name in ("report.json", "report.md", "report.html", "val_loss.png", "weights.png", "ratings.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "report.html" in (tmp_path / "report.md").read_text()


@pytest.fixture(scope="module")
def chromium():
    if find_chromium() is None:
        pytest.skip("no Chromium: scripts/bootstrap.sh installs Debian's `chromium` when it runs as root with "
                    "apt reachable; elsewhere install it from the system's package manager")
    with Chromium() as browser:
        yield browser


def test_report_renders_in_chromium_without_errors(chromium, tmp_path):
    path = tmp_path / "report.html"
    path.write_text(render(fake_report(samples=[{"window": 15, "prompt": "ROMEO:", "text": "Wherefore art"}]),
                           "cmd"))
    page = chromium.open(path, screenshot=True, width=1000)
    assert page.problems == []
    assert page.title.startswith("DSO local network run")
    for text in ("Local network run", "Plots", "Peers", "Rejections", "Sampled text", "Wherefore art", "diligent0"):
        assert text in page.text, text
    assert all(u == page.url or u.startswith("data:") for u in page.requests) and len(page.requests) == 4
    png = page.screenshot
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width == 1000 and height > 1500                           # the whole page, not just the viewport


def test_the_checker_sees_what_goes_wrong(chromium, tmp_path):
    """The browser test could fail: a page with a console error, an exception, a broken image and a request
    to the network is reported on every count."""
    path = tmp_path / "bad.html"
    path.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"><title>bad</title></head><body>'
                    '<img alt="broken" src="data:image/png;base64,AAAA">'
                    '<img alt="remote" src="http://127.0.0.1:9/x.png">'
                    '<script>console.error("boom"); undefinedFunction();</script></body></html>')
    page = chromium.open(path)
    text = "\n".join(page.problems)
    assert "console.error: boom" in text and "undefinedFunction" in text
    assert "image did not render: broken" in text and "request outside the page: http://127.0.0.1:9/x.png" in text
