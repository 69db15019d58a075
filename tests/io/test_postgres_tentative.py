"""The ``postgres`` sink's tentative epochs (Delay-Process-Correct) against a real PostgreSQL:
tentative rows are visible and marked, a retraction restores exactly the table the last stable
epoch left, once, and touches nothing of other sinks; psycopg reads the tables back."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import pytest

import eddyline.io  # noqa: F401  (registers the sink kinds)
from eddyline.errors import SinkError
from eddyline.io.postgres import PostgresSink
from tests.io.pg import query as _query
from tests.io.pg import run as _run

pytestmark = pytest.mark.spark

CHANGES = "k string, total long, _diff long"
ROWS = "id long, name string"


def _epoch(sink: PostgresSink, df: Any, epoch: int, tentative: bool = False) -> None:
    sink.stage(df, epoch)
    sink.publish(epoch, tentative=tentative)


def _bookkeeping(postgres, network: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The network's rows in eddyline_epochs (sink, epoch, tentative) and eddyline_undo."""
    epochs = _query(
        postgres,
        "SELECT sink, epoch, tentative FROM eddyline_epochs WHERE network = %s "
        "ORDER BY sink, epoch",
        network,
    )
    undo = _query(
        postgres,
        "SELECT sink, epoch, key, image FROM eddyline_undo WHERE network = %s "
        "ORDER BY sink, epoch, key::text, image::text",
        network,
    )
    return epochs, undo


def test_append_marks_tentative_rows_and_a_retraction_deletes_exactly_them(
    spark, postgres, sinks
) -> None:
    stable = spark.createDataFrame([(1, "a"), (2, "b")], ROWS)
    sink = sinks("tent_append")
    sink.open("net_ta", "ckpt1", stable.schema, tentative=True)
    # another network appends into the same table, tentatively too: its rows must stay
    other = sinks("tent_append")
    other.open("net_ta_other", "ckpt1", stable.schema, tentative=True)
    _epoch(sink, stable, 1)
    _epoch(other, spark.createDataFrame([(2, "b"), (9, "z")], ROWS), 1, tentative=True)
    # the same values as a stable row (2, b) and as the other network's row, and twice in one epoch
    _epoch(sink, spark.createDataFrame([(2, "b"), (3, "c"), (3, "c")], ROWS), 2, tentative=True)
    _epoch(sink, spark.createDataFrame([(4, None)], ROWS), 3, tentative=True)
    table = "SELECT id, name, tentative FROM tent_append ORDER BY id, tentative, name"
    assert _query(postgres, table) == [
        (1, "a", False),
        (2, "b", False),
        (2, "b", True),
        (2, "b", True),
        (3, "c", True),
        (3, "c", True),
        (4, None, True),
        (9, "z", True),
    ]
    assert _query(
        postgres,
        "SELECT column_name, data_type, is_nullable, column_default FROM "
        "information_schema.columns WHERE table_name = 'tent_append' AND column_name = 'tentative'",
    ) == [("tentative", "boolean", "NO", "false")]
    assert _bookkeeping(postgres, "net_ta")[0] == [
        ("out", 1, False),
        ("out", 2, True),
        ("out", 3, True),
    ]

    sink.retract([2, 3], at_epoch=4)
    after = [(1, "a", False), (2, "b", False), (2, "b", True), (9, "z", True)]
    assert _query(postgres, table) == after
    assert _bookkeeping(postgres, "net_ta") == ([("out", 1, False)], [])
    other_books = _bookkeeping(postgres, "net_ta_other")
    assert other_books[0] == [("out", 1, True)] and len(other_books[1]) == 2

    sink.retract([2, 3], at_epoch=4)  # a replay of epoch 4: nothing more
    assert _query(postgres, table) == after
    # the correcting epoch is stable and applied as usual, also after another replay of its retraction
    _epoch(sink, spark.createDataFrame([(3, "c"), (4, "d")], ROWS), 4)
    sink.retract([2, 3], at_epoch=4)
    _epoch(sink, spark.createDataFrame([(3, "c"), (4, "d")], ROWS), 4)
    assert _query(postgres, table) == [
        (1, "a", False),
        (2, "b", False),
        (2, "b", True),
        (3, "c", False),
        (4, "d", False),
        (9, "z", True),
    ]
    assert _bookkeeping(postgres, "net_ta")[0] == [("out", 1, False), ("out", 4, False)]
    # and the other network's tentative epoch is still its own to retract
    other.retract([1], at_epoch=2)
    assert _query(postgres, table) == [
        (1, "a", False),
        (2, "b", False),
        (3, "c", False),
        (4, "d", False),
    ]
    assert _bookkeeping(postgres, "net_ta_other") == ([], [])


def test_upsert_retraction_brings_every_key_back_to_its_stable_row(spark, postgres, sinks) -> None:
    sink = sinks("tent_totals", mode="upsert", key="k")
    first = spark.createDataFrame(
        [("a", 1, 1), ("b", 2, 1), ("c", 3, 1), ("d", 4, 1)], CHANGES
    )
    sink.open("net_tu", "ckpt1", first.schema, tentative=True)
    # another sink of the network upserts keys of its own into the same table, tentatively
    other = sinks("tent_totals", name="other", mode="upsert", key="k")
    other.open("net_tu", "ckpt1", first.schema, tentative=True)
    _epoch(sink, first, 1)
    stable = [("a", 1, False), ("b", 2, False), ("c", 3, False), ("d", 4, False)]
    table = "SELECT k, total, tentative FROM tent_totals ORDER BY k"
    assert _query(postgres, table) == stable
    _epoch(other, spark.createDataFrame([("x", 100, 1)], CHANGES), 1, tentative=True)
    # a: updated twice; b: deleted; e: inserted, then updated; f: inserted, then deleted;
    # c: deleted, then inserted again; d: untouched
    _epoch(
        sink,
        spark.createDataFrame(
            [
                ("a", 10, 1),
                ("b", 0, -1),
                ("e", 5, 1),
                ("f", 6, 1),
                ("c", 0, -1),
            ],
            CHANGES,
        ),
        2,
        tentative=True,
    )
    _epoch(
        sink,
        spark.createDataFrame(
            [("a", 20, 1), ("e", 50, 1), ("f", 0, -1), ("c", 30, 1)],
            CHANGES,
        ),
        3,
        tentative=True,
    )
    assert _query(postgres, table) == [
        ("a", 20, True),
        ("c", 30, True),
        ("d", 4, False),
        ("e", 50, True),
        ("x", 100, True),
    ]
    # one before-image per key, from the first tentative epoch that touched it
    undo = _bookkeeping(postgres, "net_tu")[1]
    assert [
        (s, e, k["k"], None if i is None else (i["total"], i["tentative"])) for s, e, k, i in undo
    ] == [
        ("other", 1, "x", None),
        ("out", 2, "a", (1, False)),
        ("out", 2, "b", (2, False)),
        ("out", 2, "c", (3, False)),
        ("out", 2, "e", None),
        ("out", 2, "f", None),
    ]

    sink.retract([2, 3], at_epoch=4)
    assert _query(postgres, table) == [*stable, ("x", 100, True)]
    epochs, undo = _bookkeeping(postgres, "net_tu")
    assert epochs == [("other", 1, True), ("out", 1, False)] and [
        (s, e) for s, e, _, _ in undo
    ] == [("other", 1)]
    sink.retract([2, 3], at_epoch=4)  # a replay: nothing more
    assert _query(postgres, table) == [*stable, ("x", 100, True)]
    assert _bookkeeping(postgres, "net_tu") == (epochs, undo)

    # the correcting epoch is applied as usual (its rows stable), and a later stretch starts afresh
    _epoch(sink, spark.createDataFrame([("a", 7, 1), ("d", 0, -1)], CHANGES), 4)
    after = [("a", 7, False), ("b", 2, False), ("c", 3, False), ("x", 100, True)]
    assert _query(postgres, table) == after
    _epoch(
        sink,
        spark.createDataFrame([("a", 8, 1), ("b", 0, -1)], CHANGES),
        5,
        tentative=True,
    )
    sink.retract([5], at_epoch=6)
    assert _query(postgres, table) == after
    other.retract([1], at_epoch=2)
    assert _query(postgres, table) == after[:3]


def test_before_images_restore_every_column_and_type_exactly(spark, postgres, sinks) -> None:
    # a table of the user's: columns the sink does not write (one generated, one an identity)
    # come back as they were, and so does every value through JSON, nulls included
    _run(
        postgres,
        "CREATE TABLE tent_typed (id bigint GENERATED ALWAYS AS IDENTITY, k text PRIMARY KEY, "
        "d double precision, f real, ts timestamptz, ntz timestamp, dt date, n numeric(10,2), "
        "bin bytea, b boolean, note text DEFAULT 'user', doubled double precision GENERATED ALWAYS AS (d * 2) "
        "STORED, tentative boolean NOT NULL DEFAULT false)",
    )
    schema = (
        "k string, d double, f float, ts timestamp, ntz timestamp_ntz, dt date, n decimal(10,2), "
        "bin binary, b boolean"
    )
    ts = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    full = (
        "full",
        0.1 + 0.2,
        1e-40,
        ts,
        datetime(2024, 1, 2, 3, 4, 5),
        date(2024, 2, 29),
        Decimal("12345678.90"),
        b"\x00\xff%",
        True,
    )
    odd = ("odd", float("nan"), float("inf"), None, None, None, None, None, None)
    sink = sinks("tent_typed", mode="upsert", key="k")
    df = spark.createDataFrame([full, odd], schema)
    sink.open("net_typed", "ckpt1", df.schema, tentative=True)
    _epoch(sink, df, 1)
    _run(postgres, "UPDATE tent_typed SET note = 'edited by hand' WHERE k = 'full'")
    columns = "SELECT id, k, d, f, ts, ntz, dt, n, bin, b, note, doubled, tentative FROM tent_typed ORDER BY k"
    before = _query(postgres, columns)
    assert (
        before[0][1:4] == ("full", 0.1 + 0.2, pytest.approx(1e-40)) and before[1][2] != before[1][2]
    )
    changed = ("full", 1.0, 2.0, None, None, None, Decimal("1.00"), b"", False)
    _epoch(
        sink, spark.createDataFrame([changed, (*odd[:1], 3.0, *odd[2:])], schema), 2, tentative=True
    )
    assert [r[2] for r in _query(postgres, columns)] == [1.0, 3.0]
    sink.retract([2], at_epoch=3)
    after = _query(postgres, columns)
    assert repr(after) == repr(before)  # NaN too (NaN != NaN, its repr is equal)


def test_values_survive_drivers_whose_sessions_print_them_differently(
    spark, postgres, sinks
) -> None:
    # the driver that writes the tentative epochs and the one that retracts them (after a
    # restart) have other session settings: time zone, float digits, bytea format
    odd = (
        postgres.url
        + ("&" if "?" in postgres.url else "?")
        + "options="
        + quote("-c TimeZone=Asia/Kolkata -c extra_float_digits=0 -c bytea_output=escape")
    )
    schema = "k string, d double, ts timestamp, n decimal(10,2), bin binary"
    ts = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    rows = [
        ("x", 0.1 + 0.2, ts, Decimal("1.50"), b"\x00\xff"),
        ("y", float("nan"), None, None, None),
    ]
    df = spark.createDataFrame(rows, schema)
    appended = sinks("tent_sessions_append", url=odd)
    appended.open("net_sessions", "ckpt1", df.schema, tentative=True)
    _epoch(appended, df, 1, tentative=True)
    assert _query(postgres, "SELECT count(*) FROM tent_sessions_append WHERE tentative") == [(2,)]
    upserted = sinks("tent_sessions_upsert", name="totals", mode="upsert", key="k")
    upserted.open("net_sessions", "ckpt1", df.schema, tentative=True)
    _epoch(upserted, df, 1)
    odd_upserted = sinks("tent_sessions_upsert", name="totals", url=odd, mode="upsert", key="k")
    odd_upserted.open("net_sessions", "ckpt1", df.schema, tentative=True)
    _epoch(
        odd_upserted,
        spark.createDataFrame([("x", 1.0, None, None, None)], schema),
        2,
        tentative=True,
    )

    restarted = sinks("tent_sessions_append")
    restarted.open("net_sessions", "ckpt1", df.schema, tentative=True)
    restarted.retract([1], at_epoch=2)
    assert _query(postgres, "SELECT count(*) FROM tent_sessions_append") == [(0,)]
    upserted.retract([2], at_epoch=3)
    got = _query(
        postgres, "SELECT k, d, ts, n, bin, tentative FROM tent_sessions_upsert ORDER BY k"
    )
    assert got[0] == ("x", 0.1 + 0.2, ts, Decimal("1.50"), b"\x00\xff", False)


def test_the_tentative_column_is_asked_for_at_open_and_misuse_is_refused(
    spark, postgres, sinks
) -> None:
    df = spark.createDataFrame([(1, "a")], ROWS)
    _run(postgres, "CREATE TABLE tent_plain (id bigint, name text)")
    with pytest.raises(
        SinkError,
        match=r"sink 'out': table tent_plain does not fit its input: column "
        r"'tentative' is missing, which marks the rows of tentative epochs",
    ):
        sinks("tent_plain").open("net_tm", "ckpt1", df.schema, tentative=True)
    _run(postgres, "CREATE TABLE tent_wrong (id bigint, name text, tentative integer)")
    with pytest.raises(SinkError, match=r"column 'tentative': expected boolean .* found integer"):
        sinks("tent_wrong").open("net_tm", "ckpt1", df.schema, tentative=True)
    clash = spark.createDataFrame([(1, True)], "id long, tentative boolean")
    with pytest.raises(SinkError, match=r"sink 'out': its input has a column 'tentative'"):
        sinks("tent_clash").open("net_tm", "ckpt1", clash.schema, tentative=True)
    assert _query(postgres, "SELECT count(*) FROM tent_plain") == [(0,)]

    # without tentative: the table is left as it is, and tentative epochs or retractions refused
    plain = sinks("tent_plain")
    plain.open("net_tm", "ckpt1", df.schema)
    plain.stage(df, 1)
    with pytest.raises(
        SinkError, match=r"sink 'out': epoch 1 is tentative, but the sink was opened without"
    ):
        plain.publish(1, tentative=True)
    with pytest.raises(SinkError, match=r"sink 'out': asked to retract epochs \[1\]"):
        plain.retract([1], at_epoch=2)
    plain.publish(1)
    assert _query(postgres, "SELECT * FROM tent_plain") == [(1, "a")]
    # which also fits a network with max_delay once the column is there
    _run(postgres, "ALTER TABLE tent_plain ADD COLUMN tentative boolean NOT NULL DEFAULT false")
    sinks("tent_plain").open("net_tm", "ckpt1", df.schema, tentative=True)


def test_a_replay_keeps_the_kind_of_epoch_and_a_stretch_goes_back_whole(
    spark, postgres, sinks
) -> None:
    df = spark.createDataFrame([(1, "a")], ROWS)
    sink = sinks("tent_strict")
    sink.open("net_ts", "ckpt1", df.schema, tentative=True)
    _epoch(sink, df, 1, tentative=True)
    _epoch(sink, df, 1, tentative=True)  # a replay: written once
    with pytest.raises(SinkError, match=r"epoch 1 was published tentative and not retracted"):
        _epoch(sink, df, 1)
    _epoch(sink, df, 2, tentative=True)
    with pytest.raises(
        SinkError,
        match=r"retracts tentative epochs \[2\], but epochs \[1\] were "
        r"published tentative too.*nothing was retracted",
    ):
        sink.retract([2], at_epoch=3)
    assert _query(postgres, "SELECT id, tentative FROM tent_strict") == [(1, True), (1, True)]
    sink.retract([1, 2, 7], at_epoch=3)  # epochs that published nothing are passed over
    assert _query(postgres, "SELECT count(*) FROM tent_strict") == [(0,)]
    _epoch(sink, df, 3)
    with pytest.raises(
        SinkError, match=r"epoch 3 was published stable; it cannot be published again as tentative"
    ):
        _epoch(sink, df, 3, tentative=True)
    # a new driver (a restart) retracts what the last one published: the records are in the database
    _epoch(sink, df, 4, tentative=True)
    sink.close()
    again = sinks("tent_strict")
    again.open("net_ts", "ckpt1", df.schema, tentative=True)
    again.retract([4], at_epoch=5)
    assert _query(postgres, "SELECT id, tentative FROM tent_strict") == [(1, False)]


def test_an_old_epochs_table_gets_the_mark_and_other_schemas_are_apart(
    spark, postgres, sinks
) -> None:
    # eddyline_epochs as a version before tentative epochs made it, in a schema of its own
    _run(postgres, "CREATE SCHEMA tent_old")
    _run(
        postgres,
        "CREATE TABLE tent_old.eddyline_epochs (network text, checkpoint text, sink text, "
        "epoch bigint, committed_at timestamptz DEFAULT now(), PRIMARY KEY (network, checkpoint, sink, epoch))",
    )
    _run(
        postgres,
        "INSERT INTO tent_old.eddyline_epochs (network, checkpoint, sink, epoch) VALUES ('n', 'c', 's', 1)",
    )
    df = spark.createDataFrame([("a", 1, 1)], CHANGES)
    plain = sinks("tent_old.t", mode="upsert", key="k")
    plain.open("net_old", "ckpt1", df.schema)  # no max_delay: the old table is left alone
    assert _query(
        postgres,
        "SELECT count(*) FROM pg_attribute WHERE attrelid = "
        "'tent_old.eddyline_epochs'::regclass AND attname = 'tentative'",
    ) == [(0,)]
    _epoch(plain, df, 1)
    sink = sinks("tent_old.t2", name="tent", mode="upsert", key="k")
    sink.open("net_old", "ckpt1", df.schema, tentative=True)
    _epoch(sink, df, 1, tentative=True)
    books = "SELECT sink, epoch, tentative FROM tent_old.eddyline_epochs ORDER BY sink, epoch"
    assert _query(postgres, books) == [("out", 1, False), ("s", 1, False), ("tent", 1, True)]
    assert _query(postgres, "SELECT count(*) FROM tent_old.eddyline_undo") == [(1,)]
    sink.retract([1], at_epoch=2)
    assert _query(postgres, "SELECT k, total FROM tent_old.t2") == []
    assert _query(postgres, "SELECT k, total FROM tent_old.t") == [("a", 1)]
    assert _query(postgres, books) == [("out", 1, False), ("s", 1, False)]
