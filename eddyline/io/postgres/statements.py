"""The SQL of an epoch's write: the tables a sink names, rows sent by COPY, and the set-based
statements that apply a staged epoch to the target table. Built with :mod:`psycopg.sql` so that
every name is quoted; psycopg is imported when a statement is built, not when Eddyline starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from eddyline.io.postgres.layout import TENTATIVE, Layout

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

#: the bookkeeping tables beside the target table: which epochs were written, the undo
#: journal, and the newest lease generation that writes there
EPOCHS = "eddyline_epochs"
UNDO = "eddyline_undo"
FENCE = "eddyline_fence"
_STAGED = "eddyline_staged"
#: the staged rows' action column (upsert mode): what to do with the row's key
ACTION = "eddyline_action"
UPSERT, DELETE = "upsert", "delete"


@dataclass(frozen=True)
class Tables:
    """The target table and the bookkeeping tables beside it, in its schema."""

    table: str  # as configured, validated as an SQL name

    def target(self) -> sql.Identifier:
        from psycopg import sql

        # validated as an SQL name: lower-cased, it is what PostgreSQL makes of it unquoted
        return sql.Identifier(*self.table.lower().split("."))

    def beside(self, name: str) -> sql.Identifier:
        """A bookkeeping table in the target table's schema."""
        from psycopg import sql

        return sql.Identifier(*self.table.lower().split(".")[:-1], name)

    def beside_name(self, name: str) -> str:
        """:meth:`beside`'s table as ``to_regclass`` takes it."""
        return ".".join([*self.table.lower().split(".")[:-1], name])


def idents(columns: Sequence[str]) -> sql.Composed:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(c) for c in columns)


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


def copy_rows(
    conn: psycopg.Connection[Any], table: sql.Identifier, columns: list[tuple[str, str]], rows: pa.Table
) -> None:
    """``rows`` (the ``columns``, in their order) into ``table`` by one COPY: as CSV that
    Arrow writes, or, when a column is binary (bytea's text form is one CSV would need
    made by hand), row by row in COPY's binary format, which costs the driver several
    times the CPU."""
    from psycopg import sql

    binary = any(t == "bytea" for _, t in columns)
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
        table, idents([n for n, _ in columns]), sql.SQL("BINARY" if binary else "CSV")
    )
    with conn.cursor() as cur, cur.copy(statement) as copy:
        if not binary:
            copy.write(copy_csv(rows))
            return
        copy.set_types([t for _, t in columns])
        for row in zip(*(c.to_pylist() for c in rows.columns), strict=True):
            copy.write_row(row)


def stage_in_temp(conn: psycopg.Connection[Any], layout: Layout, rows: pa.Table, op: bool) -> sql.Identifier:
    """The epoch's rows in a temporary table with the layout's columns (and ``_op``), gone
    at commit: set-based statements then apply them, whatever their number."""
    from psycopg import sql

    staged = sql.Identifier(_STAGED)
    defs = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type)) for c in layout.columns]
    if op:
        defs.append(sql.SQL("{} text").format(sql.Identifier(ACTION)))
    conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(
        staged, sql.SQL(", ").join(defs)))
    copy_rows(conn, staged, [*layout.copy_types(), *([(ACTION, "text")] if op else [])], rows)
    return staged


def delete_statement(tables: Tables, layout: Layout, staged: sql.Identifier) -> sql.Composed:
    """Upsert mode: the keys the staged rows delete go."""
    from psycopg import sql

    same_key = sql.SQL(" AND ").join(
        sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in layout.key
    )
    return sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE {} AND s.{} = {}").format(
        tables.target(), staged, same_key, sql.Identifier(ACTION), sql.Literal(DELETE))


def upsert_statement(tables: Tables, layout: Layout, staged: sql.Identifier, tentative: bool = False) -> sql.Composed:
    """Upsert mode: the staged rows that are not deletes, inserted or updated by key."""
    from psycopg import sql

    others = [n for n in layout.names if n not in layout.key]
    columns, values = idents(layout.names), idents(layout.names)
    if layout.tentative:  # every row the epoch writes says which kind of epoch it was
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
        tables.target(), columns, values, staged,
        sql.Identifier(ACTION), sql.Literal(DELETE), idents(layout.key), on_conflict,
    )
