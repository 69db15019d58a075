"""The operator's commands without Spark: `eddyline control route / pause / resume` check a call
against the network the checkpoint runs before queueing it; `eddyline status` and
`eddyline control status` read the checkpoint alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from eddyline.api.validate import load_spec
from eddyline.cli import app
from eddyline.runtime.checkpoint import Checkpoint, network_hash
from eddyline.runtime.inbox import Inbox

NET = load_spec({
    "name": "shop", "key_groups": 8, "lanes": 2,
    "sources": [{"name": "bids", "generator": {}}],
    "steps": [
        {"name": "cheap", "input": "bids", "filter": "value < 500"},
        {"name": "per_key", "input": "cheap", "aggregate": {"key": "key", "aggregates": {"n": "count(*)"}}},
    ],
    "sinks": [{"name": "counts", "input": "per_key", "memory": {}}],
})


@pytest.fixture
def ckpt(tmp_path: Path) -> str:
    location = str(tmp_path / "ckpt")
    ck = Checkpoint(location)
    ck.open(NET.fingerprint(), created=network_hash(NET.as_dict()))
    ck.store_network(NET.as_dict())
    return location


def run(*args: str):  # noqa: ANN201
    return CliRunner().invoke(app, list(args))


def test_routing_calls_are_checked_then_queued(ckpt: str) -> None:
    refused = {
        ("per_key", "--rebalance", "--move", "1:0"): "exactly one of",
        ("cheap", "--rebalance"): "'cheap' is not a stateful step",
        ("per_key", "--lanes", "1"): "no control.scale",
        ("per_key", "--move", "one:0"): "KEY_GROUP:LANE",
    }
    for args, why in refused.items():
        r = run("control", "route", "--checkpoint", ckpt, *args)
        assert r.exit_code == 2 and why in r.output, (args, r.output)
    assert Inbox(ckpt).pending() == []
    assert run("control", "route", "--checkpoint", ckpt, "per_key", "--move", "3:1", "--move", "4:0").exit_code == 0
    assert run("control", "route", "--checkpoint", ckpt, "per_key", "--rebalance").exit_code == 0
    assert run("control", "pause", "--checkpoint", ckpt).exit_code == 0
    assert [c.get("route") or ("pause" in c and "pause") for c in Inbox(ckpt).pending()] == [
        {"step": "per_key", "move": {"3": 1, "4": 0}}, {"step": "per_key", "rebalance": True}, "pause"]
    listed = run("control", "status", "--checkpoint", ckpt).output
    assert "move key groups {'3': 1, '4': 0} of per_key  waiting" in listed and "pause  waiting" in listed


def test_status_of_a_checkpoint_without_epochs(ckpt: str, tmp_path: Path) -> None:
    r = run("status", ckpt)
    assert r.exit_code == 0 and "shop" in r.output and "last committed epoch 0" in r.output
    assert "no driver has held its lease" in r.output and "source bids: offset 0, lag -" in r.output
    Inbox(ckpt).set_paused({"id": "x", "since": 0})
    assert "paused" in run("status", ckpt).output
    missing = run("status", str(tmp_path / "nowhere"))
    assert missing.exit_code == 3 and "no run has started there" in missing.output


def test_browsing_beyond_loopback_without_a_token_is_refused(ckpt: str, tmp_path: Path) -> None:
    r = run("ui", ckpt, "--host", "0.0.0.0", "--port", "0", "--no-token")
    assert r.exit_code == 2 and "--host 0.0.0.0" in r.output and "--no-token is only allowed on 127.0.0.1" in r.output
    r = run("ui", str(tmp_path / "nowhere"), "--port", "0")
    assert r.exit_code == 3 and "no run has started there" in r.output


def test_status_gives_the_dead_letters_kept_and_where_they_are(ckpt: str) -> None:
    ck = Checkpoint(ckpt)
    base = {"numInputRows": 10, "durationMs": {"triggerExecution": 5.0}, "lateRows": 0}
    for epoch, dead in ((1, 4), (2, 0), (3, 1)):
        ck.write_progress(epoch, {**base, "batchId": epoch, "deadLetters": dead})
    r = run("status", ckpt)
    assert r.exit_code == 0, r.output
    assert f"dead letters: 5 over the epochs whose progress is kept, each with its reason in {ckpt}/dead-letters" in r.output
