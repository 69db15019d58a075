"""The fence of a ``postgres`` sink under a lease (:mod:`eddyline.ha.lease`): a row per (network,
checkpoint, sink) in ``eddyline_fence`` names the newest lease generation that writes there. A
driver that takes the lease over raises it before it writes anything; every transaction that
writes first holds that row ``FOR SHARE`` and refuses if it names a newer generation. So the
check happens inside the transaction that writes: a driver frozen past its lease has its epoch
refused by the database, and one in flight when the new driver takes over commits before the new
driver's fence (which waits for its lock) and is replayed by it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eddyline.errors import Fenced
from eddyline.io.postgres.statements import FENCE, Tables

if TYPE_CHECKING:
    import psycopg

#: a sink's row in the bookkeeping tables: (network, checkpoint, sink)
Who = tuple[str, str, str]


def raise_fence(conn: psycopg.Connection[Any], tables: Tables, who: Who, generation: int) -> int:
    """Make ``generation`` the newest that writes here (waiting for a transaction of an older
    one in flight); returns the newest, which is greater if a newer one did first."""
    from psycopg import sql

    (newest,) = conn.execute(sql.SQL(
        "INSERT INTO {} AS f (network, checkpoint, sink, generation) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (network, checkpoint, sink) DO UPDATE SET generation = GREATEST(f.generation, "
        "EXCLUDED.generation), fenced_at = now() RETURNING generation"
    ).format(tables.beside(FENCE)), (*who, generation)).fetchone()
    return int(newest)


def newer_holder(conn: psycopg.Connection[Any], tables: Tables, who: Who, generation: int) -> int | None:
    """Inside a transaction that writes: hold the fence row (a driver taking the lease over
    waits until this transaction ends); the generation that holds it if newer than ours."""
    from psycopg import sql

    row = conn.execute(sql.SQL(
        "SELECT generation FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s FOR SHARE"
    ).format(tables.beside(FENCE)), who).fetchone()
    return row[0] if row is not None and row[0] > generation else None


def fenced(sink: str, generation: int, newer: int, tables: Tables, server: str) -> Fenced:
    return Fenced(f"sink '{sink}': lease generation {generation} was taken over by generation "
                  f"{newer}: table {tables.table} at {server} refuses its writes; stopping without "
                  "writing anything more")
