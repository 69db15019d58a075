"""An epoch's rows as a ``postgres`` sink sends them. Upsert mode turns them into one action per
key (upsert or delete): revisions summed per row first, so that an aggregate's "old row out, new
row in" becomes one update, and a summed weight other than ±1 refused (a keyed table holds one
row per key). The rows are made once per epoch, so a retry sends the same."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import DIFF
from eddyline.errors import SinkError
from eddyline.io.postgres.layout import Layout
from eddyline.io.postgres.statements import ACTION, DELETE, UPSERT
from eddyline.operators.rows import consolidated


def rows_to_send(staged: pa.Table, layout: Layout, upsert: bool, sink: str) -> pa.Table:
    """The layout's columns in its order (the action last in upsert mode)."""
    if not upsert:
        return staged.select(layout.names)
    if layout.changelog:
        staged = as_actions(staged, layout, sink)
    else:
        staged = staged.append_column(ACTION, pa.array([UPSERT] * staged.num_rows, pa.string()))
    return last_per_key(staged, layout.key).select([*layout.names, ACTION])


def as_actions(staged: pa.Table, layout: Layout, sink: str) -> pa.Table:
    """Revisions → one action per row: summed per row (what cancels goes), deletes before
    upserts (so that an old row out and a new row in of one key leave the new row)."""
    names = layout.names
    summed = consolidated(staged.select([*names, DIFF]))
    weight = summed.column(DIFF)
    odd = summed.filter(pc.greater(pc.abs(weight), 1))
    if odd.num_rows:
        row = {n: odd.column(n)[0].as_py() for n in names}
        raise SinkError(
            f"sink '{sink}': row {row} weighs {odd.column(DIFF)[0].as_py()} once the "
            f"epoch's revisions are summed; a table keyed by ({', '.join(layout.key)}) holds "
            "one row per key"
        )
    deletes = pc.less(weight, 0)
    ordered = summed.take(pc.sort_indices(pa.table({"d": pc.invert(deletes)}), [("d", "ascending")]))
    action = pc.if_else(pc.less(ordered.column(DIFF), 0), DELETE, UPSERT)
    return ordered.select(names).append_column(ACTION, action)


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
