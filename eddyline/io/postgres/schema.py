"""The tables a ``postgres`` sink needs, made or checked when it opens: the target table
(created from the layout, or checked to fit it: types, unmet NOT NULL columns, a unique index on
the key for upsert) and the bookkeeping tables beside it. Tables made by earlier versions are
brought up to date here, with columns added and constraints changed in place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eddyline.errors import SinkError
from eddyline.io.postgres.layout import TENTATIVE, Layout
from eddyline.io.postgres.statements import EPOCHS, FENCE, UNDO, Tables, idents

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


def prepare(
    conn: psycopg.Connection[Any], tables: Tables, layout: Layout, sink: str, upsert: bool,
    fenced: bool, keeps_undo: bool,
) -> bool:
    """Make or check every table the sink writes, in one transaction: the epochs' table, the
    fence's (``fenced``: under a lease), the undo journal (``keeps_undo``) and the target.
    Returns whether the epochs' table marks tentative epochs."""
    from psycopg import sql

    epochs = tables.beside(EPOCHS)
    with conn.transaction():
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (network text, checkpoint text, sink text, epoch bigint, "
            "committed_at timestamptz DEFAULT now(), tentative boolean NOT NULL DEFAULT false, "
            "PRIMARY KEY (network, checkpoint, sink, epoch))"
        ).format(epochs))
        if fenced:
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (network text, checkpoint text, sink text, generation bigint "
                "NOT NULL, fenced_at timestamptz DEFAULT now(), PRIMARY KEY (network, checkpoint, sink))"
            ).format(tables.beside(FENCE)))
            if not has_column(conn, tables, EPOCHS, "generation"):  # made before epochs said who wrote them
                conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS generation bigint").format(epochs))
        marked = has_column(conn, tables, EPOCHS, TENTATIVE)
        if layout.tentative and not marked:  # made by a version that knew no tentative epochs
            conn.execute(sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS tentative boolean NOT NULL DEFAULT false"
            ).format(epochs))
            marked = True
        if keeps_undo:
            _prepare_undo(conn, tables)
        oid = conn.execute("SELECT to_regclass(%s)::oid", (tables.table.lower(),)).fetchone()
        if oid is None or oid[0] is None:
            conn.execute(_create_table(tables, layout))
            return marked
        _check_columns(conn, tables, layout, sink, oid[0])
        if upsert:
            _check_unique(conn, tables, layout, sink, oid[0])
    return marked


def has_column(conn: psycopg.Connection[Any], tables: Tables, table: str, column: str) -> bool:
    """Whether the bookkeeping table ``table`` (see :meth:`Tables.beside`) has ``column``."""
    return conn.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s)"
        " AND attname = %s AND NOT attisdropped", (tables.beside_name(table), column),
    ).fetchone() == (1,)


def _prepare_undo(conn: psycopg.Connection[Any], tables: Tables) -> None:
    """``eddyline_undo`` as this version writes it: a record per epoch and key (upsert) or
    row (append, no key), and what a replay took back, by the epoch that did."""
    from psycopg import sql

    records = tables.beside(UNDO)
    conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (network text NOT NULL, checkpoint text NOT NULL, "
        "sink text NOT NULL, epoch bigint NOT NULL, key jsonb, image jsonb, retracted_by bigint, "
        "after jsonb, UNIQUE (network, checkpoint, sink, epoch, key))"
    ).format(records))
    # made by a version without replays (the check takes no lock when there is nothing to do)
    if not has_column(conn, tables, UNDO, "retracted_by"):
        conn.execute(sql.SQL(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS retracted_by bigint, ADD COLUMN IF NOT EXISTS after jsonb"
        ).format(records))
    # that version kept one record per key (a stretch of tentative epochs' first): now one
    # per key and epoch, the first of a stretch chosen when it is written
    for (name,) in conn.execute(
        "SELECT c.conname FROM pg_constraint c WHERE c.conrelid = to_regclass(%s) AND c.contype = 'u'"
        " AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a"
        " WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey))"
        " = ARRAY['checkpoint', 'key', 'network', 'sink']", (tables.beside_name(UNDO),),
    ).fetchall():
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}, ADD UNIQUE (network, checkpoint, sink, epoch, key)")
                     .format(records, sql.Identifier(name)))


def _create_table(tables: Tables, layout: Layout) -> sql.Composed:
    from psycopg import sql

    parts = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type)) for c in layout.columns]
    if layout.tentative:
        parts.append(sql.SQL("{} boolean NOT NULL DEFAULT false").format(sql.Identifier(TENTATIVE)))
    if layout.key:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(idents(layout.key)))
    return sql.SQL("CREATE TABLE {} ({})").format(tables.target(), sql.SQL(", ").join(parts))


def _check_columns(conn: psycopg.Connection[Any], tables: Tables, layout: Layout, sink: str, oid: int) -> None:
    found = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull,"
        " atthasdef OR attidentity <> '' OR attgenerated <> ''"
        " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (oid,),
    ).fetchall()
    problems = column_problems(layout, {r[0]: (r[1], r[2], r[3]) for r in found})
    if problems:
        raise SinkError(f"sink '{sink}': table {tables.table} does not fit its input: " + "; ".join(problems))


def _check_unique(conn: psycopg.Connection[Any], tables: Tables, layout: Layout, sink: str, oid: int) -> None:
    # ON CONFLICT (key) needs a unique index on exactly the key columns, not partial
    uniques = conn.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a"
        " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL"
        " AND i.indexprs IS NULL GROUP BY i.indexrelid",
        (oid,),
    ).fetchall()
    if not any(sorted(u[0]) == sorted(layout.key) for u in uniques):
        key = ", ".join(layout.key)
        raise SinkError(
            f"sink '{sink}': table {tables.table} has no primary key or unique "
            f"constraint on exactly ({key}), which upsert needs; add one "
            f"(ALTER TABLE {tables.table} ADD PRIMARY KEY ({key}))"
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
