"""Time travel into PostgreSQL on local Spark: the shape of test_replay's network (a filter on the
auction, a select) appended into one table, and a keyed aggregate of the filtered bids upserted
into another, both with ``rewind: true``. Its predicate is changed and the epochs from 3 on are
run again with it: the tables then hold what a run that changed the predicate at epoch 4 holds;
undoing the replay brings back exactly what they held before."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eddyline.api.validate import load_spec
from eddyline.errors import EngineError
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.inbox import Inbox

from .helpers import write_bid_files
from .replay_net import q2


def network(src: Path, url: str, tables: str, predicate: str) -> dict[str, Any]:
    net = q2(src, src.parent / "unused", predicate)
    net["steps"].append({"name": "totals", "input": "picked",
                         "aggregate": {"key": "auction", "aggregates": {"n": "count(*)", "total": "sum(price)"}}})
    net["sinks"] = [
        {"name": "rows", "input": "q2", "postgres": {"url": url, "table": f"{tables}_rows", "rewind": True}},
        {"name": "sums", "input": "totals",
         "postgres": {"url": url, "table": f"{tables}_sums", "mode": "upsert", "key": "auction", "rewind": True}},
    ]
    return net


def content(url: str, tables: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return (conn.execute(f"SELECT auction, price FROM {tables}_rows ORDER BY auction, price").fetchall(),
                conn.execute(f"SELECT auction, n, total FROM {tables}_sums ORDER BY auction").fetchall())


def test_replay_into_postgres_with_a_changed_predicate_then_undo(spark, postgres, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=5, rows=20)
    old = network(tmp_path / "in", postgres.url, "rp", "auction % 3 = 0")
    new = copy.deepcopy(old)
    new["steps"][0]["filter"] = "auction % 2 = 0"
    ckpt = str(tmp_path / "ckpt")
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    before = content(postgres.url, "rp")
    assert all(before)

    # the reference: the same network with the predicate changed at epoch 3, from the start
    ref = network(tmp_path / "in", postgres.url, "rp_ref", "auction % 3 = 0")
    Engine(load_spec(ref), spark, str(tmp_path / "ref-ckpt")).run(epochs=2)
    Inbox(str(tmp_path / "ref-ckpt")).submit_network({**new, "sinks": ref["sinks"]}, [])
    Engine(load_spec(ref), spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)
    assert content(postgres.url, "rp_ref") != before

    ck = Checkpoint(ckpt)
    at = ck.latest_commit().epoch + 1
    Inbox(ckpt).submit_command({"replay": 3, "network": new, "reset": []})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert content(postgres.url, "rp") == content(postgres.url, "rp_ref")
    assert ck.read_plan(at).retracts == list(range(3, at))

    undo = ck.latest_commit().epoch + 1
    Inbox(ckpt).submit_command({"undo": at})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert content(postgres.url, "rp") == before
    assert [d["outcome"] for d in Inbox(ckpt).done()] == ["applied", "applied"]
    assert (ck.read_plan(undo).retracts, ck.read_plan(undo).restores) == (list(range(at, undo)), [at])


def test_a_replay_the_postgres_sinks_cannot_do_is_refused(spark, postgres, tmp_path: Path) -> None:
    net = network(tmp_path / "in", postgres.url, "rp_no", "true")
    net["sinks"][1]["postgres"]["rewind"] = False
    with pytest.raises(EngineError, match=r"replay: sink\(s\) sums cannot take published epochs back and put them "
                                          r"back \(files, memory, discard and nats sinks can, and postgres sinks with rewind: true"):
        Engine(load_spec(net), spark, str(tmp_path / "ckpt"))._check_alone({"replay": 2}, 3)
    # epoch 2 was written by a driver without rewind: true (the sink has no records of it)
    net["sinks"][1]["postgres"]["rewind"] = True
    engine = Engine(load_spec(net), spark, str(tmp_path / "ckpt"))
    engine.executor.checkpoint_id = "ck"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS eddyline_epochs (network text, checkpoint text, sink text, "
                     "epoch bigint, committed_at timestamptz DEFAULT now(), tentative boolean NOT NULL DEFAULT false, "
                     "PRIMARY KEY (network, checkpoint, sink, epoch))")  # (as the sink makes it)
        conn.execute("INSERT INTO eddyline_epochs (network, checkpoint, sink, epoch) VALUES ('q2', 'ck', 'sums', 2)")
    with pytest.raises(EngineError, match=r"replay: sink 'sums' kept no record of what epoch\(s\) 2 wrote into rp_no_sums"):
        engine._check_alone({"replay": 1}, 3)
