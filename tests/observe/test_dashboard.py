"""The dashboard without Spark: its pictures from hand-made progress records, and its API's
security and refusals (FastAPI's test client; the feed is a real checkpoint inbox)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from eddyline.observe.dashboard import views
from eddyline.observe.dashboard.access import Access
from eddyline.observe.dashboard.app import Feed, create_app
from eddyline.operate import check_command
from eddyline.runtime.inbox import Inbox
from tests.observe.helpers import NET, record


def test_the_graph_marks_the_critical_path_and_the_rates() -> None:
    # per_key's slowest lane (300 ms) outweighs fresh's (50 ms): bids → cheap → per_key → counts
    r = record(1, {"per_key": [300.0, 100.0], "fresh": [50.0, 20.0]})
    assert views.critical_path(NET, r) == ["bids", "cheap", "per_key", "counts"]
    svg = views.graph_svg(NET, r)
    assert svg.count('class="node"') == 7 and "3.0K rows/s" in svg  # bids: 1,500 rows in 0.5 s
    assert "critical path: bids → cheap → per_key → counts" in svg
    r = record(2, {"per_key": [10.0, 10.0], "fresh": [50.0, 20.0]})
    assert views.critical_path(NET, r) == ["asks", "fresh", "firsts"]


def test_the_heat_map_shades_lanes_and_marks_decisions() -> None:
    move = {"epoch": 2, "step": "per_key", "kind": "balance", "action": {"moves": [[3, 0, 1]]},
            "why": {"reason": "operator"}, "expected": {"makespanMs": 50.0}}
    rescale = {"epoch": 3, "step": "per_key", "kind": "rescale", "action": {"lanes": [2, 1]}, "why": {"reason": "schedule"},
               "expected": {}}
    records = [record(1, {"per_key": [100.0, 50.0]}), record(2, {"per_key": [80.0, 80.0]}, [move]),
               record(3, {"per_key": [40.0]}, [rescale])]
    svg = views.heatmap_svg("per_key", records)
    assert svg.count("<rect") == 6  # 3 epochs x 2 lanes (the rescaled epoch's lane 1 greyed)
    assert 'fill="#eee"' in svg and 'rgba(214,39,40,1.000)' in svg  # the 100 ms cell is the darkest
    assert 'data-epoch="2">M' in svg and 'data-epoch="3">R' in svg
    table = views.decisions_html(records)
    assert table.count('class="decision"') == 2 and "reason=operator" in table
    strip = views.routing_svg("per_key", records[-1]["routing"]["per_key"])
    assert strip.count("<rect") == 8 and strip.count('stroke="#000"') == 1  # key group 3 is split
    assert f'fill="{views.lane_colour(1)}"' in strip


@pytest.fixture
def inbox(tmp_path: Path) -> Inbox:
    return Inbox(str(tmp_path / "ckpt"))


def app_for(inbox: Inbox, token: str | None) -> TestClient:
    def submit(c: dict) -> str:
        return inbox.submit_command({k: v for k, v in c.items() if k != "from"}, origin=c["from"])

    feed = Feed(network=lambda: NET, records=lambda: [record(1, {"per_key": [1.0, 2.0]})],
                commands=inbox.done, submit=submit, check=lambda c: check_command(NET, {}, c))
    return TestClient(create_app(feed, Access.open_loopback(token)), base_url="http://127.0.0.1:8475")


def test_control_calls_need_the_token_and_are_checked_before_anything_is_queued(inbox: Inbox) -> None:
    client = app_for(inbox, "s3cret")
    assert client.get("/api/view").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/?token=s3cret").status_code == 200 and client.get("/metrics").status_code == 200  # cookie
    for path, body in (("rebalance", {"step": "per_key"}), ("pause", {}), ("rescale", {"step": "per_key", "lanes": 1})):
        assert client.post(f"/api/control/{path}", json=body).status_code == 401  # the cookie is not enough
        assert client.post(f"/api/control/{path}", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert inbox.pending() == []
    auth = {"Authorization": "Bearer s3cret"}
    refused = {
        ("set", '{"settings": {"cheap.filter": "value <"}}'): "cheap.filter",
        ("set", '{"settings": {"per_key.key": "value"}}'): "cannot change while it runs",
        ("rebalance", '{"step": "cheap"}'): "not a stateful step",
        ("rescale", '{"step": "per_key", "lanes": 0}'): "greater than or equal to 1",
        ("move", '{"step": "per_key", "move": {}}'): "at least 1",
    }
    for (path, body), why in refused.items():
        r = client.post(f"/api/control/{path}", content=body, headers={**auth, "Content-Type": "application/json"})
        assert r.status_code in (400, 422) and why in r.text, (path, r.text)
    assert inbox.pending() == []
    r = client.post("/api/control/rescale", json={"step": "per_key", "lanes": 1}, headers=auth)
    assert r.status_code == 200 and "rescale to 1 lane of per_key" in r.json()["queued"]
    r = client.post("/api/control/set", json={"settings": {"cheap.filter": "value < 100"}}, headers=auth)
    assert r.status_code == 200
    queued = inbox.pending()
    assert [c.get("route") or c.get("set") for c in queued] == [{"step": "per_key", "lanes": 1}, {"cheap.filter": "value < 100"}]
    assert {c["from"] for c in queued} == {"dashboard"}


def test_a_browsed_checkpoint_cannot_be_controlled(inbox: Inbox) -> None:
    feed = Feed(network=lambda: NET, records=lambda: [])
    r = TestClient(create_app(feed, Access.open_loopback()), base_url="http://localhost").post("/api/control/pause", json={})
    assert r.status_code == 409 and "not running here" in r.text


def test_the_page_and_its_script_are_served_from_the_package(inbox: Inbox) -> None:
    client = app_for(inbox, None)
    page = client.get("/")
    assert page.status_code == 200 and "<title>shop · Eddyline</title>" in page.text
    assert "static/dashboard.js" in page.text and "http" not in page.text.split("<body>")[1]  # nothing from outside
    assert client.get("/static/dashboard.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/../app.py").status_code == 404
    view = client.get("/api/view").json()
    assert set(view["sections"]) >= {"graph", "steps", "decisions", "epochs", "io", "status", "commands"}
    again = client.get("/api/view", params={"since": view["epoch"], "state": view["state"]}).json()
    assert again["sections"] == {}  # nothing new: nothing redrawn


def test_sources_and_sinks_show_their_servers_health() -> None:
    r = record(1, {"per_key": [1.0, 1.0]})
    r["sources"][0] |= {"status": "unreachable", "retries": 4, "backlog": 1200}
    html = views.io_html([r])
    assert "unreachable (4 retries)" in html and "1.2K" in html and html.count(">ok<") == 3
    assert "discarded" not in html
    earlier = record(0, {"per_key": [1.0, 1.0]})
    earlier["sources"][0]["discarded"] = 20
    r["sources"][0]["discarded"] = 5
    assert "25 discarded by the stream before they were read" in views.io_html([earlier, r])
    r["sources"][0]["lag"] = {"t/0": 0, "t/1": 900, "t/2": 300, "t/3": 5, "t/4": 1}
    assert "(t/1 900, t/2 300, t/3 5, 1 more)" in views.io_html([r])  # the partitions lagging most


def test_the_shedding_section_shows_keep_fractions_quality_and_the_lps_utility() -> None:
    assert "no load shedding configured" in views.shedding_html([record(1, {"per_key": [1.0]})])
    r = record(2, {"per_key": [1.0]}, [{"epoch": 2, "step": "*", "kind": "overload", "action": {},
                                        "why": {"expectedUtility": 12.5, "status": "optimal"}, "expected": {}}])
    r["overload"] = {"boundMs": 3000, "expectedMs": 2000, "measuredMs": 3100, "withinBound": False, "lagSeconds": 0.5,
                     "shed": {"per_key": {"keep": [0.75, 0.5], "offered": [60, 40], "kept": [45, 20]}},
                     "quality": {"counts": {"keptFraction": 0.65, "shedFraction": 0.35}},
                     "estimates": {"per_key": {"windows": 12, "aggregates": {
                         "n": {"meanRelError": 0.0412, "maxRelError": 0.25}, "total": {"meanRelError": None,
                                                                                        "maxRelError": None}}}}}
    html = views.shedding_html([r])
    assert "over the bound" in html and "<td>0.750, 0.500</td><td>100</td><td>65</td>" in html
    assert "counts: kept 0.650" in html and "expected utility 12.5 (optimal)" in html
    assert '<td>per_key</td><td>n</td><td>12</td><td>4.12 %</td><td>25.00 %</td>' in html
    assert '<td>total</td><td>12</td><td>-</td><td>-</td>' in html
