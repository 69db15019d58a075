"""The undo journal of a ``postgres`` sink (``eddyline_undo``): what it takes to take epochs back
and to put them back, written in each epoch's own transaction.

Two users. Tentative epochs (Delay-Process-Correct, :mod:`eddyline.ha.dpc`): a correction takes
a whole stretch of them back at once, so upsert mode records only each key's first before-image
of the stretch, the row as the last stable epoch left it, and the records go with the
retraction. Replays and their undo (``rewind: true``, a network without ``max_delay``): every
epoch records what it wrote (append: its rows; upsert: each key's before-image), a replay takes
epochs back keeping each key's row as it found it (``after``) and marks the records with its own
epoch (``retracted_by``) instead of deleting them, so that undoing the replay can put it all back.
Records are kept for the network's ``history``.

Append rows carry no mark of their own, so taking them back deletes one row of equal values per
record (equal rows are interchangeable). Rows and before-images are JSON; the transactions that
write and read them fix the settings that shape its text (:func:`fix_json_text`), so a value
comes back exactly as it was and compares equal to itself. Every step finds nothing left to do
when it was done once already: a replayed epoch repeats them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from eddyline.errors import SinkError
from eddyline.io.postgres.fence import Who
from eddyline.io.postgres.layout import TENTATIVE, Layout
from eddyline.io.postgres.statements import EPOCHS, UNDO, Tables, idents, stage_in_temp

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


@dataclass(frozen=True)
class Journal:
    """One sink's records, in ``eddyline_undo`` beside its table. The methods that change the
    tables run inside the caller's transaction, which holds the fence."""

    tables: Tables
    who: Who
    layout: Layout
    upsert: bool

    @property
    def _undo(self) -> sql.Identifier:
        return self.tables.beside(UNDO)

    def _key(self, epoch: int) -> tuple[str, str, str, int]:
        return (*self.who, epoch)

    # -- recording, in the epoch's transaction ----------------------------------------------

    def record_before_images(self, conn: psycopg.Connection[Any], staged: sql.Identifier, epoch: int,
                             first_of_stretch: bool) -> None:
        """Upsert mode: the row of each key the staged rows touch, as it is (null: absent).
        ``first_of_stretch`` (tentative epochs): unless the key has a record already, which is
        older, from this stretch's first epoch to touch the key."""
        from psycopg import sql

        key = sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
            sql.SQL("{}, _s.{}").format(sql.Literal(k), sql.Identifier(k)) for k in self.layout.key))
        same_key = sql.SQL(" AND ").join(
            sql.SQL("_t.{k} = _s.{k}").format(k=sql.Identifier(k)) for k in self.layout.key)
        unrecorded = sql.SQL(
            "WHERE NOT EXISTS (SELECT 1 FROM {} AS _o WHERE _o.network = %s AND _o.checkpoint = %s "
            "AND _o.sink = %s AND _o.key = {}) "
        ).format(self._undo, key) if first_of_stretch else sql.SQL("")
        conn.execute(sql.SQL(
            "INSERT INTO {} (network, checkpoint, sink, epoch, key, image) "
            "SELECT %s, %s, %s, %s, {}, to_jsonb(_t.*) "
            "FROM {} AS _s LEFT JOIN {} AS _t ON {} {}ON CONFLICT DO NOTHING"
        ).format(self._undo, key, staged, self.tables.target(), same_key, unrecorded),
            (*self._key(epoch), *self.who) if first_of_stretch else self._key(epoch))

    def append_recorded(self, conn: psycopg.Connection[Any], epoch: int, rows: pa.Table, tentative: bool) -> None:
        """Append mode, a tentative epoch or one of a sink that rewinds: its rows are inserted
        (marked, if the table has the mark), and recorded."""
        from psycopg import sql

        names = idents(self.layout.names)
        staged = stage_in_temp(conn, self.layout, rows, op=False)
        if self.layout.tentative:
            conn.execute(sql.SQL("INSERT INTO {} ({}, {}) SELECT {}, {} FROM {}").format(
                self.tables.target(), names, sql.Identifier(TENTATIVE), names, sql.Literal(tentative), staged))
        else:
            conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                self.tables.target(), names, names, staged))
        conn.execute(sql.SQL(
            "INSERT INTO {} (network, checkpoint, sink, epoch, image) "
            "SELECT %s, %s, %s, %s, to_jsonb(_s.*) FROM {} AS _s"
        ).format(self._undo, staged), self._key(epoch))

    def forget_before(self, conn: psycopg.Connection[Any], floor: int) -> None:
        """The records no replay or undo can need any more: of epochs before ``floor``, unless
        a replay at ``floor`` or later took them back (its undo puts them back)."""
        from psycopg import sql

        conn.execute(sql.SQL(
            "DELETE FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s AND epoch < %s "
            "AND (retracted_by IS NULL OR retracted_by < %s)"
        ).format(self._undo), (*self.who, floor, floor))

    # -- taking epochs back: tentative ones, and those a replay runs again ---------------------

    def retract(self, conn: psycopg.Connection[Any], epochs: list[int], at_epoch: int) -> None:
        """Tentative ``epochs``, as a whole stretch: their rows go, and so do their records and
        their rows in ``eddyline_epochs``."""
        from psycopg import sql

        of_sink = sql.SQL("network = %s AND checkpoint = %s AND sink = %s")
        epochs_table = self.tables.beside(EPOCHS)
        # locked, so that a second driver retracting at the same time waits, then finds
        # nothing left to do
        published = [e for (e,) in conn.execute(
            sql.SQL("SELECT epoch FROM {} WHERE {} AND tentative ORDER BY epoch FOR UPDATE")
            .format(epochs_table, of_sink), self.who).fetchall()]
        left = [e for e in published if e not in epochs]
        if left:
            raise SinkError(
                f"sink '{self.who[2]}': epoch {at_epoch} retracts tentative epochs {epochs}, but "
                f"epochs {left} were published tentative too; a stretch of tentative epochs "
                "is taken back as a whole (the undo records keep each key as it was before "
                "the stretch), so nothing was retracted"
            )
        if not published:
            return
        fix_json_text(conn)
        where, args = self._records(published)
        if self.upsert:
            self._put_images(conn, "image", where, args)
        else:
            self._delete_recorded_rows(conn, where, args, only_tentative=True)
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} AND epoch = ANY(%s)").format(
            self._undo, of_sink), (*self.who, published))
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} AND tentative AND epoch = ANY(%s)").format(
            epochs_table, of_sink), (*self.who, published))

    def take_back(self, conn: psycopg.Connection[Any], epochs: list[int], at_epoch: int) -> None:
        """A replay: what the records of ``epochs`` say they wrote goes (upsert: each key's
        current row is kept with them first, as ``after``), and the records are marked as taken
        back by ``at_epoch`` rather than deleted, so that :meth:`put_back` can undo it."""
        from psycopg import sql

        # locked, so that a second driver taking them back at the same time waits, then
        # finds nothing left to do
        conn.execute(sql.SQL(
            "SELECT epoch FROM {} WHERE network = %s AND checkpoint = %s AND sink = %s "
            "AND epoch = ANY(%s) ORDER BY epoch FOR UPDATE"
        ).format(self.tables.beside(EPOCHS)), (*self.who, epochs))
        where, args = self._records(epochs)
        if not self._any(conn, where, args):
            return  # nothing written, or taken back by an earlier attempt
        fix_json_text(conn)
        if self.upsert:
            target = self.tables.target()
            same_key = sql.SQL(" AND ").join(
                sql.SQL("_t.{k} = _k.{k}").format(k=sql.Identifier(k)) for k in self.layout.key)
            conn.execute(sql.SQL(
                "UPDATE {} AS _u SET after = (SELECT to_jsonb(_t.*) FROM {} AS _t, "
                "jsonb_populate_record(NULL::{}, _u.key) AS _k WHERE {}) WHERE {}"
            ).format(self._undo, target, target, same_key, where), args)
            self._put_images(conn, "image", where, args)
        else:
            self._delete_recorded_rows(conn, where, args, only_tentative=False)
        conn.execute(sql.SQL("UPDATE {} AS _u SET retracted_by = %s WHERE {}").format(self._undo, where),
                     (at_epoch, *args))

    def put_back(self, conn: psycopg.Connection[Any], at_epoch: int) -> None:
        """Undoing the replay ``at_epoch``: what it took back is written again (upsert: each
        key's row as the replay found it), and the records are in force again."""
        from psycopg import sql

        where, args = self._records(retracted_by=at_epoch)
        conn.execute(sql.SQL(
            "SELECT e.epoch FROM {} AS e WHERE e.network = %s AND e.checkpoint = %s AND e.sink = %s "
            "AND e.epoch IN (SELECT _u.epoch FROM {} AS _u WHERE {}) ORDER BY e.epoch FOR UPDATE"
        ).format(self.tables.beside(EPOCHS), self._undo, where), (*self.who, *args))
        if not self._any(conn, where, args):
            return  # nothing taken back, or put back by an earlier attempt
        fix_json_text(conn)
        if self.upsert:
            self._put_images(conn, "after", where, args)
        else:
            target = self.tables.target()
            conn.execute(sql.SQL(
                "INSERT INTO {} ({}) SELECT {} FROM {} AS _u, jsonb_populate_record(NULL::{}, _u.image) AS _r "
                "WHERE {}"
            ).format(target, idents(self.layout.names),
                     sql.SQL(", ").join(sql.SQL("_r.{}").format(sql.Identifier(n)) for n in self.layout.names),
                     self._undo, target, where), args)
        conn.execute(sql.SQL("UPDATE {} AS _u SET retracted_by = NULL, after = NULL WHERE {}").format(
            self._undo, where), args)

    def _records(self, epochs: list[int] | None = None, retracted_by: int | None = None) -> tuple[sql.Composed, tuple[Any, ...]]:
        """The condition on ``eddyline_undo AS _u`` that picks this sink's records of ``epochs``
        that are in force, or (``retracted_by``) those that epoch took back; and its arguments."""
        from psycopg import sql

        of_sink = sql.SQL("_u.network = %s AND _u.checkpoint = %s AND _u.sink = %s AND ")
        if retracted_by is None:
            return of_sink + sql.SQL("_u.epoch = ANY(%s) AND _u.retracted_by IS NULL"), (*self.who, epochs)
        return of_sink + sql.SQL("_u.retracted_by = %s"), (*self.who, retracted_by)

    def _any(self, conn: psycopg.Connection[Any], where: sql.Composed, args: tuple[Any, ...]) -> bool:
        from psycopg import sql

        return conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} AS _u WHERE {})").format(
            self._undo, where), args).fetchone() == (True,)

    def _put_images(self, conn: psycopg.Connection[Any], image: str, where: sql.Composed, args: tuple[Any, ...]) -> None:
        """Upsert mode: the current row of every key the records ``where`` picks goes, and the
        row their column ``image`` holds comes back (null: none), whole (columns the sink does
        not write too; generated ones are computed again). A key recorded by several epochs
        gets its earliest epoch's: the row as it was before all of them."""
        from psycopg import sql

        target, records = self.tables.target(), self._undo
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
            (self.tables.table.lower(),)).fetchall()]
        conn.execute(sql.SQL(
            "INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM (SELECT DISTINCT ON (_u.key) "
            "_u.{} AS _row FROM {} AS _u WHERE {} ORDER BY _u.key, _u.epoch) AS _p, "
            "jsonb_populate_record({}, _p._row) AS _r WHERE _p._row IS NOT NULL"
        ).format(target, idents(columns),
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
        ).format(undo=self._undo, where=where, values=values, target=self.tables.target(), marked=marked), args)


def rewind_problem(
    conn: psycopg.Connection[Any], tables: Tables, who: Who, epochs: range, restore: int | None, history: int
) -> str | None:
    """Epochs in ``epochs`` the sink ``who`` wrote without keeping their records, or a replay
    ``restore`` whose records are gone (``history`` epochs ago)."""
    from psycopg import sql

    sink = who[2]
    has_epochs, has_undo = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        (tables.beside_name(EPOCHS), tables.beside_name(UNDO)),
    ).fetchone() or (False, False)
    if not has_epochs:
        return None  # it wrote nothing yet
    epochs_table = tables.beside(EPOCHS)
    of_sink = sql.SQL("e.network = %s AND e.checkpoint = %s AND e.sink = %s")
    unrecorded = sql.SQL(
        "AND NOT EXISTS (SELECT 1 FROM {} AS _u WHERE _u.network = e.network AND _u.checkpoint = "
        "e.checkpoint AND _u.sink = e.sink AND _u.epoch = e.epoch)"
    ).format(tables.beside(UNDO)) if has_undo else sql.SQL("")
    missing = [e for (e,) in conn.execute(sql.SQL(
        "SELECT e.epoch FROM {} AS e WHERE {} AND e.epoch BETWEEN %s AND %s {} ORDER BY e.epoch"
    ).format(epochs_table, of_sink, unrecorded), (*who, epochs[0], epochs[-1])).fetchall()]
    if missing:
        return (
            f"sink '{sink}' kept no record of what epoch(s) {_listed(missing)} wrote into "
            f"{tables.table}, so it cannot take them back (it keeps records since it has "
            f"rewind: true, for the last {history} epochs)"
        )
    if restore is not None:
        (latest,) = conn.execute(sql.SQL("SELECT max(e.epoch) FROM {} AS e WHERE {}").format(
            epochs_table, of_sink), who).fetchone() or (None,)
        if latest is not None and restore < latest - history + 1:
            return (
                f"sink '{sink}' no longer keeps what epoch {restore} took back from "
                f"{tables.table} (it keeps that for the last {history} epochs)"
            )
    return None


def fix_json_text(conn: psycopg.Connection[Any]) -> None:
    """For the rest of the transaction, the settings that shape the JSON text of values as the
    undo records need it: exact floats, one time zone, one bytea format; so a value goes into
    JSON and back unchanged, and the same value has the same JSON in every session."""
    conn.execute(
        "SELECT set_config('TimeZone', 'UTC', true), set_config('extra_float_digits', '3', true),"
        " set_config('bytea_output', 'hex', true)"
    )


def _listed(epochs: list[int]) -> str:
    """``epochs`` for a message: all of them, or the first and last of many."""
    if len(epochs) <= 6:
        return ", ".join(map(str, epochs))
    return f"{epochs[0]}, {epochs[1]}, ... {epochs[-1]} ({len(epochs)} epochs)"
