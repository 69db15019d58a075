"""The dashboard as a newcomer meets it, in Debian's Chromium (driven by Playwright): a real
``eddyline run --ui`` in a process of its own, then ``eddyline control route --rebalance`` and
``eddyline apply`` from the command line, as the issue's user did. The heat map's axis label is
inside its picture and clear of the routing strip; the rebalance, which has nothing to move on one
lane, says so in its outcome and in Decisions; the sink the apply added is drawn in the graph.

The page after the apply is saved as ``dashboard-after-apply.png`` under ``$EDDYLINE_SCREENSHOTS``
(else the test's temporary directory)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.browser import FLAGS, chromium

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EDDYLINE = Path(sys.executable).parent / "eddyline"

SPEC = """\
name: clicks
trigger: 500ms
key_groups: 8
lanes: 1
sources:
  - name: events
    generator: {rate: 1000, keys: 100}
steps:
  - name: big
    input: events
    filter: "value >= 100"
  - name: counts
    input: big
    aggregate: {key: key, aggregates: {n: "count(*)"}}
sinks:
  - name: out
    input: counts
    discard: {}
"""
#: the same with one more sink, reading the filter's output
WIDER = SPEC + """\
  - name: also
    input: big
    discard: {}
"""




def eddyline(*args: str, cwd: Path) -> str:
    done = subprocess.run([str(EDDYLINE), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def dashboard_url(log: Path, run: subprocess.Popen, timeout_s: float = 180.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"dashboard: (http\S+)", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        assert run.poll() is None, f"eddyline run exited: {log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no dashboard URL printed: {log.read_text(errors='replace')[-3000:]}")


def test_the_dashboard_follows_an_apply_and_says_what_a_rebalance_did(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    browser_path = chromium()
    shots = Path(os.environ.get("EDDYLINE_SCREENSHOTS") or tmp_path)
    (tmp_path / "net.yaml").write_text(SPEC)
    (tmp_path / "wider.yaml").write_text(WIDER)
    log = tmp_path / "run.log"
    with log.open("w") as out:
        run = subprocess.Popen([str(EDDYLINE), "run", "net.yaml", "--checkpoint", "ckpt", "--ui",
                                "--ui-port", "0", "--no-live", "--duration", "300"],
                               cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = dashboard_url(log, run)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path, args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1500})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            page.wait_for_selector("svg.heatmap[data-step=counts] rect", timeout=180_000)

            # the heat map's axis label, drawn with a few epochs only: inside its picture, and the
            # routing strip below it, not over it
            label = page.locator("svg.heatmap[data-step=counts] text", has_text="darkest").bounding_box()
            heat = page.locator("svg.heatmap[data-step=counts]").bounding_box()
            strip = page.locator("svg.routing[data-step=counts]").bounding_box()
            assert label and heat and strip
            assert label["x"] + label["width"] <= heat["x"] + heat["width"] and label["y"] + label["height"] <= heat["y"] + heat["height"]
            assert strip["y"] >= heat["y"] + heat["height"]

            # a rebalance of a step on one lane moves nothing: its outcome and Decisions say so
            eddyline("control", "route", "counts", "--rebalance", "--checkpoint", "ckpt", cwd=tmp_path)
            page.wait_for_selector("#commands td.outcome:has-text('nothing moved: counts runs on one lane')",
                                   timeout=60_000)
            page.wait_for_selector("#decisions tr[data-kind=operator]:has-text('nothing moved: counts runs on one lane')",
                                   timeout=10_000)
            assert "no decisions yet" not in page.inner_text("#decisions")

            # one more sink, applied while it runs: drawn in the graph
            assert page.locator("svg.graph g.node[data-node=also]").count() == 0
            eddyline("apply", "net.yaml", "wider.yaml", "--checkpoint", "ckpt", cwd=tmp_path)
            page.wait_for_selector("svg.graph g.node[data-node=also]", timeout=60_000)
            page.wait_for_selector("#io td:text-is('also')", timeout=60_000)  # and its first epoch reported
            page.screenshot(path=str(shots / "dashboard-after-apply.png"), full_page=True)
            browser.close()
        assert errors == []
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
