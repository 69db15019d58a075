"""Time travel on local Spark (``eddyline replay`` / ``undo``): Nexmark q2's shape (a filter on
the auction, a select) over files; its predicate is changed and epochs 5 on are run again with
it: the sink then holds what a run that changed the predicate at epoch 5 holds; undoing the
replay brings back exactly what it held before, also after a second replay (undone first)."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from eddyline.api.validate import load_spec
from eddyline.errors import EngineError
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.inbox import Inbox

from .helpers import write_bid_files
from .replay_net import q2


def content(out: Path) -> Counter:
    """The rows in force: a sink writing revisions has them as the sum of their weights."""
    files = f"read_parquet('{out}/epoch=*/*.parquet', union_by_name = true)"
    con = duckdb.connect()
    if "_diff" not in [c[0] for c in con.execute(f"DESCRIBE SELECT * FROM {files}").fetchall()]:
        return Counter(con.execute(f"SELECT auction, price FROM {files}").fetchall())
    weighted = con.execute(f"SELECT auction, price, sum(_diff) FROM {files} GROUP BY ALL").fetchall()
    assert all(w >= 0 for *_, w in weighted), weighted
    return Counter({(a, p): w for a, p, w in weighted if w})


@pytest.mark.parametrize("retract", ["move", "revisions"])
def test_replay_with_a_changed_predicate_then_undo(spark, tmp_path: Path, retract: str) -> None:
    write_bid_files(tmp_path / "in", files=8, rows=50)
    old = q2(tmp_path / "in", tmp_path / "out", "auction % 3 = 0")
    old["sinks"][0]["files"]["retract"] = retract
    new = copy.deepcopy(old)
    new["steps"][0]["filter"] = "auction % 2 = 0"
    ckpt = str(tmp_path / "ckpt")
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    before = content(tmp_path / "out")

    # the reference: the same network with the predicate changed at epoch 5, from the start
    ref = q2(tmp_path / "in", tmp_path / "ref", "auction % 3 = 0")
    Engine(load_spec(ref), spark, str(tmp_path / "ref-ckpt")).run(epochs=4)
    Inbox(str(tmp_path / "ref-ckpt")).submit_network({**new, "sinks": ref["sinks"]}, [])
    Engine(load_spec(ref), spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)
    assert content(tmp_path / "ref") != before

    published = {str(p.relative_to(tmp_path)) for p in (tmp_path / "out").glob("epoch=*/*")}
    replay = Inbox(ckpt).submit_command({"replay": 5, "network": new, "reset": []})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert content(tmp_path / "out") == content(tmp_path / "ref")
    if retract == "revisions":  # an append-only changelog: what was published stays
        assert published <= {str(p.relative_to(tmp_path)) for p in (tmp_path / "out").glob("epoch=*/*")}
        assert sorted(p.name for p in (tmp_path / "out").glob("epoch=0000000009/retract-*")) == [
            f"retract-{e:010d}.parquet" for e in (5, 6, 7, 8)]
    ck = Checkpoint(ckpt)
    at = ck.read_plan(9)
    assert (at.base, at.retracts, [a["id"] for a in at.applied]) == (4, [5, 6, 7, 8], [replay])

    # epoch 7 is gone (9 took it back); 9 goes on from 4, and so does a replay from it
    inbox = Inbox(ckpt)
    gone, again, early = inbox.submit_command({"replay": 7}), inbox.submit_command({"replay": 9}), inbox.submit_command({"undo": 9})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert content(tmp_path / "out") == content(tmp_path / "ref")
    assert ck.read_plan(13).base == 4
    done = {d["id"]: d for d in inbox.done()}
    assert done[gone]["reason"] == ("replay: epoch 7 was taken back by epoch 9, which went on from epoch 4; "
                                    "replay from epoch 9 or from an epoch up to 4")
    assert done[again]["outcome"] == "applied"
    assert done[early]["reason"] == ("undo: the replay at epoch 13 came later and is still in force; undo it first "
                                     "(replays are undone in the reverse order they were made)")

    # undone in reverse order: the first replay's content, then what the sink held before both
    last = ck.latest_commit().epoch
    inbox.submit_command({"undo": 13})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert content(tmp_path / "out") == content(tmp_path / "ref")
    assert ck.read_plan(last + 1).base == 12
    inbox.submit_command({"undo": 9})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert content(tmp_path / "out") == before
    last = ck.read_plan(ck.latest_commit().epoch)
    assert last.base == 8 and last.restores == [9] and last.network == ck.read_plan(8).network
    assert [d["outcome"] for d in inbox.done()] == ["applied", "refused", "applied", "refused", "applied", "applied"]


def test_a_replay_that_cannot_be_done_is_refused(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=5, rows=10)
    net = q2(tmp_path / "in", tmp_path / "out", "true")
    net["history"] = 2
    ckpt = str(tmp_path / "ckpt")
    Engine(load_spec(net), spark, ckpt).run(until_idle=True)
    inbox = Inbox(ckpt)
    inbox.submit_command({"replay": 9})
    inbox.submit_command({"undo": 4})
    Engine(load_spec(net), spark, ckpt).run(until_idle=True)
    reasons = [d["reason"] for d in Inbox(ckpt).done()]
    assert reasons[0] == "replay: expected an epoch from 1 to 5, the last committed, got 9"
    assert reasons[1] == "undo: epoch 4 did not replay earlier epochs; there is nothing to undo"
    with pytest.raises(EngineError, match=r"epoch 1 is no longer kept \(the checkpoint keeps the last 2 epochs"):
        Engine(load_spec(net), spark, ckpt)._check_alone({"replay": 2}, 5)


def test_the_cli_queues_a_replay_and_an_undo_and_refuses_a_network_it_cannot_become(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from eddyline.cli import app

    net = q2(tmp_path / "in", tmp_path / "out", "true")
    changed = copy.deepcopy(net)
    changed["name"] = "renamed"
    paths = {}
    for name, raw in (("net", net), ("changed", changed)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(json.dumps(raw))
    ckpt = str(tmp_path / "ckpt")
    runner = CliRunner()
    bad = runner.invoke(app, ["replay", str(paths["net"]), "--checkpoint", ckpt, "--from-epoch", "3", "--with", str(paths["changed"])])
    assert bad.exit_code == 2 and "apply: name: the running network is 'q2'" in bad.output
    assert Inbox(ckpt).pending() == []
    ok = runner.invoke(app, ["replay", str(paths["net"]), "--checkpoint", ckpt, "--from-epoch", "3"])
    assert ok.exit_code == 0 and "from epoch 3" in ok.output
    undo = runner.invoke(app, ["undo", str(paths["net"]), "--checkpoint", ckpt, "--epoch", "7"])
    assert undo.exit_code == 0
    assert [{k: c[k] for k in ("replay", "undo") if k in c} for c in Inbox(ckpt).pending()] == [{"replay": 3}, {"undo": 7}]
