"""The ``postgres`` sink: each epoch's rows land in a PostgreSQL table exactly once.

Exactly once rests on one transaction per epoch, which inserts the epoch's row (network,
checkpoint, sink, epoch) into ``eddyline_epochs`` first (``ON CONFLICT DO NOTHING``) and then the
rows. The engine commits the epoch in its checkpoint only after :meth:`PostgresSink.publish`
returned, so a replay after a crash, or a retry after a connection lost during the commit, finds
the epoch's row and writes nothing; a second writer of the same epoch blocks on the first one's
row until it commits, then sees it. Tentative epochs write a ``tentative`` column of the target
table (true until corrected) and journal what a correction takes back (:mod:`.journal`).

The rows are collected in the driver (:meth:`PostgresSink.stage`): what goes into a table is
meant to be small (aggregates, alerts, top lists); raw events belong in a ``files`` sink.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from eddyline.errors import Fenced, SinkError
from eddyline.io.postgres.fence import Who, fenced, newer_holder, raise_fence
from eddyline.io.postgres.journal import Journal, fix_json_text, rewind_problem
from eddyline.io.postgres.layout import TENTATIVE, Layout, layout_of
from eddyline.io.postgres.params import Postgres, connect_options, redact
from eddyline.io.postgres.rows import rows_to_send
from eddyline.io.postgres.schema import prepare
from eddyline.io.postgres.statements import (
    EPOCHS,
    Tables,
    copy_rows,
    delete_statement,
    stage_in_temp,
    upsert_statement,
)
from eddyline.io.retry import Health, with_retry
from eddyline.io.sinks import Sink
from eddyline.io.sparkjson import micro_instants

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from eddyline.api.sinks import SinkSpec

T = TypeVar("T")


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
        self._tables = Tables(self.params.table)
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

    @property
    def _who(self) -> Who:
        return self.network, self.checkpoint, self.name

    def _journal(self) -> Journal:
        assert self.layout is not None
        return Journal(self._tables, self._who, self.layout, self.params.mode == "upsert")

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
        """Make this generation the newest that writes here; :class:`Fenced` if a newer one did first."""
        newest = raise_fence(conn, self._tables, self._who, self.generation)
        if newest > self.generation:
            raise self._fenced(newest)

    def _fenced(self, newer: int) -> Fenced:
        return fenced(self.name, self.generation, newer, self._tables, self.server)

    def _hold_fence(self, conn: psycopg.Connection[Any]) -> None:
        """Inside a transaction that writes: hold the fence row and refuse if a newer
        generation holds it."""
        if not self.generation:
            return
        newer = newer_holder(conn, self._tables, self._who, self.generation)
        if newer is not None:
            raise self._fenced(newer)

    def stage(self, df: DataFrame, epoch: int) -> None:
        self.collected[epoch] = df.toArrow()

    takes_arrow = True

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        """A resident epoch's rows, their instants as Spark gives them (:meth:`stage`)."""
        self.collected[epoch] = micro_instants(table)

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
            assert self.layout is not None
            rows = rows_to_send(staged, self.layout, self.params.mode == "upsert", self.name)
            self._run(lambda conn: self._write(conn, epoch, rows, tentative))
        del self.collected[epoch]

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        """Take back the tentative ``epochs`` in one transaction (see :mod:`.journal`).
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
        journal = self._journal()
        if self.tentative:
            self._run(self._fenced_transaction(lambda conn: journal.retract(conn, wanted, at_epoch)))
        else:
            self._run(self._fenced_transaction(lambda conn: journal.take_back(conn, wanted, at_epoch)))

    def restore(self, at_epoch: int) -> None:
        """Put back what epoch ``at_epoch`` took back (undoing a replay, see :mod:`.journal`),
        in one transaction; a second call finds nothing left to put back."""
        if self.layout is None or not self._rewind:
            raise SinkError(
                f"sink '{self.name}': asked to put back what epoch {at_epoch} took back, but the "
                "sink keeps no records to do it with (it needs rewind: true and no max_delay)"
            )
        journal = self._journal()
        self._run(self._fenced_transaction(lambda conn: journal.put_back(conn, at_epoch)))

    def rewind_problem(self, network: str, checkpoint: str, epochs: range, restore: int | None) -> str | None:
        """Epochs in ``epochs`` this sink wrote without keeping their records (written before it
        had ``rewind: true``, or longer ago than ``history``), or a replay ``restore`` whose
        records are gone."""
        if not self.params.rewind or not epochs:
            return None
        who = (network, checkpoint, self.name)
        return self._run(lambda conn: rewind_problem(conn, self._tables, who, epochs, restore, self.history))

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

    def _fenced_transaction(
        self, action: Callable[[psycopg.Connection[Any]], None]
    ) -> Callable[[psycopg.Connection[Any]], None]:
        """``action`` in one transaction that holds the fence first."""

        def run(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                self._hold_fence(conn)
                action(conn)

        return run

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

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        assert self.layout is not None
        self._marked = prepare(
            conn, self._tables, self.layout, self.name, upsert=self.params.mode == "upsert",
            fenced=bool(self.generation), keeps_undo=self.tentative or self._rewind,
        )

    # -- one epoch ---------------------------------------------------------------------------

    def _write(
        self, conn: psycopg.Connection[Any], epoch: int, rows: pa.Table, tentative: bool
    ) -> None:
        assert self.layout is not None
        target = self._tables.target()
        with conn.transaction():
            self._hold_fence(conn)
            if not self._claim(conn, epoch, tentative):
                return  # a replay: this epoch committed before
            if tentative or self._rewind:
                fix_json_text(conn)
            if self.params.mode == "upsert":
                self._apply(conn, epoch, rows, tentative)
            elif tentative or self._rewind:
                self._journal().append_recorded(conn, epoch, rows, tentative)
            elif self.layout.tentative:
                flags = pa.repeat(pa.scalar(False), rows.num_rows)
                copy_rows(conn, target, [*self.layout.copy_types(), (TENTATIVE, "bool")],
                          rows.append_column(TENTATIVE, flags))
            else:
                copy_rows(conn, target, self.layout.copy_types(), rows)
            if self._rewind:
                self._journal().forget_before(conn, epoch - self.history + 1)

    def _claim(self, conn: psycopg.Connection[Any], epoch: int, tentative: bool) -> bool:
        """Insert the epoch's row into ``eddyline_epochs``; False if it was there (a replay,
        which must publish the epoch as its first attempt did)."""
        from psycopg import sql

        key = (*self._who, epoch)
        columns, values = ["network", "checkpoint", "sink", "epoch"], list(key)
        if self._marked:
            columns.append("tentative")
            values.append(tentative)
        if self.generation:  # who wrote the epoch: the lease generation
            columns.append("generation")
            values.append(self.generation)
        epochs = self._tables.beside(EPOCHS)
        cur = conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING").format(
                epochs, sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(sql.Placeholder() * len(values))), values)
        if not self._marked:
            return cur.rowcount == 1
        if cur.rowcount == 1:
            return True
        # a replay must publish the epoch as its first attempt did: a stable replay of a
        # tentative epoch would keep the tentative rows as if they were the epoch's output
        (was,) = conn.execute(
            sql.SQL("SELECT tentative FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s "
                    "AND epoch = %s").format(epochs), key,
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

    def _apply(self, conn: psycopg.Connection[Any], epoch: int, rows: pa.Table, tentative: bool) -> None:
        """Upsert mode. A tentative epoch first records the before-image of every key it
        touches, unless an earlier epoch of the stretch did; with ``rewind`` every epoch
        records them all."""
        assert self.layout is not None
        staged = stage_in_temp(conn, self.layout, rows, op=True)
        if tentative or self._rewind:
            self._journal().record_before_images(conn, staged, epoch, first_of_stretch=tentative)
        conn.execute(delete_statement(self._tables, self.layout, staged))
        conn.execute(upsert_statement(self._tables, self.layout, staged, tentative))
