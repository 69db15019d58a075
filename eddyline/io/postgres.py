"""The ``postgres`` sink: each epoch's rows land in a PostgreSQL table exactly once.

``mode: append`` copies every row in. ``mode: upsert`` applies a changelog by ``key``: the
``_op`` column an ``aggregate`` emits says per row whether it is an ``insert``/``update`` (written
with ``INSERT ... ON CONFLICT (key) DO UPDATE``) or a ``delete`` (the row with that key goes);
``_op`` itself is never a table column.

Exactly once rests on one transaction per epoch. Besides the rows, that transaction inserts the
row (network, checkpoint, sink, epoch) into ``eddyline_epochs``, a small bookkeeping table beside the target
table; both become visible together or not at all. The engine commits the epoch in its own
checkpoint only after :meth:`PostgresSink.publish` returned, so a crash in between makes it replay
the epoch: the replay's transaction finds the epoch's row already there and writes nothing. The
same argument makes retries safe when the connection breaks during the commit and the sink cannot
tell whether the commit arrived: either the epoch's row is there (nothing more to do) or nothing
of that attempt is. The epoch's row is inserted first (``ON CONFLICT DO NOTHING``), so a second
writer of the same epoch blocks on the first one's row until it commits and then sees it: there is
no window in which both write.

The sink collects each epoch's rows in the driver (:meth:`PostgresSink.stage`) and writes them
from there: what goes into a database table is meant to be small (aggregates, alerts, top lists),
not a stream of raw events; those belong in a ``files`` sink.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from eddyline.api.registry import SINKS
from eddyline.api.units import Columns, Duration, Model, names
from eddyline.columns import OP
from eddyline.errors import SinkError
from eddyline.io.retry import Health, with_retry
from eddyline.io.sinks import Sink, SinkKind

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from eddyline.api.sinks import SinkSpec

T = TypeVar("T")

_TABLE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$"
EPOCHS = "eddyline_epochs"
_STAGED = "eddyline_staged"
_UPSERT_OPS = ("insert", "update")
_DELETE = "delete"


class Postgres(Model):
    """Write into a PostgreSQL table, each epoch exactly once: ``append`` copies every row in,
    ``upsert`` applies the input's changes (``_op``) by ``key``. ``table`` is read as SQL reads
    an unquoted name (``Sales.Totals`` is ``sales.totals``); columns keep their input's names."""

    url: str = Field(min_length=1)  # a libpq URI or key=value string
    table: str = Field(pattern=_TABLE)
    mode: Literal["append", "upsert"] = "append"
    key: Columns | None = None
    connect_timeout: Duration = Field(default=10_000, gt=0)
    #: how long publish retries a lost connection, with back-off, before it fails
    retry_for: Duration = Field(default=60_000, ge=0)


# Spark type name -> (the type as PostgreSQL's format_type() prints it, the name COPY's binary
# format knows it by). The first is also valid DDL, so one spelling serves both purposes.
_TYPES: dict[str, tuple[str, str]] = {
    "LongType": ("bigint", "int8"),
    "IntegerType": ("integer", "int4"),
    "ShortType": ("smallint", "int2"),
    "ByteType": ("smallint", "int2"),
    "DoubleType": ("double precision", "float8"),
    "FloatType": ("real", "float4"),
    "StringType": ("text", "text"),
    "BooleanType": ("boolean", "bool"),
    "TimestampType": ("timestamp with time zone", "timestamptz"),
    "TimestampNTZType": ("timestamp without time zone", "timestamp"),
    "DateType": ("date", "date"),
    "BinaryType": ("bytea", "bytea"),
}


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # as format_type() prints it
    copy_type: str


@dataclass(frozen=True)
class Layout:
    """What the sink writes: the table's columns (the input's, without ``_op``) and the key."""

    columns: tuple[Column, ...]
    key: tuple[str, ...]
    changelog: bool  # the input has an _op column

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:  # an unparsable url may hold anything: show none of it
        return "<unparsable connection string>"
    user = f"{info['user']}@" if info.get("user") else ""
    host = info.get("host") or info.get("hostaddr") or "localhost"
    return f"postgresql://{user}{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


def column_of(field: StructField, sink: str) -> Column:
    from pyspark.sql.types import DecimalType

    t = field.dataType
    if isinstance(t, DecimalType):
        return Column(field.name, f"numeric({t.precision},{t.scale})", "numeric")
    known = _TYPES.get(type(t).__name__)
    if known is None:
        raise SinkError(
            f"sink '{sink}': column {field.name!r} has type {t.simpleString()}, which the postgres "
            "sink cannot write; cast it to a number, string, boolean, date, timestamp or binary"
        )
    return Column(field.name, *known)


def layout_of(schema: StructType, params: Postgres, sink: str) -> Layout:
    key = names(params.key)
    present = set(schema.fieldNames())
    changelog = OP in present
    if changelog and params.mode == "append":
        raise SinkError(
            f"sink '{sink}': its input is a changelog (column {OP}: insert/update/delete per "
            "key); appending it would add a row per change. Use mode: upsert with key: <the "
            "input's key column(s)>"
        )
    for k in key:
        if k not in present:
            raise SinkError(
                f"sink '{sink}': key column {k!r} is not in its input (columns: "
                f"{', '.join(f for f in schema.fieldNames() if f != OP)})"
            )
    columns = tuple(column_of(f, sink) for f in schema.fields if f.name != OP)
    return Layout(columns, key, changelog)


def last_per_key(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """One row per key: the last one in input order, as if the rows were applied one after
    another. An aggregate's changelog has each key at most once per epoch already; this keeps
    ``INSERT ... ON CONFLICT`` (which refuses to touch a row twice) safe for any other input."""
    seq = "__eddyline_seq"
    order = pa.array(range(table.num_rows), pa.int64())
    numbered = table.select(list(key)).append_column(seq, order)
    last = numbered.group_by(list(key), use_threads=False).aggregate([(seq, "max")])
    if last.num_rows == table.num_rows:
        return table
    keep = last.column(f"{seq}_max")
    return table.take(keep.take(pc.sort_indices(keep)))  # in input order


class PostgresSink(Sink):
    counts_itself = True

    def __init__(self, spec: SinkSpec):
        super().__init__(spec)
        self.params: Postgres = spec.params
        self.url = self.params.url
        self.network = ""
        self.checkpoint = ""  # a fresh start on a new checkpoint counts epochs from 1 again
        self.layout: Layout | None = None
        self.health = Health()
        self._conn: psycopg.Connection[Any] | None = None

    def status(self) -> dict[str, Any]:
        return self.health.to_json()

    @property
    def server(self) -> str:
        return redact(self.url)

    def open(self, network: str, checkpoint: str, schema: StructType) -> None:
        self.network, self.checkpoint = network, checkpoint
        self.layout = layout_of(schema, self.params, self.name)
        self._run(self._prepare)

    def stage(self, df: DataFrame, epoch: int) -> None:
        self.collected[epoch] = df.toArrow()

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None) -> None:
        staged = self.collected.get(epoch)
        if staged is None:
            return
        if staged.num_rows:  # an empty epoch has nothing that could be written twice
            values = self._values(staged)
            self._run(lambda conn: self._write(conn, epoch, values))
        del self.collected[epoch]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the database ------------------------------------------------------------------------

    def _run(self, action: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``action(connection)``; a lost connection is made again and the action retried with
        back-off for up to ``retry_for``. Any other database error fails at once."""
        import psycopg

        def attempt() -> T:
            conn = self._connection()
            try:
                return action(conn)
            except psycopg.OperationalError:
                self.close()  # whatever state it is in, it is of no further use
                raise
            except psycopg.Error as e:
                raise SinkError(
                    f"sink '{self.name}': table {self.params.table} at {self.server}: {e}"
                ) from e

        return with_retry(
            attempt, retryable=(psycopg.OperationalError,), bound_s=self.params.retry_for / 1000,
            health=self.health, give_up=self._give_up,
        )

    def _give_up(self, error: Exception, waited_s: float) -> SinkError:
        return SinkError(
            f"sink '{self.name}': PostgreSQL at {self.server} unreachable, gave up after "
            f"{waited_s:.1f}s of retries: {error}"
        )

    def _connection(self) -> psycopg.Connection[Any]:
        import psycopg

        if self._conn is None or self._conn.closed:
            # libpq counts whole seconds (and treats 1 as 2)
            timeout = max(1, round(self.params.connect_timeout / 1000))
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=timeout)
        return self._conn

    def _target(self) -> sql.Identifier:
        from psycopg import sql

        # validated as an SQL name: lower-cased, it is what PostgreSQL makes of it unquoted
        return sql.Identifier(*self.params.table.lower().split("."))

    def _epochs(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(*self.params.table.lower().split(".")[:-1], EPOCHS)

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        from psycopg import sql

        assert self.layout is not None
        with conn.transaction():
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (network text, checkpoint text, sink text, epoch bigint, "
                "committed_at timestamptz DEFAULT now(), PRIMARY KEY (network, checkpoint, sink, epoch))"
            ).format(self._epochs()))
            name = self.params.table.lower()
            oid = conn.execute("SELECT to_regclass(%s)::oid", (name,)).fetchone()
            if oid is None or oid[0] is None:
                conn.execute(self._create_table())
                return
            self._check_columns(conn, oid[0])
            if self.params.mode == "upsert":
                self._check_unique(conn, oid[0])

    def _create_table(self) -> sql.Composed:
        from psycopg import sql

        assert self.layout is not None
        parts = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type))
                 for c in self.layout.columns]
        if self.layout.key:
            parts.append(sql.SQL("PRIMARY KEY ({})").format(_idents(self.layout.key)))
        return sql.SQL("CREATE TABLE {} ({})").format(self._target(), sql.SQL(", ").join(parts))

    def _check_columns(self, conn: psycopg.Connection[Any], oid: int) -> None:
        assert self.layout is not None
        found = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull,"
            " atthasdef OR attidentity <> '' OR attgenerated <> ''"
            " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
            (oid,),
        ).fetchall()
        problems = column_problems(self.layout, {r[0]: (r[1], r[2], r[3]) for r in found})
        if problems:
            raise SinkError(
                f"sink '{self.name}': table {self.params.table} does not fit its input: "
                + "; ".join(problems)
            )

    def _check_unique(self, conn: psycopg.Connection[Any], oid: int) -> None:
        assert self.layout is not None
        # ON CONFLICT (key) needs a unique index on exactly the key columns, not partial
        uniques = conn.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL"
            " AND i.indexprs IS NULL GROUP BY i.indexrelid",
            (oid,),
        ).fetchall()
        if not any(sorted(u[0]) == sorted(self.layout.key) for u in uniques):
            key = ", ".join(self.layout.key)
            raise SinkError(
                f"sink '{self.name}': table {self.params.table} has no primary key or unique "
                f"constraint on exactly ({key}), which upsert needs; add one "
                f"(ALTER TABLE {self.params.table} ADD PRIMARY KEY ({key}))"
            )

    # -- one epoch ---------------------------------------------------------------------------

    def _values(self, staged: pa.Table) -> list[list[Any]]:
        """The epoch's columns as Python lists, in the layout's order (``_op`` last in upsert
        mode), made once so that a retry sends the same."""
        assert self.layout is not None
        if self.params.mode == "append":
            return [staged.column(n).to_pylist() for n in self.layout.names]
        if not self.layout.changelog:
            staged = staged.append_column(OP, pa.array(["insert"] * staged.num_rows, pa.string()))
        self._check_ops(staged.column(OP))
        staged = last_per_key(staged, self.layout.key)
        return [staged.column(n).to_pylist() for n in [*self.layout.names, OP]]

    def _check_ops(self, ops: pa.ChunkedArray) -> None:
        unknown = set(pc.unique(ops).to_pylist()) - {*_UPSERT_OPS, _DELETE}
        if unknown:
            raise SinkError(
                f"sink '{self.name}': column {OP} has {sorted(unknown, key=str)}; expected "
                f"{', '.join([*_UPSERT_OPS, _DELETE])}"
            )

    def _write(self, conn: psycopg.Connection[Any], epoch: int, values: list[list[Any]]) -> None:
        with conn.transaction():
            if not self._claim(conn, epoch):
                return  # a replay: this epoch committed before
            if self.params.mode == "append":
                self._copy(conn, self._target(), self._copy_types(), values)
            else:
                self._apply(conn, values)

    def _claim(self, conn: psycopg.Connection[Any], epoch: int) -> bool:
        from psycopg import sql

        cur = conn.execute(
            sql.SQL("INSERT INTO {} (network, checkpoint, sink, epoch) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING").format(self._epochs()),
            (self.network, self.checkpoint, self.name, epoch),
        )
        return cur.rowcount == 1

    def _copy_types(self) -> list[tuple[str, str]]:
        assert self.layout is not None
        return [(c.name, c.copy_type) for c in self.layout.columns]

    @staticmethod
    def _copy(
        conn: psycopg.Connection[Any], table: sql.Identifier, columns: list[tuple[str, str]],
        values: list[list[Any]],
    ) -> None:
        from psycopg import sql

        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            table, _idents([n for n, _ in columns])
        )
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types([t for _, t in columns])
            for row in zip(*values, strict=True):
                copy.write_row(row)

    def _apply(self, conn: psycopg.Connection[Any], values: list[list[Any]]) -> None:
        """Upsert mode: the changes go to a temporary table first, so that two set-based
        statements apply them, whatever their number."""
        from psycopg import sql

        assert self.layout is not None
        staged = sql.Identifier(_STAGED)
        defs = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type))
                for c in self.layout.columns]
        conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}, {} text) ON COMMIT DROP").format(
            staged, sql.SQL(", ").join(defs), sql.Identifier(OP)))
        self._copy(conn, staged, [*self._copy_types(), (OP, "text")], values)
        conn.execute(self._delete_statement(staged))
        conn.execute(self._upsert_statement(staged))

    def _delete_statement(self, staged: sql.Identifier) -> sql.Composed:
        from psycopg import sql

        assert self.layout is not None
        same_key = sql.SQL(" AND ").join(
            sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in self.layout.key
        )
        return sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE {} AND s.{} = {}").format(
            self._target(), staged, same_key, sql.Identifier(OP), sql.Literal(_DELETE))

    def _upsert_statement(self, staged: sql.Identifier) -> sql.Composed:
        from psycopg import sql

        assert self.layout is not None
        others = [n for n in self.layout.names if n not in self.layout.key]
        on_conflict = (
            sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others))
            if others else sql.SQL("DO NOTHING")
        )
        return sql.SQL(
            "INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} <> {} ON CONFLICT ({}) {}"
        ).format(
            self._target(), _idents(self.layout.names), _idents(self.layout.names), staged,
            sql.Identifier(OP), sql.Literal(_DELETE), _idents(self.layout.key), on_conflict,
        )


def column_problems(layout: Layout, found: dict[str, tuple[str, bool, bool]]) -> list[str]:
    """What keeps an existing table (``found``: name -> (type, not null, has a default)) from
    taking the layout's rows; empty when it fits."""
    problems = []
    for c in layout.columns:
        if c.name not in found:
            problems.append(f"column {c.name!r} is missing (expected {c.sql_type})")
        elif found[c.name][0] != c.sql_type:
            problems.append(f"column {c.name!r}: expected {c.sql_type}, found {found[c.name][0]}")
    expected = set(layout.names)
    for name, (sql_type, not_null, has_default) in found.items():
        if name not in expected and not_null and not has_default:
            problems.append(
                f"column {name!r} ({sql_type}) is NOT NULL without a default and the input has "
                "no such column"
            )
    return problems


def _idents(columns: Sequence[str]) -> sql.Composed:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(c) for c in columns)


@SINKS.register
class PostgresKind(SinkKind):
    key = "postgres"
    params = Postgres

    def check(self, sink: SinkSpec) -> list[str]:
        p: Postgres = sink.params
        key = names(p.key)
        problems = []
        if p.mode == "upsert" and not key:
            problems.append("postgres.key: upsert needs the primary key column(s)")
        if p.mode == "append" and key:
            problems.append("postgres.key: append writes every row as it comes and has no key; "
                            "remove key or use mode: upsert")
        if OP in key:
            problems.append(f"postgres.key: {OP} says what to do with a row, it is not a column")
        if len(set(key)) != len(key):
            problems.append("postgres.key: a column appears twice")
        if redact(p.url).startswith("<"):
            problems.append("postgres.url: expected a libpq URI (postgresql://user@host:port/db) "
                            "or key=value connection string")
        return problems

    def describe(self, params: Any) -> str:
        how = f"upsert on {', '.join(names(params.key))}" if params.mode == "upsert" else "append"
        return f"postgres table {params.table} ({how}) at {redact(params.url)}"

    def make(self, spec: SinkSpec, console: Any = None) -> PostgresSink:
        return PostgresSink(spec)

