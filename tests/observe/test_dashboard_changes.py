"""The dashboard follows what changes while it is open, without Spark: the graph follows the
network in force (a live apply, then an undo back to the network before, in a running driver and
in a browsed checkpoint); an operator's command that took effect is in Decisions, and its outcome
says what it did, also when it changed nothing; the heat map's axis label is not covered."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from fastapi.testclient import TestClient

from eddyline.api.validate import load_spec
from eddyline.observe.dashboard import views
from eddyline.observe.dashboard.access import Access
from eddyline.observe.dashboard.app import create_app
from eddyline.observe.progress import ProgressReporter
from eddyline.operate import checkpoint_feed, live_feed
from eddyline.runtime.checkpoint import Checkpoint, network_hash
from eddyline.runtime.inbox import Inbox
from tests.observe.helpers import NET, record

#: NET with one more sink, as `eddyline apply` would put in force
WIDER = load_spec({**NET.as_dict(), "sinks": [*NET.as_dict()["sinks"], {"name": "also", "input": "cheap", "memory": {}}]})


def nodes(view: dict) -> set[str]:
    return set(re.findall(r'data-node="([^"]+)"', view["sections"]["graph"]))


def test_a_running_drivers_dashboard_draws_the_network_in_force(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    engine = SimpleNamespace(ckpt=Checkpoint(ckpt), base_spec=NET, inbox=Inbox(ckpt), lease=None, paused=False,
                             settings={})
    reporter = ProgressReporter(live=False)
    client = TestClient(create_app(live_feed(engine, reporter), Access.open_loopback()), base_url="http://127.0.0.1")
    reporter.report(record(1, {"per_key": [1.0, 2.0]}))
    first = client.get("/api/view").json()
    assert "also" not in nodes(first)
    engine.base_spec = WIDER  # the engine switched networks at an epoch boundary; no epoch reported since
    after = client.get("/api/view", params={"since": first["epoch"], "state": first["state"]}).json()
    assert after["epoch"] == first["epoch"] and "also" in nodes(after)  # drawn before the new network's first epoch
    engine.base_spec = NET  # an undo back to the network before
    assert "also" not in nodes(client.get("/api/view", params={"since": after["epoch"], "state": after["state"]}).json())


def test_a_browsed_checkpoint_draws_the_network_it_runs_now(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path / "ckpt"))
    ck.open(NET.fingerprint(), created=ck.store_network(NET.as_dict()))
    client = TestClient(create_app(checkpoint_feed(ck.location), Access.open_loopback()), base_url="http://127.0.0.1")
    assert "also" not in nodes(client.get("/api/view").json())
    ck.record_change(WIDER.fingerprint(), ck.store_network(WIDER.as_dict()), {"epoch": 2})  # as a live apply does
    assert "also" in nodes(client.get("/api/view").json())
    ck.record_change(NET.fingerprint(), network_hash(NET.as_dict()), {"epoch": 5})  # an undo to the one before
    assert "also" not in nodes(client.get("/api/view").json())


def rebalance(command: str, epoch: int) -> dict:
    return {"id": command, "from": "dashboard", "route": {"step": "per_key", "rebalance": True}, "outcome": "applied",
            "epoch": epoch}


def test_an_operators_rebalance_that_moved_nothing_says_so_in_decisions_and_in_its_outcome() -> None:
    quiet = record(3, {"per_key": [50.0, 50.0]}) | {"applied": [{k: v for k, v in rebalance("c1", 3).items()
                                                                 if k in ("id", "from", "route")}]}
    records = [record(2, {"per_key": [50.0, 50.0]}), quiet]
    table = views.decisions_html(records)
    assert "no decisions yet" not in table
    assert 'data-kind="operator" data-command="c1"' in table and "rebalance of per_key" in table
    assert "nothing moved: no move of a key group would even out its lanes&#x27; load" in table
    outcome = views.commands_html([rebalance("c1", 3)], records)
    assert "applied — nothing moved: no move of a key group would even out its lanes&#x27; load" in outcome
    # closed as applied, its epoch not reported yet: the outcome says when it takes effect
    assert "applied, takes effect in epoch 4" in views.commands_html([rebalance("c2", 4)], records)


def test_an_operators_rebalance_that_moved_key_groups_is_its_decision_and_its_outcome_counts_them() -> None:
    move = {"epoch": 3, "step": "per_key", "kind": "balance", "action": {"moves": [[3, 0, 1], [2, 0, 1]]},
            "why": {"reason": "operator", "command": "c1"}, "expected": {"makespanMs": 50.0}}
    records = [record(3, {"per_key": [90.0, 10.0]}, [move]) | {"applied": [{"id": "c1", "from": "dashboard",
                                                                          "route": {"step": "per_key", "rebalance": True}}]}]
    table = views.decisions_html(records)
    assert table.count('class="decision"') == 1 and 'data-kind="balance" data-command="c1"' in table
    assert "applied — moved 2 key groups" in views.commands_html([rebalance("c1", 3)], records)


def test_other_commands_that_took_effect_are_decisions_of_the_operator() -> None:
    records = [record(4, {"per_key": [1.0, 1.0]}) | {"applied": [{"id": "s1", "from": "cli", "set": {"cheap.filter": "value < 9"}},
                                                                 {"id": "n1", "from": "cli", "network": "ab12"}]}]
    table = views.decisions_html(records)
    assert 'data-command="s1"' in table and "cheap.filter = &#x27;value &lt; 9&#x27;" in table
    assert 'data-command="n1"' in table and "network ab12" in table


def test_the_heat_maps_axis_label_fits_its_picture_and_the_routing_strip_is_below_it() -> None:
    records = [record(e, {"per_key": [10.0, 20.0]}) for e in (1, 2, 3)]
    svg = views.heatmap_svg("per_key", records)
    width = int(re.search(r'width="(\d+)"', svg).group(1))
    label = re.search(r'class="dim[^"]*">(epochs [^<]+)<', svg).group(1)
    assert width >= 44 + len(label) * 11 * 0.6  # an SVG clips what it draws beyond its width
    html = views.steps_html(records)
    assert re.search(r'<div class="lanes"><svg class="heatmap".*?</svg></div><div class="keygroups"><svg class="routing"', html)
    chart = views.epochs_svg([record(1, {}) | {"durationMs": {"triggerExecution": 12301.0}}])
    assert int(re.search(r'width="(\d+)"', chart).group(1)) >= len("epochs 1–1") * 11 * 0.6 + 44
