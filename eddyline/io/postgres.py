"""The ``postgres`` sink: each epoch's rows land in a PostgreSQL table exactly once.

``mode: append`` copies every row in. ``mode: upsert`` writes rows by ``key`` (``INSERT ... ON
CONFLICT (key) DO UPDATE``). An input that carries revisions (a ``_diff`` column, as an
``aggregate`` emits: docs/revisions.md) is applied as a changelog by key: the epoch's revisions
are summed per row first, then a row taken back (−1) deletes its key and a row put in (+1)
upserts it, so an aggregate's "old row out, new row in" becomes one update. ``_diff`` itself is
never a table column. A keyed table holds one row per key, so a summed weight other than ±1 is
refused, naming the row; append mode refuses revisions (it cannot tell which copy to delete).

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

Fencing. Under a lease (:mod:`eddyline.ha.lease`) the sink keeps a row per (network,
checkpoint, sink) in ``eddyline_fence`` beside the target table: the newest lease generation
that writes there (and ``eddyline_epochs.generation`` says which generation wrote each epoch). A driver that takes the lease over raises it before it writes anything, and
every transaction of the sink (an epoch, a retraction, a put-back) first reads it ``FOR SHARE``
and rolls back if it names a newer generation than the writer's: the generation is checked
inside the transaction that writes, holding the row, so a driver that was frozen past its lease
and wakes has its epoch refused by the database; one in flight when the new driver takes over
commits before the new driver's fence (which waits for its lock) and is replayed by it.

The sink collects each epoch's rows in the driver (:meth:`PostgresSink.stage`) and writes them
from there: what goes into a database table is meant to be small (aggregates, alerts, top lists),
not a stream of raw events; those belong in a ``files`` sink.

Tentative epochs (Delay-Process-Correct, :mod:`eddyline.ha.dpc`). Opened with ``tentative=True``
(its network has ``max_delay``), the sink gives the table one more column, ``tentative boolean
NOT NULL DEFAULT false``, and writes it in every epoch: true for a tentative epoch's rows, false
for a stable one's, so that dashboards show tentative results and can tell them apart. A table
that exists already must have that column; the user's table gets nothing else. Everything else
lives beside ``eddyline_epochs``: its rows say whether an epoch was published tentative, and
``eddyline_undo`` holds what :meth:`PostgresSink.retract` needs to take a tentative epoch back,
written in the epoch's own transaction: in append mode the rows it inserted, in upsert mode the
before-image of every key it touched (the row as it was, or null when there was none), only the
first per key in a stretch of tentative epochs, which is the row as the last stable epoch left
it. The retraction is one transaction: append mode deletes one tentative row per recorded row
(rows are told apart by their values, since the table has no other mark; equal rows are
interchangeable), upsert mode deletes the current row of every recorded key and inserts its
before-image again; the undo records and the epochs' rows in ``eddyline_epochs`` go with them, so
nothing counts the retracted epochs as written and a replay of the retraction finds nothing left
to do. Rows and before-images are kept as JSON; the transactions that write and read them fix
the settings that shape its text (time zone, float digits, bytea format), so a value comes back
exactly as it was and compares equal to itself.

Replays and undo (``eddyline replay`` / ``undo``, ``rewind: true``). A replay at epoch M of the
epochs from T on first takes back everything epochs T..M-1 wrote; an undo of that replay takes
back what M and the epochs after it wrote, then puts back what M took back. With ``rewind: true``
(in a network without ``max_delay``, which cannot replay yet) every epoch keeps the same records
as a tentative one, in its own transaction: in append mode the rows it inserted, in upsert mode
the before-image of every key it touched, per epoch (one record per key and epoch). Taking
epochs back is one transaction, as above, except that upsert mode gives each key the
before-image of the earliest of them that touched it, and the records stay: first each key's
row as the replay found it is kept with them (``after``), then they are marked as taken back by
M (``retracted_by``). Putting back is one transaction too: append mode inserts the recorded rows
again, upsert mode gives every key its ``after`` row (deleting it where that is null); the
records are then in force again, so a later replay can take those epochs back once more. Both
find nothing left to do when done once already (an epoch replayed after a crash repeats them).
``eddyline_epochs`` keeps its rows: a replay's epochs get numbers of their own. The records are
kept for the network's ``history`` (the engine sets :attr:`~eddyline.io.sinks.Sink.history`):
every epoch deletes, in its transaction, those of epochs older than that, and those a replay
took back once the replay is that old. A replay or undo that needs records the sink does not
have (epochs written before it had ``rewind: true``, or longer ago) is refused before it starts
(:meth:`PostgresSink.rewind_problem`). The cost: append mode writes every row a second time, as
JSON, and deletes it ``history`` epochs later; upsert mode reads and writes a before-image per
key; taking back append rows reads the whole table once (rows are matched by value).
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
from eddyline.columns import DIFF
from eddyline.errors import Fenced, SinkError
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
UNDO = "eddyline_undo"
FENCE = "eddyline_fence"
#: the column of the target table that marks the rows of tentative epochs
TENTATIVE = "tentative"
_STAGED = "eddyline_staged"
#: the staged rows' action column (upsert mode): what to do with the row's key
_ACTION = "eddyline_action"
_UPSERT, _DELETE = "upsert", "delete"



#: TCP keepalives: a server that vanished without closing the connection (a partition, a host
#: that died) is noticed within about 10 + 3 x 5 s, and data it never acknowledges after 30 s,
#: instead of a commit waiting on the socket for the kernel's default of two hours
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
              "tcp_user_timeout": 30_000}


def connect_options(url: str, connect_timeout_s: int) -> dict[str, Any]:
    """libpq options for a connection to ``url``: its timeout and :data:`KEEPALIVES`, except
    those the URL sets itself."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(url)
    return {k: v for k, v in {"connect_timeout": connect_timeout_s, **KEEPALIVES}.items() if k not in given}

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
    #: keep, for the network's ``history``, what it takes to take epochs back and put them back
    #: (``eddyline replay`` / ``undo``): each epoch's inserted rows (append) or the before-image
    #: of each key it touched (upsert), in ``eddyline_undo``
    rewind: bool = False


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
    changelog: bool  # the input carries revisions (a _diff column)
    tentative: bool = False  # the table has the column TENTATIVE, which the sink writes

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


def layout_of(schema: StructType, params: Postgres, sink: str, tentative: bool = False) -> Layout:
    key = names(params.key)
    present = set(schema.fieldNames())
    changelog = DIFF in present
    if tentative and TENTATIVE in present:
        raise SinkError(
            f"sink '{sink}': its input has a column {TENTATIVE!r}, the name of the column the "
            "sink adds to mark the rows of tentative epochs (its network has max_delay); rename "
            "the input's column"
        )
    if changelog and params.mode == "append":
        raise SinkError(
            f"sink '{sink}': its input carries revisions (column {DIFF}: +1 puts a row in, -1 "
            "takes it back); appending them would add a row per change. Use mode: upsert with "
            "key: <the input's key column(s)>, or a files sink (it keeps the _diff column)"
        )
    for k in key:
        if k not in present:
            raise SinkError(
                f"sink '{sink}': key column {k!r} is not in its input (columns: "
                f"{', '.join(f for f in schema.fieldNames() if f != DIFF)})"
            )
    columns = tuple(column_of(f, sink) for f in schema.fields if f.name != DIFF)
    return Layout(columns, key, changelog, tentative)


def last_per_key(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """One row per key: the last one in input order, as if the rows were applied one after
    another. Summed revisions leave a key at most a delete then an upsert; this keeps
    ``INSERT ... ON CONFLICT`` (which refuses to touch a row twice) safe for any input."""
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
        self.tentative = False  # opened for tentative epochs (the network has max_delay)
        self.health = Health()
        self._conn: psycopg.Connection[Any] | None = None
        self._marked = False  # eddyline_epochs has the column that marks tentative epochs
        #: every epoch records what a replay needs to take it back (rewind: true, no max_delay)
        self._rewind = False

    @property
    def rewinds(self) -> bool:  # type: ignore[override]
        return self.params.rewind

    def status(self) -> dict[str, Any]:
        return self.health.to_json()

    @property
    def server(self) -> str:
        return redact(self.url)

    def open(self, network: str, checkpoint: str, schema: StructType, tentative: bool = False) -> None:
        self.network, self.checkpoint, self.tentative = network, checkpoint, tentative
        # a network with max_delay cannot replay (yet): its undo records are the tentative ones
        self._rewind = self.params.rewind and not tentative
        self.layout = layout_of(schema, self.params, self.name, tentative)
        self._run(self._prepare)
        if self.generation:
            self._run(self._fence)

    def fence(self, generation: int) -> None:
        renewed = generation != self.generation
        super().fence(generation)
        if renewed and self.layout is not None and generation:  # opened already: it took the lease over
            self._run(self._fence)

    def _fence(self, conn: psycopg.Connection[Any]) -> None:
        """Make this generation the newest that writes here (waiting for a transaction of an
        older one in flight); :class:`Fenced` if a newer one did first."""
        from psycopg import sql

        (newest,) = conn.execute(sql.SQL(
            "INSERT INTO {} AS f (network, checkpoint, sink, generation) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (network, checkpoint, sink) DO UPDATE SET generation = GREATEST(f.generation, "
            "EXCLUDED.generation), fenced_at = now() RETURNING generation"
        ).format(self._beside(FENCE)), (self.network, self.checkpoint, self.name, self.generation)).fetchone()
        if newest > self.generation:
            raise self._fenced(newest)

    def _fenced(self, newer: int) -> Fenced:
        return Fenced(f"sink '{self.name}': lease generation {self.generation} was taken over by generation "
                      f"{newer}: table {self.params.table} at {self.server} refuses its writes; stopping without "
                      "writing anything more")

    def _hold_fence(self, conn: psycopg.Connection[Any]) -> None:
        """Inside a transaction that writes: hold the fence row (a driver taking the lease over
        waits until this transaction ends) and refuse if a newer generation holds it."""
        if not self.generation:
            return
        from psycopg import sql

        row = conn.execute(sql.SQL(
            "SELECT generation FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s FOR SHARE"
        ).format(self._beside(FENCE)), (self.network, self.checkpoint, self.name)).fetchone()
        if row is not None and row[0] > self.generation:
            raise self._fenced(row[0])

    def stage(self, df: DataFrame, epoch: int) -> None:
        self.collected[epoch] = df.toArrow()

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        if tentative and not self.tentative:
            raise SinkError(
                f"sink '{self.name}': epoch {epoch} is tentative, but the sink was opened without "
                f"tentative=True, so table {self.params.table} may have no {TENTATIVE!r} column "
                "to mark its rows"
            )
        staged = self.collected.get(epoch)
        if staged is None:
            return
        if staged.num_rows:  # an empty epoch has nothing that could be written twice
            rows = self._rows(staged)
            self._run(lambda conn: self._write(conn, epoch, rows, tentative))
        del self.collected[epoch]

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        """Take back the tentative ``epochs`` in one transaction (see the module's docstring).
        Epochs that published nothing tentative (empty ones, stable ones, those retracted by an
        earlier attempt) are passed over, so a replay changes nothing. Since a before-image is
        kept per key for a whole stretch of tentative epochs, the stretch goes back as a whole:
        if this sink published tentative epochs that are not among ``epochs``, nothing is
        changed and :class:`SinkError` says which."""
        if not epochs:
            return
        if self.layout is None or not (self.tentative or self._rewind):
            raise SinkError(
                f"sink '{self.name}': asked to retract epochs {sorted(epochs)}, but the sink was "
                "not opened with tentative=True (its network has no max_delay?) and has no "
                "rewind: true"
            )
        wanted = sorted(set(epochs))
        if self.tentative:
            self._run(lambda conn: self._retract(conn, wanted, at_epoch))
        else:
            self._run(lambda conn: self._take_back(conn, wanted, at_epoch))

    def restore(self, at_epoch: int) -> None:
        """Put back what epoch ``at_epoch`` took back (undoing a replay, see the module's
        docstring), in one transaction; a second call finds nothing left to put back."""
        if self.layout is None or not self._rewind:
            raise SinkError(
                f"sink '{self.name}': asked to put back what epoch {at_epoch} took back, but the "
                "sink keeps no records to do it with (it needs rewind: true and no max_delay)"
            )
        self._run(lambda conn: self._put_back(conn, at_epoch))

    def rewind_problem(self, network: str, checkpoint: str, epochs: range, restore: int | None) -> str | None:
        """Epochs in ``epochs`` this sink wrote without keeping their records (written before it
        had ``rewind: true``, or longer ago than ``history``), or a replay ``restore`` whose
        records are gone."""
        if not self.params.rewind or not epochs:
            return None
        return self._run(lambda conn: self._rewind_problem(conn, (network, checkpoint, self.name), epochs, restore))

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
            self._conn = psycopg.connect(self.url, autocommit=True, **connect_options(self.url, timeout))
        return self._conn

    def _target(self) -> sql.Identifier:
        from psycopg import sql

        # validated as an SQL name: lower-cased, it is what PostgreSQL makes of it unquoted
        return sql.Identifier(*self.params.table.lower().split("."))

    def _beside(self, name: str) -> sql.Identifier:
        """A bookkeeping table in the target table's schema."""
        from psycopg import sql

        return sql.Identifier(*self.params.table.lower().split(".")[:-1], name)

    def _beside_name(self, name: str) -> str:
        """:meth:`_beside`'s table as ``to_regclass`` takes it."""
        return ".".join([*self.params.table.lower().split(".")[:-1], name])

    def _has_column(self, conn: psycopg.Connection[Any], table: str, column: str) -> bool:
        """Whether the bookkeeping table ``table`` (see :meth:`_beside`) has ``column``."""
        return conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attname = %s AND NOT attisdropped", (self._beside_name(table), column),
        ).fetchone() == (1,)

    def _epochs(self) -> sql.Identifier:
        return self._beside(EPOCHS)

    def _undo(self) -> sql.Identifier:
        return self._beside(UNDO)

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        from psycopg import sql

        assert self.layout is not None
        with conn.transaction():
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (network text, checkpoint text, sink text, epoch bigint, "
                "committed_at timestamptz DEFAULT now(), tentative boolean NOT NULL DEFAULT false, "
                "PRIMARY KEY (network, checkpoint, sink, epoch))"
            ).format(self._epochs()))
            if self.generation:
                conn.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (network text, checkpoint text, sink text, generation bigint "
                    "NOT NULL, fenced_at timestamptz DEFAULT now(), PRIMARY KEY (network, checkpoint, sink))"
                ).format(self._beside(FENCE)))
                if not self._has_column(conn, EPOCHS, "generation"):  # made before epochs said who wrote them
                    conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS generation bigint")
                                 .format(self._epochs()))
            self._marked = self._has_column(conn, EPOCHS, TENTATIVE)
            if self.tentative and not self._marked:  # made by a version that knew no tentative epochs
                conn.execute(sql.SQL(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS tentative boolean NOT NULL DEFAULT false"
                ).format(self._epochs()))
                self._marked = True
            if self.tentative or self._rewind:
                self._prepare_undo(conn)
            name = self.params.table.lower()
            oid = conn.execute("SELECT to_regclass(%s)::oid", (name,)).fetchone()
            if oid is None or oid[0] is None:
                conn.execute(self._create_table())
                return
            self._check_columns(conn, oid[0])
            if self.params.mode == "upsert":
                self._check_unique(conn, oid[0])

    def _prepare_undo(self, conn: psycopg.Connection[Any]) -> None:
        """``eddyline_undo`` as this version writes it: a record per epoch and key (upsert) or
        row (append, no key), and what a replay took back, by the epoch that did."""
        from psycopg import sql

        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (network text NOT NULL, checkpoint text NOT NULL, "
            "sink text NOT NULL, epoch bigint NOT NULL, key jsonb, image jsonb, retracted_by bigint, "
            "after jsonb, UNIQUE (network, checkpoint, sink, epoch, key))"
        ).format(self._undo()))
        undo = self._beside_name(UNDO)
        # made by a version without replays (the check takes no lock when there is nothing to do)
        if not self._has_column(conn, UNDO, "retracted_by"):
            conn.execute(sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS retracted_by bigint, ADD COLUMN IF NOT EXISTS after jsonb"
            ).format(self._undo()))
        # that version kept one record per key (a stretch of tentative epochs' first): now one
        # per key and epoch, the first of a stretch chosen when it is written
        for (name,) in conn.execute(
            "SELECT c.conname FROM pg_constraint c WHERE c.conrelid = to_regclass(%s) AND c.contype = 'u'"
            " AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a"
            " WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey))"
            " = ARRAY['checkpoint', 'key', 'network', 'sink']", (undo,),
        ).fetchall():
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}, ADD UNIQUE (network, checkpoint, sink, epoch, key)")
                         .format(self._undo(), sql.Identifier(name)))

    def _create_table(self) -> sql.Composed:
        from psycopg import sql

        assert self.layout is not None
        parts = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type))
                 for c in self.layout.columns]
        if self.layout.tentative:
            parts.append(sql.SQL("{} boolean NOT NULL DEFAULT false").format(sql.Identifier(TENTATIVE)))
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

    def _rows(self, staged: pa.Table) -> pa.Table:
        """The epoch's rows as the sink sends them: the layout's columns in its order (``_op``
        last in upsert mode), made once so that a retry sends the same."""
        assert self.layout is not None
        if self.params.mode == "append":
            return staged.select(self.layout.names)
        if self.layout.changelog:
            staged = self._as_actions(staged)
        else:
            staged = staged.append_column(_ACTION, pa.array([_UPSERT] * staged.num_rows, pa.string()))
        return last_per_key(staged, self.layout.key).select([*self.layout.names, _ACTION])

    def _as_actions(self, staged: pa.Table) -> pa.Table:
        """Revisions → one action per row: summed per row (what cancels goes), deletes before
        upserts (so that an old row out and a new row in of one key leave the new row)."""
        assert self.layout is not None
        names = self.layout.names
        summed = staged.group_by(names, use_threads=False).aggregate([(DIFF, "sum")])
        weight = summed.column(f"{DIFF}_sum")
        summed = summed.filter(pc.not_equal(weight, 0))
        weight = summed.column(f"{DIFF}_sum")
        odd = summed.filter(pc.greater(pc.abs(weight), 1))
        if odd.num_rows:
            row = {n: odd.column(n)[0].as_py() for n in names}
            raise SinkError(
                f"sink '{self.name}': row {row} weighs {odd.column(f'{DIFF}_sum')[0].as_py()} once the "
                f"epoch's revisions are summed; a table keyed by ({', '.join(self.layout.key)}) holds "
                "one row per key"
            )
        deletes = pc.less(weight, 0)
        ordered = summed.take(pc.sort_indices(pa.table({"d": pc.invert(deletes)}), [("d", "ascending")]))
        action = pc.if_else(pc.less(ordered.column(f"{DIFF}_sum"), 0), _DELETE, _UPSERT)
        return ordered.select(names).append_column(_ACTION, action)

    def _write(
        self, conn: psycopg.Connection[Any], epoch: int, rows: pa.Table, tentative: bool
    ) -> None:
        assert self.layout is not None
        with conn.transaction():
            self._hold_fence(conn)
            if not self._claim(conn, epoch, tentative):
                return  # a replay: this epoch committed before
            if tentative or self._rewind:
                _fix_json_text(conn)
            if self.params.mode == "upsert":
                self._apply(conn, epoch, rows, tentative)
            elif tentative or self._rewind:
                self._append_recorded(conn, epoch, rows, tentative)
            elif self.layout.tentative:
                flags = pa.repeat(pa.scalar(False), rows.num_rows)
                self._copy(conn, self._target(), [*self._copy_types(), (TENTATIVE, "bool")],
                           rows.append_column(TENTATIVE, flags))
            else:
                self._copy(conn, self._target(), self._copy_types(), rows)
            if self._rewind:
                self._forget_before(conn, epoch - self.history + 1)

    def _claim(self, conn: psycopg.Connection[Any], epoch: int, tentative: bool) -> bool:
        from psycopg import sql

        key = (self.network, self.checkpoint, self.name, epoch)
        columns, values = ["network", "checkpoint", "sink", "epoch"], list(key)
        if self._marked:
            columns.append("tentative")
            values.append(tentative)
        if self.generation:  # who wrote the epoch: the lease generation
            columns.append("generation")
            values.append(self.generation)
        cur = conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING").format(
                self._epochs(), sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(sql.Placeholder() * len(values))), values)
        if not self._marked:
            return cur.rowcount == 1
        if cur.rowcount == 1:
            return True
        # a replay must publish the epoch as its first attempt did: a stable replay of a
        # tentative epoch would keep the tentative rows as if they were the epoch's output
        (was,) = conn.execute(
            sql.SQL("SELECT tentative FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s "
                    "AND epoch = %s").format(self._epochs()), key,
        ).fetchone() or (tentative,)
        if was and not tentative:
            raise SinkError(
                f"sink '{self.name}': epoch {epoch} was published tentative and not retracted; "
                "publishing it as stable would keep its tentative rows (retract it first)"
            )
        if tentative and not was:
            raise SinkError(
                f"sink '{self.name}': epoch {epoch} was published stable; it cannot be published "
                "again as tentative"
            )
        return False

    def _copy_types(self) -> list[tuple[str, str]]:
        assert self.layout is not None
        return [(c.name, c.copy_type) for c in self.layout.columns]

    @staticmethod
    def _copy(
        conn: psycopg.Connection[Any], table: sql.Identifier, columns: list[tuple[str, str]], rows: pa.Table
    ) -> None:
        """``rows`` (the ``columns``, in their order) into ``table`` by one COPY: as CSV that
        Arrow writes, or, when a column is binary (bytea's text form is one CSV would need
        made by hand), row by row in COPY's binary format, which costs the driver several
        times the CPU."""
        from psycopg import sql

        binary = any(t == "bytea" for _, t in columns)
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
            table, _idents([n for n, _ in columns]), sql.SQL("BINARY" if binary else "CSV")
        )
        with conn.cursor() as cur, cur.copy(statement) as copy:
            if not binary:
                copy.write(copy_csv(rows))
                return
            copy.set_types([t for _, t in columns])
            for row in zip(*(c.to_pylist() for c in rows.columns), strict=True):
                copy.write_row(row)

    def _stage_in_temp(self, conn: psycopg.Connection[Any], rows: pa.Table, op: bool) -> sql.Identifier:
        """The epoch's rows in a temporary table with the layout's columns (and ``_op``), gone
        at commit: set-based statements then apply them, whatever their number."""
        from psycopg import sql

        assert self.layout is not None
        staged = sql.Identifier(_STAGED)
        defs = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type))
                for c in self.layout.columns]
        if op:
            defs.append(sql.SQL("{} text").format(sql.Identifier(_ACTION)))
        conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(
            staged, sql.SQL(", ").join(defs)))
        self._copy(conn, staged, [*self._copy_types(), *([(_ACTION, "text")] if op else [])], rows)
        return staged

    def _apply(self, conn: psycopg.Connection[Any], epoch: int, rows: pa.Table, tentative: bool) -> None:
        """Upsert mode. A tentative epoch first records the before-image of every key it
        touches, unless an earlier epoch of the stretch did; with ``rewind`` every epoch
        records them all."""
        staged = self._stage_in_temp(conn, rows, op=True)
        if tentative:
            conn.execute(self._before_images_statement(staged, first_of_stretch=True),
                         (*self._sink_key(epoch), self.network, self.checkpoint, self.name))
        elif self._rewind:
            conn.execute(self._before_images_statement(staged, first_of_stretch=False), self._sink_key(epoch))
        conn.execute(self._delete_statement(staged))
        conn.execute(self._upsert_statement(staged, tentative))

    def _append_recorded(self, conn: psycopg.Connection[Any], epoch: int, rows: pa.Table, tentative: bool) -> None:
        """Append mode, a tentative epoch or one of a sink that rewinds: its rows are inserted
        (marked, if the table has the mark), and recorded."""
        from psycopg import sql

        assert self.layout is not None
        staged = self._stage_in_temp(conn, rows, op=False)
        if self.layout.tentative:
            conn.execute(sql.SQL("INSERT INTO {} ({}, {}) SELECT {}, {} FROM {}").format(
                self._target(), _idents(self.layout.names), sql.Identifier(TENTATIVE),
                _idents(self.layout.names), sql.Literal(tentative), staged))
        else:
            conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                self._target(), _idents(self.layout.names), _idents(self.layout.names), staged))
        conn.execute(sql.SQL(
            "INSERT INTO {} (network, checkpoint, sink, epoch, image) "
            "SELECT %s, %s, %s, %s, to_jsonb(_s.*) FROM {} AS _s"
        ).format(self._undo(), staged), self._sink_key(epoch))

    def _sink_key(self, epoch: int) -> tuple[str, str, str, int]:
        return self.network, self.checkpoint, self.name, epoch

    def _before_images_statement(self, staged: sql.Identifier, first_of_stretch: bool) -> sql.Composed:
        """The row of each key as it is (null: absent). ``first_of_stretch`` (tentative
        epochs): unless the key has a record already, which is older, from this stretch's first
        epoch to touch the key."""
        from psycopg import sql

        assert self.layout is not None
        key = sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
            sql.SQL("{}, _s.{}").format(sql.Literal(k), sql.Identifier(k)) for k in self.layout.key))
        same_key = sql.SQL(" AND ").join(
            sql.SQL("_t.{k} = _s.{k}").format(k=sql.Identifier(k)) for k in self.layout.key)
        unrecorded = sql.SQL(
            "WHERE NOT EXISTS (SELECT 1 FROM {} AS _o WHERE _o.network = %s AND _o.checkpoint = %s "
            "AND _o.sink = %s AND _o.key = {}) "
        ).format(self._undo(), key) if first_of_stretch else sql.SQL("")
        return sql.SQL(
            "INSERT INTO {} (network, checkpoint, sink, epoch, key, image) "
            "SELECT %s, %s, %s, %s, {}, to_jsonb(_t.*) "
            "FROM {} AS _s LEFT JOIN {} AS _t ON {} {}ON CONFLICT DO NOTHING"
        ).format(self._undo(), key, staged, self._target(), same_key, unrecorded)

    def _delete_statement(self, staged: sql.Identifier) -> sql.Composed:
        from psycopg import sql

        assert self.layout is not None
        same_key = sql.SQL(" AND ").join(
            sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in self.layout.key
        )
        return sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE {} AND s.{} = {}").format(
            self._target(), staged, same_key, sql.Identifier(_ACTION), sql.Literal(_DELETE))

    def _upsert_statement(self, staged: sql.Identifier, tentative: bool = False) -> sql.Composed:
        from psycopg import sql

        assert self.layout is not None
        others = [n for n in self.layout.names if n not in self.layout.key]
        columns, values = _idents(self.layout.names), _idents(self.layout.names)
        if self.layout.tentative:  # every row the epoch writes says which kind of epoch it was
            others.append(TENTATIVE)
            columns = sql.SQL("{}, {}").format(columns, sql.Identifier(TENTATIVE))
            values = sql.SQL("{}, {}").format(values, sql.Literal(tentative))
        on_conflict = (
            sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others))
            if others else sql.SQL("DO NOTHING")
        )
        return sql.SQL(
            "INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} <> {} ON CONFLICT ({}) {}"
        ).format(
            self._target(), columns, values, staged,
            sql.Identifier(_ACTION), sql.Literal(_DELETE), _idents(self.layout.key), on_conflict,
        )

    # -- taking epochs back: tentative ones, and those a replay runs again ---------------------

    def _retract(self, conn: psycopg.Connection[Any], epochs: list[int], at_epoch: int) -> None:
        from psycopg import sql

        sink = (self.network, self.checkpoint, self.name)
        of_sink = sql.SQL("network = %s AND checkpoint = %s AND sink = %s")
        with conn.transaction():
            self._hold_fence(conn)
            # locked, so that a second driver retracting at the same time waits, then finds
            # nothing left to do
            published = [e for (e,) in conn.execute(
                sql.SQL("SELECT epoch FROM {} WHERE {} AND tentative ORDER BY epoch FOR UPDATE")
                .format(self._epochs(), of_sink), sink).fetchall()]
            left = [e for e in published if e not in epochs]
            if left:
                raise SinkError(
                    f"sink '{self.name}': epoch {at_epoch} retracts tentative epochs {epochs}, but "
                    f"epochs {left} were published tentative too; a stretch of tentative epochs "
                    "is taken back as a whole (the undo records keep each key as it was before "
                    "the stretch), so nothing was retracted"
                )
            if not published:
                return
            _fix_json_text(conn)
            where, args = self._records(published)
            if self.params.mode == "upsert":
                self._put_images(conn, "image", where, args)
            else:
                self._delete_recorded_rows(conn, where, args, only_tentative=True)
            conn.execute(sql.SQL("DELETE FROM {} WHERE {} AND epoch = ANY(%s)").format(
                self._undo(), of_sink), (*sink, published))
            conn.execute(sql.SQL("DELETE FROM {} WHERE {} AND tentative AND epoch = ANY(%s)").format(
                self._epochs(), of_sink), (*sink, published))

    def _take_back(self, conn: psycopg.Connection[Any], epochs: list[int], at_epoch: int) -> None:
        """A replay: what the records of ``epochs`` say they wrote goes (upsert: each key's
        current row is kept with them first, as ``after``), and the records are marked as taken
        back by ``at_epoch`` rather than deleted, so that :meth:`_put_back` can undo it."""
        from psycopg import sql

        with conn.transaction():
            self._hold_fence(conn)
            # locked, so that a second driver taking them back at the same time waits, then
            # finds nothing left to do
            conn.execute(sql.SQL(
                "SELECT epoch FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s "
                "AND epoch = ANY(%s) ORDER BY epoch FOR UPDATE"
            ).format(self._epochs()), (self.network, self.checkpoint, self.name, epochs))
            where, args = self._records(epochs)
            if not self._any(conn, where, args):
                return  # nothing written, or taken back by an earlier attempt
            _fix_json_text(conn)
            if self.params.mode == "upsert":
                assert self.layout is not None
                same_key = sql.SQL(" AND ").join(
                    sql.SQL("_t.{k} = _k.{k}").format(k=sql.Identifier(k)) for k in self.layout.key)
                conn.execute(sql.SQL(
                    "UPDATE {} AS _u SET after = (SELECT to_jsonb(_t.*) FROM {} AS _t, "
                    "jsonb_populate_record(NULL::{}, _u.key) AS _k WHERE {}) WHERE {}"
                ).format(self._undo(), self._target(), self._target(), same_key, where), args)
                self._put_images(conn, "image", where, args)
            else:
                self._delete_recorded_rows(conn, where, args, only_tentative=False)
            conn.execute(sql.SQL("UPDATE {} AS _u SET retracted_by = %s WHERE {}").format(self._undo(), where),
                         (at_epoch, *args))

    def _put_back(self, conn: psycopg.Connection[Any], at_epoch: int) -> None:
        """Undoing the replay ``at_epoch``: what it took back is written again (upsert: each
        key's row as the replay found it), and the records are in force again."""
        from psycopg import sql

        assert self.layout is not None
        where, args = self._records(retracted_by=at_epoch)
        with conn.transaction():
            self._hold_fence(conn)
            conn.execute(sql.SQL(
                "SELECT e.epoch FROM {} AS e WHERE e.network = %s AND e.checkpoint = %s AND e.sink = %s "
                "AND e.epoch IN (SELECT _u.epoch FROM {} AS _u WHERE {}) ORDER BY e.epoch FOR UPDATE"
            ).format(self._epochs(), self._undo(), where), (self.network, self.checkpoint, self.name, *args))
            if not self._any(conn, where, args):
                return  # nothing taken back, or put back by an earlier attempt
            _fix_json_text(conn)
            if self.params.mode == "upsert":
                self._put_images(conn, "after", where, args)
            else:
                names = _idents(self.layout.names)
                conn.execute(sql.SQL(
                    "INSERT INTO {} ({}) SELECT {} FROM {} AS _u, jsonb_populate_record(NULL::{}, _u.image) AS _r "
                    "WHERE {}"
                ).format(self._target(), names,
                         sql.SQL(", ").join(sql.SQL("_r.{}").format(sql.Identifier(n)) for n in self.layout.names),
                         self._undo(), self._target(), where), args)
            conn.execute(sql.SQL("UPDATE {} AS _u SET retracted_by = NULL, after = NULL WHERE {}").format(
                self._undo(), where), args)

    def _forget_before(self, conn: psycopg.Connection[Any], floor: int) -> None:
        """The records no replay or undo can need any more: of epochs before ``floor``, unless
        a replay at ``floor`` or later took them back (its undo puts them back)."""
        from psycopg import sql

        conn.execute(sql.SQL(
            "DELETE FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s AND epoch < %s "
            "AND (retracted_by IS NULL OR retracted_by < %s)"
        ).format(self._undo()), (self.network, self.checkpoint, self.name, floor, floor))

    def _rewind_problem(
        self, conn: psycopg.Connection[Any], sink: tuple[str, str, str], epochs: range, restore: int | None
    ) -> str | None:
        from psycopg import sql

        has_epochs, has_undo = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            (self._beside_name(EPOCHS), self._beside_name(UNDO)),
        ).fetchone() or (False, False)
        if not has_epochs:
            return None  # it wrote nothing yet
        of_sink = sql.SQL("e.network = %s AND e.checkpoint = %s AND e.sink = %s")
        unrecorded = sql.SQL(
            "AND NOT EXISTS (SELECT 1 FROM {} AS _u WHERE _u.network = e.network AND _u.checkpoint = "
            "e.checkpoint AND _u.sink = e.sink AND _u.epoch = e.epoch)"
        ).format(self._undo()) if has_undo else sql.SQL("")
        missing = [e for (e,) in conn.execute(sql.SQL(
            "SELECT e.epoch FROM {} AS e WHERE {} AND e.epoch BETWEEN %s AND %s {} ORDER BY e.epoch"
        ).format(self._epochs(), of_sink, unrecorded), (*sink, epochs[0], epochs[-1])).fetchall()]
        if missing:
            return (
                f"sink '{self.name}' kept no record of what epoch(s) {_listed(missing)} wrote into "
                f"{self.params.table}, so it cannot take them back (it keeps records since it has "
                f"rewind: true, for the last {self.history} epochs)"
            )
        if restore is not None:
            (latest,) = conn.execute(sql.SQL("SELECT max(e.epoch) FROM {} AS e WHERE {}").format(
                self._epochs(), of_sink), sink).fetchone() or (None,)
            if latest is not None and restore < latest - self.history + 1:
                return (
                    f"sink '{self.name}' no longer keeps what epoch {restore} took back from "
                    f"{self.params.table} (it keeps that for the last {self.history} epochs)"
                )
        return None

    def _records(self, epochs: list[int] | None = None, retracted_by: int | None = None) -> tuple[sql.Composed, tuple[Any, ...]]:
        """The condition on ``eddyline_undo AS _u`` that picks this sink's records of ``epochs``
        that are in force, or (``retracted_by``) those that epoch took back; and its arguments."""
        from psycopg import sql

        sink = (self.network, self.checkpoint, self.name)
        of_sink = sql.SQL("_u.network = %s AND _u.checkpoint = %s AND _u.sink = %s AND ")
        if retracted_by is None:
            return of_sink + sql.SQL("_u.epoch = ANY(%s) AND _u.retracted_by IS NULL"), (*sink, epochs)
        return of_sink + sql.SQL("_u.retracted_by = %s"), (*sink, retracted_by)

    def _any(self, conn: psycopg.Connection[Any], where: sql.Composed, args: tuple[Any, ...]) -> bool:
        from psycopg import sql

        return conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} AS _u WHERE {})").format(
            self._undo(), where), args).fetchone() == (True,)

    def _put_images(self, conn: psycopg.Connection[Any], image: str, where: sql.Composed, args: tuple[Any, ...]) -> None:
        """Upsert mode: the current row of every key the records ``where`` picks goes, and the
        row their column ``image`` holds comes back (null: none), whole (columns the sink does
        not write too; generated ones are computed again). A key recorded by several epochs
        gets its earliest epoch's: the row as it was before all of them."""
        from psycopg import sql

        assert self.layout is not None
        target, records = self._target(), self._undo()
        row_type = sql.SQL("NULL::{}").format(target)
        same_key = sql.SQL(" AND ").join(
            sql.SQL("_t.{k} = _k.{k}").format(k=sql.Identifier(k)) for k in self.layout.key)
        conn.execute(sql.SQL(
            "DELETE FROM {} AS _t USING {} AS _u, jsonb_populate_record({}, _u.key) AS _k "
            "WHERE {} AND {}"
        ).format(target, records, row_type, where, same_key), args)
        columns = [name for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
            (self.params.table.lower(),)).fetchall()]
        conn.execute(sql.SQL(
            "INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM (SELECT DISTINCT ON (_u.key) "
            "_u.{} AS _row FROM {} AS _u WHERE {} ORDER BY _u.key, _u.epoch) AS _p, "
            "jsonb_populate_record({}, _p._row) AS _r WHERE _p._row IS NOT NULL"
        ).format(target, _idents(columns),
                 sql.SQL(", ").join(sql.SQL("_r.{}").format(sql.Identifier(c)) for c in columns),
                 sql.Identifier(image), records, where, row_type), args)

    def _delete_recorded_rows(
        self, conn: psycopg.Connection[Any], where: sql.Composed, args: tuple[Any, ...], only_tentative: bool
    ) -> None:
        """Append mode: for each record ``where`` picks, one row of the table with the same
        values goes (equal rows are interchangeable, so which one does not matter), as many as
        were recorded; ``only_tentative``: among the rows marked tentative. Rows are matched by
        their JSON, which makes it one hash join (over the whole table: a replay reads it all)."""
        from psycopg import sql

        assert self.layout is not None
        values = sql.SQL(", ").join(sql.SQL("_t.{}").format(sql.Identifier(n)) for n in self.layout.names)
        marked = sql.SQL("WHERE _t.{}").format(sql.Identifier(TENTATIVE)) if only_tentative else sql.SQL("")
        conn.execute(sql.SQL(
            "WITH _recorded AS (SELECT _u.image, count(*) AS n FROM {undo} AS _u WHERE {where} "
            "GROUP BY _u.image), "
            "_rows AS (SELECT _t.ctid AS row_id, (SELECT to_jsonb(_v.*) FROM (SELECT {values}) AS _v) "
            "AS image FROM {target} AS _t {marked}), "
            "_matched AS (SELECT _rows.row_id, _recorded.n, row_number() OVER "
            "(PARTITION BY _rows.image ORDER BY _rows.row_id) AS i FROM _rows JOIN _recorded "
            "ON _rows.image = _recorded.image) "
            "DELETE FROM {target} AS _t USING _matched WHERE _t.ctid = _matched.row_id "
            "AND _matched.i <= _matched.n"
        ).format(undo=self._undo(), where=where, values=values, target=self._target(), marked=marked), args)


def copy_csv(rows: pa.Table) -> bytes:
    """``rows`` as the CSV that PostgreSQL's ``COPY ... (FORMAT CSV)`` reads back as the same
    values: every value quoted, so that an unquoted empty field is NULL and a quoted one the
    empty string (and a text value ``\\.`` is no end-of-data mark); timestamps with a zone
    written in UTC with a ``Z``. (Arrow formats those through the zone's rules, value by value,
    far slower than the same instants without a zone: docs/perf-notes.md, "The PostgreSQL
    sink's rows as CSV".)"""
    import io

    import pyarrow.csv as pacsv

    columns = []
    for column in rows.columns:
        if pa.types.is_timestamp(column.type) and column.type.tz is not None:
            naive = pc.cast(pc.cast(column, pa.timestamp(column.type.unit)), pa.string())
            column = pc.binary_join_element_wise(naive, pa.scalar("Z"), "")
        columns.append(column)
    out = io.BytesIO()
    pacsv.write_csv(pa.table(columns, names=rows.column_names), out,
                    pacsv.WriteOptions(include_header=False, quoting_style="all_valid"))
    return out.getvalue()


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
    if layout.tentative:
        expected.add(TENTATIVE)
        if TENTATIVE not in found:
            problems.append(
                f"column {TENTATIVE!r} is missing, which marks the rows of tentative epochs (the "
                f"network has max_delay); add it: ADD COLUMN {TENTATIVE} boolean NOT NULL DEFAULT false"
            )
        elif found[TENTATIVE][0] != "boolean":
            problems.append(
                f"column {TENTATIVE!r}: expected boolean (it marks the rows of tentative epochs), "
                f"found {found[TENTATIVE][0]}"
            )
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


def _listed(epochs: list[int]) -> str:
    """``epochs`` for a message: all of them, or the first and last of many."""
    if len(epochs) <= 6:
        return ", ".join(map(str, epochs))
    return f"{epochs[0]}, {epochs[1]}, ... {epochs[-1]} ({len(epochs)} epochs)"


def _fix_json_text(conn: psycopg.Connection[Any]) -> None:
    """For the rest of the transaction, the settings that shape the JSON text of values as the
    undo records need it: exact floats, one time zone, one bytea format; so a value goes into
    JSON and back unchanged, and the same value has the same JSON in every session."""
    conn.execute(
        "SELECT set_config('TimeZone', 'UTC', true), set_config('extra_float_digits', '3', true),"
        " set_config('bytea_output', 'hex', true)"
    )


@SINKS.register
class PostgresKind(SinkKind):
    key = "postgres"
    params = Postgres
    live_params = ("url", "table")

    def check(self, sink: SinkSpec) -> list[str]:
        p: Postgres = sink.params
        key = names(p.key)
        problems = []
        if p.mode == "upsert" and not key:
            problems.append("postgres.key: upsert needs the primary key column(s)")
        if p.mode == "append" and key:
            problems.append("postgres.key: append writes every row as it comes and has no key; "
                            "remove key or use mode: upsert")
        if DIFF in key:
            problems.append(f"postgres.key: {DIFF} is a revision's weight, not a column")
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

