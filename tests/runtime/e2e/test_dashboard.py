"""The dashboard of a running network, in a real headless Chromium (Debian's, driven by
Playwright), on local Spark: it loads without console errors, draws the graph and the lane heat
map, follows the epochs, shows the move a forced rebalance made, and its control calls change the
routing, rescale, pause and resume the network, with the token it took from the URL the server
printed; calls without the token, and a cross-site form from another page in the same browser,
change nothing;
``/metrics`` parses and matches the progress records; every call is in the epoch plans."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from eddyline.api.validate import load_spec
from eddyline.cli import app
from eddyline.eventtime import iso_ms
from eddyline.observe.dashboard.access import Access
from eddyline.observe.dashboard.app import create_app
from eddyline.observe.dashboard.server import DashboardServer
from eddyline.observe.progress import ProgressReporter
from eddyline.operate import checkpoint_feed, live_feed
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.inbox import Inbox
from tests.browser import FLAGS, chromium

pytestmark = pytest.mark.spark





def wait(what: str, ok: Callable[[], bool], timeout_s: float = 45.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_dashboard_in_a_browser(spark, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    browser_path = chromium()
    shots = Path(os.environ.get("EDDYLINE_SCREENSHOTS") or tmp_path)
    spec = load_spec({
        "name": "hot-keys", "trigger": "500ms", "key_groups": 16, "lanes": 2, "history": 1000,
        "sources": [{"name": "events", "generator": {"rate": 4000, "keys": 200, "skew": 1.3}}],
        "steps": [
            {"name": "big", "input": "events", "filter": "value >= 100"},
            {"name": "counts", "input": "big", "aggregate": {"key": "key", "aggregates": {"n": "count(*)"}}},
        ],
        "sinks": [{"name": "out", "input": "counts", "discard": {}}],
        "control": {"scale": {"auto": False, "max_lanes": 2}},
    })
    reporter = ProgressReporter(live=False)
    ckpt = str(tmp_path / "ckpt")
    engine = Engine(spec, spark, ckpt, reporter=reporter)
    got: list[dict] = []
    reporter.listeners.append(got.append)
    access = Access.bind("127.0.0.1")  # a token made at start, as `eddyline run --ui` does
    server = DashboardServer(live_feed(engine, reporter), access, "127.0.0.1", 0).start()
    auth = {"Authorization": f"Bearer {access.token}"}
    stop = threading.Event()
    runner = threading.Thread(target=lambda: engine.run(duration_s=300, should_stop=stop.is_set), daemon=True)
    runner.start()
    api = httpx.Client(base_url=server.url, timeout=30)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path, args=FLAGS)
            context = browser.new_context(viewport={"width": 1280, "height": 1500})
            page = context.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.login_url)
            page.wait_for_selector("svg.graph g.node[data-node=counts]", timeout=90_000)
            page.wait_for_selector("svg.heatmap[data-step=counts] rect", timeout=90_000)
            first = int(page.inner_text("#last-epoch"))
            page.wait_for_function(f"Number(document.getElementById('last-epoch').textContent) > {first}",
                                   timeout=30_000)  # it follows the epochs by itself

            # a forced rebalance from the page's own form: a decision, marked on the heat map
            # (its token came with the URL: the token field stays empty, the address bar has none)
            assert "token" not in page.url
            page.fill("#c-step", "counts")
            page.click("#b-rebalance")
            page.wait_for_selector("#control-result:has-text('queued')", timeout=10_000)
            page.wait_for_selector("tr.decision[data-kind=balance]:has-text('reason=operator')", timeout=30_000)
            page.wait_for_selector("svg.heatmap[data-step=counts] text.mark:has-text('M')", timeout=10_000)

            # a page on another site, open in the same browser (which holds the dashboard's cookie),
            # posts a form to the control API: refused by the server, nothing queued
            calls = len(engine.inbox.pending()) + len(engine.inbox.done())
            evil = context.new_page()
            evil.route("http://localhost:9/**", lambda route: route.fulfill(content_type="text/html", body=(
                f'<form id=f method=post enctype=text/plain action="{server.url}api/control/pause">'
                '<input name=\'{"a":"\' value=\'1"}\'></form><script>f.submit()</script>')))
            with evil.expect_response(f"{server.url}api/control/pause") as answer:
                evil.goto("http://localhost:9/")
            assert answer.value.status == 403 and "another site" in answer.value.text()
            evil.close()
            assert len(engine.inbox.pending()) + len(engine.inbox.done()) == calls

            # without the token: 401, and nothing is queued
            calls = len(engine.inbox.pending()) + len(engine.inbox.done())
            assert api.post("api/control/move", json={"step": "counts", "move": {"0": 0}}).status_code == 401
            assert api.post("api/control/pause", json={}, headers={"Authorization": "Bearer guess"}).status_code == 401
            assert len(engine.inbox.pending()) + len(engine.inbox.done()) == calls

            # a move: key group 0 to the other lane, from the next epoch on, also in the page
            seen = len(got)
            lane = 1 - got[-1]["routing"]["counts"]["assignment"][0]
            assert api.post("api/control/move", json={"step": "counts", "move": {"0": lane}}, headers=auth).status_code == 200
            wait("the move", lambda: any(r["routing"]["counts"]["assignment"][0] == lane for r in got[seen:]))
            version = next(r for r in got[seen:] if r["routing"]["counts"]["assignment"][0] == lane)["routing"]["counts"]["version"]
            page.wait_for_selector(f"svg.routing[data-step=counts][data-version='{version}'], "
                                   f"svg.routing[data-step=counts][data-version='{version + 1}']", timeout=10_000)

            # a rescale to one lane
            assert api.post("api/control/rescale", json={"step": "counts", "lanes": 1}, headers=auth).status_code == 200
            wait("the rescale", lambda: got[-1]["routing"]["counts"]["lanes"] == 1)
            page.wait_for_selector("#step-counts h3:has-text('1 lane')", timeout=10_000)

            # paused: no epoch runs; meanwhile /metrics equals the progress records
            assert api.post("api/control/pause", json={}, headers=auth).status_code == 200
            page.wait_for_selector("#run-state:has-text('paused')", timeout=30_000)
            held = len(got)
            time.sleep(2.0)
            assert len(got) == held
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(api.get("metrics", headers=auth).text) for s in f.samples}
            assert samples[("eddyline_epochs_total", ())] == len(got)
            assert samples[("eddyline_input_rows_total", ())] == sum(r["numInputRows"] for r in got)
            assert samples[("eddyline_output_rows_total", (("sink", "out"),))] == sum(
                s["numOutputRows"] for r in got for s in r["sinks"])
            assert samples[("eddyline_last_epoch", ())] == got[-1]["batchId"]
            assert samples[("eddyline_lanes", (("step", "counts"),))] == 1
            assert samples[("eddyline_decisions_total", (("kind", "balance"), ("step", "counts")))] == sum(
                1 for r in got for d in r["decisions"] if d["kind"] == "balance")
            assert samples[("eddyline_paused", ())] == 1
            page.screenshot(path=str(shots / "dashboard.png"), full_page=True)  # (the README shows it)

            assert api.post("api/control/resume", json={}, headers=auth).status_code == 200
            wait("an epoch after the resume", lambda: len(got) > held)
            page.wait_for_selector("#run-state:has-text('running')", timeout=10_000)
            browser.close()
        assert errors == []
    finally:
        stop.set()
        runner.join(timeout=120)
        server.stop()
        api.close()
    # every control call is in the plan of the epoch it took effect in, and closed as applied
    ck = Checkpoint(ckpt)
    applied = [a for e in range(1, got[-1]["batchId"] + 1) if ck.has_plan(e) for a in ck.read_plan(e).applied]
    kinds = [("route" in a and next(k for k in ("rebalance", "move", "lanes") if k in a["route"]))
             or ("pause" in a and "pause") or ("resume" in a and "resume") for a in applied]
    assert kinds == ["rebalance", "move", "lanes", "pause", "resume"]
    assert all(c["outcome"] == "applied" and c["from"] == "dashboard" for c in engine.inbox.done())
    # a record says when its epoch committed (what end-to-end latency is measured to)
    assert got[-1]["committedAt"] == iso_ms(int(ck.read_commit(got[-1]["batchId"]).committed_at * 1000))

    # stopped: `eddyline status` and `eddyline ui` read the checkpoint alone
    result = CliRunner().invoke(app, ["status", ckpt])
    assert result.exit_code == 0, result.output
    last = got[-1]
    assert f"last committed epoch {last['batchId']}" in result.output and "no driver has held its lease" in result.output
    assert "step counts: 1 lanes" in result.output and "source events: offset" in result.output
    assert "rescale · why operator" in result.output and "balance · why operator" in result.output
    status = json.loads(CliRunner().invoke(app, ["status", ckpt, "--json"]).output)
    assert status["lastEpoch"] == last["batchId"] and status["routing"]["counts"]["lanes"] == 1
    Inbox(ckpt).set_paused({"id": "by-hand", "since": 0.0})
    assert Engine(spec, spark, ckpt).paused  # a pause outlives its driver
    browse = TestClient(create_app(checkpoint_feed(ckpt), Access.open_loopback()), base_url="http://127.0.0.1")
    view = browse.get("/api/view").json()
    assert view["epoch"] == last["batchId"] and "paused" in view["sections"]["status"]
    assert browse.post("/api/control/resume", json={}).status_code == 409
