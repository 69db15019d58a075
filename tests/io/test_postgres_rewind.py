"""The ``postgres`` sink with ``rewind: true`` against a real PostgreSQL: a replay takes back
exactly what a stretch of published epochs wrote (append: their rows; upsert: every key back to
its row from before them), an undo puts it back exactly, both once however often repeated; the
records it keeps for that stay within the network's history. psycopg reads the tables back."""

from __future__ import annotations

from typing import Any

import pytest

import eddyline.io  # noqa: F401  (registers the sink kinds)
from eddyline.errors import SinkError
from eddyline.io.postgres import PostgresSink
from tests.io.pg import query as _query
from tests.io.pg import run as _run

pytestmark = pytest.mark.spark

ROWS = "id long, name string"
CHANGES = "k string, total long, _diff long"


def _epoch(sink: PostgresSink, rows: list[tuple[Any, ...]], schema: str, epoch: int, spark) -> None:
    sink.stage(spark.createDataFrame(rows, schema), epoch)
    sink.publish(epoch)


def _records(postgres, network: str) -> list[tuple[Any, ...]]:
    """(epoch, retracted_by) of the network's undo records, with their number."""
    return _query(
        postgres,
        "SELECT epoch, retracted_by, count(*) FROM eddyline_undo WHERE network = %s "
        "GROUP BY epoch, retracted_by ORDER BY epoch, retracted_by",
        network,
    )


def test_append_takes_back_a_stretch_of_epochs_and_puts_it_back_exactly(spark, postgres, sinks) -> None:
    table = "SELECT id, name FROM rw_append ORDER BY id, name NULLS FIRST"
    sink = sinks("rw_append", rewind=True)
    assert sink.rewinds
    sink.open("net_ra", "ckpt1", spark.createDataFrame([(1, "a")], ROWS).schema)
    # another network appends equal rows into the same table: as many as it wrote must stay
    other = sinks("rw_append")
    other.open("net_ra_other", "ckpt1", spark.createDataFrame([(1, "a")], ROWS).schema)
    _epoch(other, [(3, "c"), (5, None)], ROWS, 1, spark)
    _epoch(sink, [(1, "a"), (2, "b")], ROWS, 1, spark)
    _epoch(sink, [(3, "c"), (3, "c")], ROWS, 2, spark)  # equal rows in one epoch
    before = _query(postgres, table)
    _epoch(sink, [(4, "d"), (5, None)], ROWS, 3, spark)
    _epoch(sink, [(1, "a"), (3, "c")], ROWS, 4, spark)  # equal to earlier and other rows
    _epoch(sink, [(6, "f")], ROWS, 5, spark)
    full = _query(postgres, table)
    assert len(full) == 11

    # a replay at epoch 6 of epochs 3 on: what epochs 3, 4 and 5 wrote goes, once
    sink.retract([3, 4, 5], at_epoch=6)
    assert _query(postgres, table) == before
    sink.retract([3, 4, 5], at_epoch=6)  # the replaying epoch replayed after a crash
    assert _query(postgres, table) == before
    _epoch(sink, [(7, "g")], ROWS, 6, spark)
    _epoch(sink, [(7, "g")], ROWS, 6, spark)
    replayed = sorted([*before, (7, "g")], key=lambda r: (r[0], r[1] or ""))
    assert _query(postgres, table) == replayed
    assert _records(postgres, "net_ra") == [(1, None, 2), (2, None, 2), (3, 6, 2), (4, 6, 2), (5, 6, 1), (6, None, 1)]

    # undo of the replay at epoch 7 (continuing from epoch 5): the replay's output goes, what it
    # took back comes back, from a new driver too; once
    sink.close()
    again = sinks("rw_append", rewind=True)
    again.open("net_ra", "ckpt1", spark.createDataFrame([(1, "a")], ROWS).schema)
    again.retract([6], at_epoch=7)
    assert _query(postgres, table) == before
    again.restore(6)
    assert _query(postgres, table) == full
    again.retract([6], at_epoch=7)
    again.restore(6)
    assert _query(postgres, table) == full
    assert _records(postgres, "net_ra") == [(1, None, 2), (2, None, 2), (3, None, 2), (4, None, 2), (5, None, 1), (6, 7, 1)]
    # the epochs put back can be taken back again by a later replay
    again.retract([4, 5], at_epoch=8)
    assert sorted(_query(postgres, table)) == sorted([*before, (4, "d"), (5, None)])
    assert _query(postgres, "SELECT id, name FROM rw_append WHERE id = 5") == [(5, None), (5, None)]


def test_upsert_takes_every_key_back_to_its_row_before_the_stretch_and_puts_it_back(
    spark, postgres, sinks
) -> None:
    # a table of the user's, with columns the sink does not write
    _run(
        postgres,
        "CREATE TABLE rw_totals (id bigint GENERATED ALWAYS AS IDENTITY, k text PRIMARY KEY, total bigint, "
        "note text DEFAULT 'user', doubled bigint GENERATED ALWAYS AS (total * 2) STORED)",
    )
    table = "SELECT id, k, total, note, doubled FROM rw_totals ORDER BY k"
    sink = sinks("rw_totals", mode="upsert", key="k", rewind=True)
    sink.open("net_ru", "ckpt1", spark.createDataFrame([("a", 1, 1)], CHANGES).schema)
    # another sink of the network upserts keys of its own into the same table
    other = sinks("rw_totals", name="other", mode="upsert", key="k", rewind=True)
    other.open("net_ru", "ckpt1", spark.createDataFrame([("a", 1, 1)], CHANGES).schema)
    _epoch(sink, [("a", 1, 1), ("b", 2, 1), ("c", 3, 1), ("d", 4, 1)], CHANGES, 1, spark)
    _epoch(other, [("x", 100, 1)], CHANGES, 1, spark)
    _run(postgres, "UPDATE rw_totals SET note = 'edited by hand' WHERE k = 'a'")
    at_1 = _query(postgres, table)
    # a: updated twice, then by an aggregate's old-row-out, new-row-in; b: deleted; e: inserted,
    # then updated; f: inserted, then deleted; c: deleted, then inserted again; d: untouched
    _epoch(sink, [("a", 10, 1), ("b", 0, -1), ("e", 5, 1), ("f", 6, 1), ("c", 0, -1)], CHANGES, 2, spark)
    at_2 = _query(postgres, table)
    _epoch(sink, [("a", 20, 1), ("e", 50, 1), ("f", 0, -1), ("c", 30, 1)], CHANGES, 3, spark)
    _epoch(sink, [("a", 20, -1), ("a", 21, 1), ("g", 7, 1)], CHANGES, 4, spark)
    at_4 = _query(postgres, table)
    assert [(k, total) for _, k, total, _, _ in at_4] == [
        ("a", 21), ("c", 30), ("d", 4), ("e", 50), ("g", 7), ("x", 100)]

    sink.retract([2, 3, 4], at_epoch=5)
    assert _query(postgres, table) == at_1  # the identity, the hand edit and all
    sink.retract([2, 3, 4], at_epoch=5)
    assert _query(postgres, table) == at_1
    _epoch(sink, [("a", 1, -1), ("a", 99, 1), ("d", 0, -1), ("h", 8, 1)], CHANGES, 5, spark)
    assert [(k, total) for _, k, total, _, _ in _query(postgres, table)] == [
        ("a", 99), ("b", 2), ("c", 3), ("h", 8), ("x", 100)]

    # undo: the replay's epoch goes, the stretch it took back comes back exactly, once
    sink.retract([5], at_epoch=6)
    assert _query(postgres, table) == at_1
    sink.restore(5)
    assert _query(postgres, table) == at_4
    sink.restore(5)
    sink.retract([5], at_epoch=6)
    assert _query(postgres, table) == at_4
    # its records are in force again: a later replay from epoch 3 goes back to epoch 2's table
    sink.retract([3, 4], at_epoch=7)
    assert _query(postgres, table) == at_2
    assert _query(postgres, "SELECT k, total FROM rw_totals WHERE k = 'x'") == [("x", 100)]


def test_the_records_stay_for_the_history_and_a_replay_beyond_is_refused(spark, postgres, sinks) -> None:
    schema = spark.createDataFrame([("a", 1, 1)], CHANGES).schema
    sink = sinks("rw_bounded", mode="upsert", key="k", rewind=True)
    sink.history = 3
    sink.open("net_rb", "ckpt1", schema)
    for epoch in range(1, 7):
        _epoch(sink, [("a", epoch, 1), (f"k{epoch}", epoch, 1)], CHANGES, epoch, spark)
    assert [e for e, _, _ in _records(postgres, "net_rb")] == [4, 5, 6]  # 6 - 3 + 1 on
    problem = sink.rewind_problem("net_rb", "ckpt1", range(2, 7), None)
    assert problem == (
        "sink 'out' kept no record of what epoch(s) 2, 3 wrote into rw_bounded, so it cannot take "
        "them back (it keeps records since it has rewind: true, for the last 3 epochs)"
    )
    assert sink.rewind_problem("net_rb", "ckpt1", range(4, 7), None) is None
    # a replay at 7 of epochs 5 and 6: what it took back stays as long as epoch 7 is in the history
    sink.retract([5, 6], at_epoch=7)
    _epoch(sink, [("b", 7, 1)], CHANGES, 7, spark)
    _epoch(sink, [("b", 8, 1)], CHANGES, 8, spark)
    _epoch(sink, [("b", 9, 1)], CHANGES, 9, spark)
    assert _records(postgres, "net_rb") == [(5, 7, 2), (6, 7, 2), (7, None, 1), (8, None, 1), (9, None, 1)]
    assert sink.rewind_problem("net_rb", "ckpt1", range(7, 10), 7) is None
    _epoch(sink, [("b", 10, 1)], CHANGES, 10, spark)
    assert _records(postgres, "net_rb") == [(8, None, 1), (9, None, 1), (10, None, 1)]
    assert sink.rewind_problem("net_rb", "ckpt1", range(8, 11), 7) == (
        "sink 'out' no longer keeps what epoch 7 took back from rw_bounded (it keeps that for the last 3 epochs)"
    )
    # a sink that had no rewind: true when it wrote an epoch cannot take that one back
    plain = sinks("rw_plain", mode="upsert", key="k")
    assert not plain.rewinds
    plain.open("net_rp", "ckpt1", schema)
    _epoch(plain, [("a", 1, 1)], CHANGES, 1, spark)
    with pytest.raises(SinkError, match=r"sink 'out': asked to put back what epoch 2 took back"):
        plain.restore(2)
    later = sinks("rw_plain", mode="upsert", key="k", rewind=True)
    later.open("net_rp", "ckpt1", schema)
    _epoch(later, [("a", 2, 1)], CHANGES, 2, spark)
    assert "what epoch(s) 1 wrote" in (later.rewind_problem("net_rp", "ckpt1", range(1, 3), None) or "")
    assert later.rewind_problem("net_rp", "ckpt1", range(2, 3), None) is None


def test_an_undo_table_of_one_record_per_key_becomes_one_per_key_and_epoch(spark, postgres, sinks) -> None:
    # eddyline_undo as the version before replays made it (tentative epochs only), in a schema of its own
    _run(postgres, "CREATE SCHEMA rw_old")
    _run(
        postgres,
        "CREATE TABLE rw_old.eddyline_undo (network text NOT NULL, checkpoint text NOT NULL, "
        "sink text NOT NULL, epoch bigint NOT NULL, key jsonb, image jsonb, UNIQUE (network, checkpoint, sink, key))",
    )
    schema = spark.createDataFrame([("a", 1, 1)], CHANGES).schema
    sink = sinks("rw_old.t", mode="upsert", key="k", rewind=True)
    sink.open("net_ro", "ckpt1", schema)
    _epoch(sink, [("a", 1, 1)], CHANGES, 1, spark)
    _epoch(sink, [("a", 2, 1)], CHANGES, 2, spark)
    _epoch(sink, [("a", 3, 1)], CHANGES, 3, spark)
    sink.retract([3], at_epoch=4)  # needs epoch 3's own record of key a
    assert _query(postgres, "SELECT k, total FROM rw_old.t") == [("a", 2)]
    # and tentative epochs still keep the first record of a stretch per key there
    tent = sinks("rw_old.tent", name="tent", mode="upsert", key="k")
    tent.open("net_ro", "ckpt1", schema, tentative=True)
    _epoch(tent, [("a", 1, 1)], CHANGES, 1, spark)
    for epoch in (2, 3):
        tent.stage(spark.createDataFrame([("a", 10 * epoch, 1)], CHANGES), epoch)
        tent.publish(epoch, tentative=True)
    assert _query(postgres, "SELECT epoch FROM rw_old.eddyline_undo WHERE sink = 'tent'") == [(2,)]
    tent.retract([2, 3], at_epoch=4)
    assert _query(postgres, "SELECT k, total, tentative FROM rw_old.tent") == [("a", 1, False)]
