"""Revised inputs: a source whose records carry an ``_op`` or a ``_diff`` column.

Eddyline's revisions are weighted rows (a Z-set, docs/revisions.md): ``_diff`` = +n inserts n
copies of the row, −n takes n copies back. A source may carry them either way:

* ``_diff``: an integer weight, used as it is;
* ``_op``: a change kind per row, as Flink's changelogs write them: ``+I`` and ``+U`` weigh +1,
  ``-U`` and ``-D`` weigh −1 (``insert`` and ``delete`` are accepted too, in any case). A
  ``-U``/``+U`` pair is a replace: the old row out, the new one in.

Either way the source's frame leaves here with a ``_diff bigint`` column and no ``_op``. A row
whose weight is missing, zero or not an integer, or whose ``_op`` is none of those, is a dead
letter with the reason; it is never guessed. Resident lanes weigh their rows in Arrow
(:func:`arrow_weighted`), the same rows bad and their letters worded as Spark words them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def arrow_weight_problem(schema: pa.Schema, source: str) -> str | None:
    """Why the revisions of a slice of ``schema`` cannot be weighed outside Spark, as
    :func:`arrow_weighted` weighs them (None: they can, or there are none): a ``_op`` must be
    text, a ``_diff`` a whole or a DOUBLE number (Spark parses a weight out of text by rules of
    its own), and every column of a type whose dead letters read here as Spark's JSON writes
    them (:func:`weight_letters`)."""
    names = schema.names
    if OP not in names and DIFF not in names:
        return None
    if OP in names and DIFF in names:
        return f"source '{source}': its rows carry both {OP} and {DIFF}; keep one of them"
    if OP in names and not _is_text(schema.field(OP).type):
        return f"source '{source}': field '{OP}' is {schema.field(OP).type}: Spark weighs it (resident lanes: text)"
    if DIFF in names:
        t = schema.field(DIFF).type
        if not (pa.types.is_signed_integer(t) or pa.types.is_float64(t)):
            return f"source '{source}': field '{DIFF}' is {t}: Spark weighs it (resident lanes: integers and doubles)"
    for f in schema:
        if not _worded(f.type):
            return (f"source '{source}': column '{f.name}' is {f.type}: the dead letters of its revisions are "
                    "worded by Spark (resident lanes: integers, doubles, booleans, text, dates, UTC timestamps)")
    return None


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _worded(t: pa.DataType) -> bool:
    return (pa.types.is_signed_integer(t) or pa.types.is_float64(t) or pa.types.is_boolean(t) or _is_text(t)
            or pa.types.is_date32(t) or pa.types.is_null(t)
            or pa.types.is_timestamp(t) and t.tz in ("UTC", "+00:00", "Z"))


def arrow_weighted(data: pa.Table, source: str) -> tuple[pa.Table, pa.Table | None]:
    """:func:`weighted` on Arrow (resident lanes): ``data`` with its revisions as ``_diff`` (an INT
    from ``_op``, a BIGINT from ``_diff``, as Spark types them) after the other columns, and the
    dead letters of the rows without a valid weight, worded as Spark words them (None: none).
    As it is when the rows carry no revisions."""
    if OP not in data.column_names and DIFF not in data.column_names:
        return data, None
    problem = arrow_weight_problem(data.schema, source)
    if problem is not None:
        raise SpecError(problem)
    if OP in data.column_names:
        ops = pc.utf8_upper(data.column(OP).combine_chunks().cast(pa.string()))
        weight = np.zeros(data.num_rows, np.int64)
        for op, w in OPS.items():
            weight[pc.fill_null(pc.equal(ops, op), False).to_numpy(zero_copy_only=False)] = w
        typed = pa.int32()
    else:
        column = data.column(DIFF).combine_chunks()
        if pa.types.is_floating(column.type):  # a whole number in BIGINT's range only
            d = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
            whole = np.isfinite(d) & (np.floor(d) == d) & (d >= -(2.0 ** 63)) & (d < 2.0 ** 63)
            weight = np.where(whole, d, 0).astype(np.int64)
        else:
            weight = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        typed = pa.int64()
    good = weight != 0  # (a null weight is 0 here: bad either way)
    user = [c for c in data.column_names if c not in (OP, DIFF)]
    kept = data.filter(pa.array(good)).select(user)
    kept = kept.append_column(pa.field(DIFF, typed), pa.array(weight[good]).cast(typed))
    return kept, (None if good.all() else weight_letters(data.filter(pa.array(~good)), source))


def weight_letters(rows: pa.Table, source: str) -> pa.Table:
    """The dead letters of ``rows`` of ``source``, which carry no valid weight, as :func:`weighted`
    has Spark word them: the row as ``to_json`` writes it (null fields left out, timestamps in
    UTC to the millisecond), the reason with the value as ``CAST(... AS STRING)`` gives it."""
    field = OP if OP in rows.column_names else DIFF
    expected = f"one of {', '.join(OPS)}" if field == OP else "a non-zero integer weight"
    columns = [(name, rows.column(name).to_pylist(), rows.schema.field(name).type) for name in rows.column_names]
    raws, reasons = [], []
    for i in range(rows.num_rows):
        raws.append("{" + ",".join(f"{_text(name)}:{_json(v[i], t)}" for name, v, t in columns if v[i] is not None) + "}")
        value = rows.column(field)[i].as_py()
        said = "null" if value is None else _spark_string(value, rows.schema.field(field).type)[:40]
        reasons.append(f"field '{field}': expected {expected}, got {said}")
    n = rows.num_rows
    return pa.table({"source": pa.array([source] * n, pa.string()), "file": pa.nulls(n, pa.string()),
                     "line": pa.nulls(n, pa.int64()), "raw": pa.array(raws, pa.string()),
                     "reason": pa.array(reasons, pa.string())})


def _spark_string(value: object, t: pa.DataType) -> str:
    """``CAST(value AS STRING)`` as Spark gives it, for the types :func:`_worded` takes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _java_double(value)
    if pa.types.is_timestamp(t):
        return value.strftime("%Y-%m-%d %H:%M:%S") + (f".{value.microsecond:06d}".rstrip("0") if value.microsecond else "")
    return str(value)


def _java_double(x: float) -> str:
    """Java's ``Double.toString`` (the shortest digits that read back): fixed from 10^-3 to 10^7,
    else ``d.dddE<n>``."""
    if x != x:
        return "NaN"
    if abs(x) == float("inf"):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        return repr(x)  # (Python writes these fixed, as Java)
    for places in range(17):
        text = f"{abs(x):.{places}e}"
        if float(text) == abs(x):
            break
    mantissa, exp = text.split("e")
    return f"{'-' if x < 0 else ''}{mantissa if '.' in mantissa else mantissa + '.0'}E{int(exp)}"


def _json(value: object, t: pa.DataType) -> str:
    """One value as Spark's ``to_json`` writes it (Jackson)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _java_double(value) if value == value and abs(value) != float("inf") else f'"{_java_double(value)}"'
    if pa.types.is_timestamp(t):
        return f'"{value.strftime("%Y-%m-%dT%H:%M:%S")}.{value.microsecond // 1000:03d}Z"'
    if pa.types.is_date32(t):
        return f'"{value.isoformat()}"'
    return _text(str(value))


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _text(text: str) -> str:
    """A JSON string as Jackson writes it: quotes, backslashes and control characters escaped
    (``\\u00XX`` in upper case), the rest as it is."""
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if c < " " else c) for c in text) + '"'
