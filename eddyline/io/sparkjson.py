"""Records as Spark writes them, made from Arrow rows outside Spark.

The ``kafka`` and ``nats`` sinks send each row as the JSON object Spark's ``to_json`` gives
(:func:`eddyline.io.records.to_json_column`) and a Kafka record's key as Spark's ``CAST(... AS
STRING)`` (or ``to_json(array(...))`` of several columns). A resident epoch has no DataFrame: its
rows come back from the lanes as Arrow, and these functions give the very same text, so that a
checkpoint that changes mode between runs (or an ``auto`` network) sends one kind of record:

* fields in column order, null fields left out (Spark's ``ignoreNullFields``);
* instants as ``yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX`` in UTC (``…T12:00:00.250000Z``), dates as
  ``yyyy-MM-dd``; in a key (a cast to text) ``yyyy-MM-dd HH:mm:ss[.fraction]``;
* doubles as Java's ``Double.toString`` (``1.0E7``, ``1.0E-4``, ``0.001``), which Jackson writes
  (``"NaN"`` and ``"Infinity"`` quoted); strings with JSON's escapes only (no ``\\uXXXX`` for non-ASCII text);
* binary as base64, decimals as written, lists, structs and maps nested alike.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def java_double(x: float, single: bool = False) -> str:
    """``x`` as Java's ``Double.toString`` (``Float.toString`` with ``single``) writes it: the
    shortest digits that read back as ``x``, in plain notation from 10^-3 up to 10^7 and as
    ``d.dddE±n`` outside."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    shortest = np.format_float_scientific(np.float32(x) if single else x, unique=True, trim="-")
    digits, _, exp = shortest.lstrip("-").partition("e")
    mantissa, exponent = digits.replace(".", ""), int(exp)
    sign = "-" if x < 0 else ""
    if -3 <= exponent < 7:
        if exponent >= 0:
            whole, frac = mantissa[: exponent + 1].ljust(exponent + 1, "0"), mantissa[exponent + 1:]
        else:
            whole, frac = "0", "0" * (-exponent - 1) + mantissa
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{mantissa[0]}.{mantissa[1:] or '0'}E{exponent}"


def _instant(micros: int) -> str:
    t = _EPOCH + dt.timedelta(microseconds=micros)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond:06d}Z"


def _cast_instant(micros: int) -> str:
    """An instant cast to text by Spark: ``yyyy-MM-dd HH:mm:ss``, then the fraction without its
    trailing zeros."""
    t = _EPOCH + dt.timedelta(microseconds=micros)
    frac = f"{t.microsecond:06d}".rstrip("0")
    return t.strftime("%Y-%m-%d %H:%M:%S") + (f".{frac}" if frac else "")


def _values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """The column's values as Python values the writers below take: instants as microseconds
    since the epoch (the column cast to ``timestamp[us]``), the rest as ``to_pylist`` gives them."""
    t = column.type
    if pa.types.is_timestamp(t):
        return column.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64()).to_pylist()
    return column.to_pylist()


def _writer(t: pa.DataType) -> Callable[[Any], str]:
    """How a JSON value of Arrow type ``t`` is written (for a non-null value)."""
    if pa.types.is_boolean(t):
        return lambda v: "true" if v else "false"
    if pa.types.is_integer(t):
        return str
    if pa.types.is_floating(t):
        single = pa.types.is_float32(t) or pa.types.is_float16(t)
        # (Jackson quotes NaN and the infinities: they are not JSON numbers)
        return lambda v: java_double(v, single) if math.isfinite(v) else f'"{java_double(v)}"'
    if pa.types.is_decimal(t):
        return lambda v: format(v, "f")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda v: json.dumps(v, ensure_ascii=False)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return lambda v: json.dumps(base64.b64encode(v).decode())
    if pa.types.is_timestamp(t):
        return lambda v: json.dumps(_instant(v if isinstance(v, int) else _to_micros(v)))
    if pa.types.is_date(t):
        return lambda v: json.dumps(v.isoformat())
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = _nullable(_writer(t.value_type))
        return lambda v: "[" + ",".join(item(x) for x in v) + "]"
    if pa.types.is_struct(t):
        fields = [(f.name, json.dumps(f.name, ensure_ascii=False), _writer(f.type)) for f in t]
        return lambda v: "{" + ",".join(f"{quoted}:{write(v[name])}" for name, quoted, write in fields
                                        if v[name] is not None) + "}"
    if pa.types.is_map(t):
        key, item = _writer(t.key_type), _nullable(_writer(t.item_type))
        return lambda v: "{" + ",".join(f"{_as_key(key(k))}:{item(x)}" for k, x in v) + "}"
    raise TypeError(f"no JSON text for Arrow type {t}")


def _to_micros(v: dt.datetime) -> int:
    """A nested instant (``to_pylist`` gives it as a datetime) as microseconds since the epoch."""
    if v.tzinfo is None:
        v = v.replace(tzinfo=dt.UTC)
    delta = v - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _nullable(write: Callable[[Any], str]) -> Callable[[Any], str]:
    """Inside a list or a map a null stays (as ``null``)."""
    return lambda v: "null" if v is None else write(v)


def _as_key(text: str) -> str:
    """A map's key as a JSON object's key: Spark writes it as text."""
    return text if text.startswith('"') else json.dumps(text)


def json_records(table: pa.Table) -> list[str]:
    """Each row of ``table`` as the JSON object Spark's ``to_json(struct(*))`` gives (see the
    module)."""
    names = [json.dumps(name, ensure_ascii=False) for name in table.column_names]
    writers = [_writer(f.type) for f in table.schema]
    columns = [_values(c) for c in table.columns]
    out = []
    for row in zip(*columns, strict=True) if columns else ():
        out.append("{" + ",".join(f"{n}:{w(v)}" for n, w, v in zip(names, writers, row, strict=True)
                                  if v is not None) + "}")
    return out if columns else ["{}"] * table.num_rows


def _cast_text(t: pa.DataType) -> Callable[[Any], str]:
    """How Spark's ``CAST(x AS STRING)`` writes a value of Arrow type ``t``."""
    if pa.types.is_timestamp(t):
        return _cast_instant
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return str
    if pa.types.is_date(t):
        return lambda v: v.isoformat()
    if pa.types.is_floating(t):
        single = pa.types.is_float32(t) or pa.types.is_float16(t)
        return lambda v: java_double(v, single)
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_decimal(t):
        return _writer(t)
    raise TypeError(f"no text of Arrow type {t} as a key")


def key_texts(table: pa.Table, keys: list[str]) -> list[str | None]:
    """Each row's record key as the ``kafka`` sink makes it in Spark: one column cast to text,
    several as the JSON array ``to_json(array(...))`` gives (their values of one type); None
    where there is no key (no columns, or a null)."""
    if not keys:
        return [None] * table.num_rows
    if len(keys) == 1:
        cast = _cast_text(table.schema.field(keys[0]).type)
        return [None if v is None else cast(v) for v in _values(table.column(keys[0]))]
    types = {table.schema.field(k).type for k in keys}
    if len(types) > 1:  # Spark's array() would first bring them to one type
        raise TypeError(f"key columns {keys} are of different types ({', '.join(map(str, types))})")
    write = _nullable(_writer(types.pop()))
    columns = [_values(table.column(k)) for k in keys]
    return ["[" + ",".join(write(v) for v in row) + "]" for row in zip(*columns, strict=True)]


def records_problem(schema: pa.Schema, keys: list[str] | None = None) -> str | None:
    """Why rows of ``schema`` (with record keys of ``keys``) cannot be written as Spark's records
    here; None: they can. (The writers are made from the types, before any row.)"""
    try:
        json_records(schema.empty_table())
        if keys is not None:
            key_texts(schema.empty_table(), keys)
    except TypeError as e:
        return str(e)
    return None


def micro_instants(table: pa.Table, tz: str = "UTC") -> pa.Table:
    """``table`` with its instants as Spark hands them to Arrow (``timestamp[us]`` in the session's
    time zone), for sinks that read the types of the rows they get (``postgres``)."""
    fields = [pa.field(f.name, pa.timestamp("us", tz=tz), f.nullable) if pa.types.is_timestamp(f.type) else f
              for f in table.schema]
    return table.cast(pa.schema(fields)) if fields != list(table.schema) else table

