"""Decoding JSON records with Arrow's JSON reader, in the Python worker that received them, with
every record that does not fit kept with the reason. Pure: bytes in, Arrow out, no Spark.

Arrow's reader parses a whole block of newline-separated records in C++ straight into typed
columns, several times faster than handing the text to the JVM and parsing it there. It cannot
say which record of a block failed, so a block that fails is halved until the failing records
are alone; only those are looked at in Python, to say why. The reasons read like the Spark path's
(:mod:`eddyline.io.records`): "not a valid JSON object", "missing field(s): …", "field 'x':
expected bigint, got …". Arrow fills a missing field with null like an explicit null, so a row
with a null is checked for its keys (only such rows).

Only flat schemas of scalar types take this path (:func:`arrow_schema` returns None otherwise).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

#: Spark DDL type names → (Arrow type, the name Spark prints in reasons)
_TYPES: dict[str, tuple[pa.DataType, str]] = {
    "long": (pa.int64(), "bigint"), "bigint": (pa.int64(), "bigint"),
    "int": (pa.int32(), "int"), "integer": (pa.int32(), "int"),
    "short": (pa.int16(), "smallint"), "smallint": (pa.int16(), "smallint"),
    "byte": (pa.int8(), "tinyint"), "tinyint": (pa.int8(), "tinyint"),
    "double": (pa.float64(), "double"), "float": (pa.float32(), "float"), "real": (pa.float32(), "float"),
    "string": (pa.string(), "string"), "boolean": (pa.bool_(), "boolean"),
    "timestamp": (pa.timestamp("us", tz="UTC"), "timestamp"),
    "timestamp_ntz": (pa.timestamp("us"), "timestamp_ntz"),
    "date": (pa.date32(), "date"),
}
_FIELD = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s+([A-Za-z_]+)\s*$")


@dataclass(frozen=True)
class JsonSchema:
    arrow: pa.Schema
    spark_names: tuple[str, ...]  # per field, the type as Spark prints it


def arrow_schema(ddl: str) -> JsonSchema | None:
    """The Arrow schema of a flat Spark DDL schema (``"id long, name string"``), or None when it
    has a type this path does not take (nested, decimal, binary, ...)."""
    fields, names = [], []
    for part in ddl.split(","):
        m = _FIELD.match(part)
        if m is None or m.group(2).lower() not in _TYPES:
            return None
        arrow, spark = _TYPES[m.group(2).lower()]
        fields.append(pa.field(m.group(1), arrow))
        names.append(spark)
    return JsonSchema(pa.schema(fields), tuple(names))


#: records parsed together; a block with a bad record is halved until the record is alone
BLOCK = 4096


@dataclass(frozen=True)
class Decoded:
    rows: pa.Table  # the records that fit, in order
    good: list[int]  # their positions among the payloads
    bad: list[tuple[int, str]]  # (position, reason) of the others


def decode_json(payloads: list[bytes], schema: JsonSchema) -> Decoded:
    """``payloads`` (one JSON object each) as rows of ``schema``, and the ones that do not fit."""
    options = pajson.ParseOptions(explicit_schema=schema.arrow, unexpected_field_behavior="ignore")
    tables: list[pa.Table] = []
    good: list[int] = []
    bad: list[tuple[int, str]] = []

    def parse(lo: int, hi: int) -> None:
        chunk = [p.replace(b"\n", b" ").replace(b"\r", b" ") if b"\n" in p or b"\r" in p else p
                 for p in payloads[lo:hi]]
        try:
            table = pajson.read_json(
                pa.BufferReader(b"\n".join(chunk)),
                read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, sum(map(len, chunk)) + 1)),
                parse_options=options,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            table = None
        if table is not None and table.num_rows == hi - lo:
            keep = _complete(table, chunk, schema, lo, bad)
            tables.append(table if keep is None else table.filter(pa.array(keep)))
            good.extend(range(lo, hi) if keep is None else [lo + i for i, k in enumerate(keep) if k])
        elif hi - lo == 1:
            bad.append((lo, _reason(payloads[lo], schema)))
        else:  # some record in here does not fit (or is empty): halve until it is alone
            mid = (lo + hi) // 2
            parse(lo, mid)
            parse(mid, hi)

    for lo in range(0, len(payloads), BLOCK):  # a bad record costs halvings of its block only
        parse(lo, min(lo + BLOCK, len(payloads)))
    rows = pa.concat_tables(tables) if tables else schema.arrow.empty_table()
    bad.sort()
    return Decoded(rows, good, bad)


def _complete(table: pa.Table, chunk: list[bytes], schema: JsonSchema, lo: int, bad: list[tuple[int, str]]) -> list[bool] | None:
    """Which rows have every field (a null may stand for a missing key): None when all do."""
    if not any(c.null_count for c in table.columns):
        return None
    nulls = None
    for column in table.columns:
        if column.null_count:
            mask = column.is_null()
            nulls = mask if nulls is None else pc.or_(nulls, mask)
    assert nulls is not None
    keep = [True] * table.num_rows
    for i, has_null in enumerate(nulls.to_pylist()):
        if has_null:
            missing = [n for n in schema.arrow.names if n not in json.loads(chunk[i])]
            if missing:
                keep[i] = False
                bad.append((lo + i, f"missing field(s): {', '.join(missing)}"))
    return None if all(keep) else keep


def _reason(payload: bytes, schema: JsonSchema) -> str:
    """Why one record does not fit, in the Spark path's words."""
    try:
        record = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return "not a valid JSON object"
    if not isinstance(record, dict):
        return "not a valid JSON object"
    missing = [n for n in schema.arrow.names if n not in record]
    if missing:
        return f"missing field(s): {', '.join(missing)}"
    for field, spark in zip(schema.arrow, schema.spark_names, strict=True):
        value = record[field.name]
        if value is None:
            continue
        try:
            pajson.read_json(
                pa.BufferReader(json.dumps({field.name: value}).encode()),
                parse_options=pajson.ParseOptions(explicit_schema=pa.schema([field])),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            text = value if isinstance(value, str) else json.dumps(value)
            return f"field '{field.name}': expected {spark}, got {text[:80]}"
    return "record does not fit the schema"


def decoded_batch(where: str, positions: list[int], payloads: list[bytes], schema: JsonSchema) -> pa.RecordBatch:
    """``payloads`` decoded into one batch of the schema's columns plus ``_file`` (``where``: a
    file, a stream), ``_line`` (the payload's line or sequence from ``positions``), ``_raw`` and
    ``_reason``, which are null for a record that fits; one that does not has nulls in the
    schema's columns."""
    d = decode_json(payloads, schema)
    good, bad = len(d.good), len(d.bad)
    columns = [
        pa.concat_arrays([*d.rows.column(f.name).chunks, pa.nulls(bad, f.type)]) if bad
        else d.rows.column(f.name).combine_chunks()
        for f in schema.arrow
    ]
    extra = [
        pa.array([where] * (good + bad), pa.string()),
        pa.array([positions[i] for i in d.good] + [positions[i] for i, _ in d.bad], pa.int64()),
        pa.array([None] * good + [payloads[i].decode(errors="replace") for i, _ in d.bad], pa.string()),
        pa.array([None] * good + [reason for _, reason in d.bad], pa.string()),
    ]
    return pa.RecordBatch.from_arrays([*columns, *extra], names=[*schema.arrow.names, *EXTRA])


#: the columns :func:`decoded_batch` adds, and their Spark DDL
EXTRA = ("_file", "_line", "_raw", "_reason")
EXTRA_DDL = "_file string, _line long, _raw string, _reason string"
