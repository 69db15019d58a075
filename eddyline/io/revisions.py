"""Revised inputs: a source whose records carry an ``_op`` or a ``_diff`` column.

Eddyline's revisions are weighted rows (a Z-set, docs/revisions.md): ``_diff`` = +n inserts n
copies of the row, −n takes n copies back. A source may carry them either way:

* ``_diff``: an integer weight, used as it is;
* ``_op``: a change kind per row, as Flink's changelogs write them: ``+I`` and ``+U`` weigh +1,
  ``-U`` and ``-D`` weigh −1 (``insert`` and ``delete`` are accepted too, in any case). A
  ``-U``/``+U`` pair is a replace: the old row out, the new one in.

Either way the source's frame leaves here with a ``_diff bigint`` column and no ``_op``. A row
whose weight is missing, zero or not an integer, or whose ``_op`` is none of those, is a dead
letter with the reason; it is never guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from eddyline.columns import DIFF, OP
from eddyline.errors import SpecError
from eddyline.io.sources import Frames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: ``_op`` value (upper case) → weight
OPS = {"+I": 1, "+U": 1, "-U": -1, "-D": -1, "INSERT": 1, "DELETE": -1}
BAD = "_bad_weight"


def weighted(frames: Frames, source: str, observe: Callable[[DataFrame], DataFrame] | None = None) -> Frames:
    """``frames`` with its revisions as ``_diff`` (unchanged when the rows carry none); rows
    without a valid weight join the dead letters. ``observe(df)`` may count them (column
    ``_bad_weight``) on the way."""
    df = frames.data
    if OP not in df.columns and DIFF not in df.columns:
        return frames
    if OP in df.columns and DIFF in df.columns:
        raise SpecError(f"source '{source}': its rows carry both {OP} and {DIFF}; keep one of them")
    if OP in df.columns:
        cases = " ".join(f"WHEN '{op}' THEN {w}" for op, w in OPS.items())
        weight = f"CASE upper(CAST(`{OP}` AS STRING)) {cases} END"
        reason = (
            f"concat('field ''{OP}'': expected one of {', '.join(OPS)}, got ', "
            f"coalesce(substring(CAST(`{OP}` AS STRING), 1, 40), 'null'))"
        )
    else:
        weight = f"try_cast(`{DIFF}` AS BIGINT)"
        reason = (
            f"concat('field ''{DIFF}'': expected a non-zero integer weight, got ', "
            f"coalesce(substring(CAST(`{DIFF}` AS STRING), 1, 40), 'null'))"
        )
    if DIFF in df.columns:  # a float or text weight must be a whole number to be taken
        weight = f"CASE WHEN CAST(`{DIFF}` AS DOUBLE) = CAST({weight} AS DOUBLE) THEN {weight} END"
    marked = df.selectExpr("*", f"{weight} AS __w").selectExpr("*", f"coalesce(__w = 0, true) AS {BAD}")
    if observe is not None:
        marked = observe(marked)
    user = [c for c in df.columns if c not in (OP, DIFF)]
    data = marked.where(f"NOT {BAD}").selectExpr(*[f"`{c}`" for c in user], f"__w AS {DIFF}")
    dead = marked.where(BAD).selectExpr(
        f"'{source}' AS source",
        "CAST(NULL AS STRING) AS file",
        "CAST(NULL AS BIGINT) AS line",
        f"to_json(struct({', '.join(f'`{c}`' for c in df.columns)})) AS raw",
        f"{reason} AS reason",
    )
    letters = dead if frames.dead_letters is None else _union(frames.dead_letters, dead)
    return Frames(data, letters)


def _union(a: DataFrame, b: DataFrame) -> DataFrame:
    b = b.selectExpr(*[f"CAST(`{f.name}` AS {f.dataType.simpleString()}) AS `{f.name}`" for f in a.schema])
    return a.unionByName(b)
