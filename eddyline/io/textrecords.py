"""Decoding text records (JSON objects or CSV lines) with Arrow's readers, in the Python worker that
received them, with every record that does not fit kept with the reason. Pure: bytes in, Arrow
out, no Spark.

Arrow parses a whole block of newline-separated records in C++ straight into typed columns, which
is faster than Spark's own JSON and CSV readers, and far faster than handing the text to the JVM.
It cannot say which record of a block failed, so a block that fails is halved until the failing
records are alone; only those are looked at in Python, to say why. A whole file, or a task's
messages of many records each, is parsed at once and only split into lines when something in it
does not fit. The reasons read like the JVM path's
(:mod:`eddyline.io.records`): "not a valid JSON object", "missing field(s): …", "expected 4 CSV
fields, got 3", "field 'x': expected bigint, got …".

In JSON a missing field is a bad record but an explicit null is a value (Arrow fills both with
null, so rows with a null are checked for their keys, only those). CSV is read as RFC 4180
describes it, the dialect of most tools that write CSV (and of the ``files`` sink): a field with
a comma, quote or line break is quoted, a quote inside it is written twice, a
backslash is an ordinary character. An empty field is null, ``""`` the empty string. (Spark's own
reader differs: it escapes with a backslash and reads ``""`` as null.) Arrow takes a number with
spaces around it (`` 1``), which Spark refuses.

Only flat schemas of scalar types take this path (:func:`arrow_schema` returns None otherwise).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

Format = Literal["json", "csv"]

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


def shipped(names: tuple[str, ...], wanted: frozenset[str] | None) -> tuple[str, ...]:
    """Of a source's fields ``names``, those that cross into the JVM when the network reads only
    ``wanted`` (lower-case names; None: all): the wanted ones, those the engine reads itself
    (``_op``, ``_diff``: names that start with ``_``) and at least one, so that a batch keeps its
    row count. A wanted name that is no field (a typo in a step, a name SQL binds itself) keeps
    every field, so that what the step says about it lists them all."""
    if wanted is None or not wanted <= {n.lower() for n in names}:
        return names
    kept = tuple(n for n in names if n.lower() in wanted or n.startswith("_"))
    return kept or names[:1]


@dataclass(frozen=True)
class TextSchema:
    arrow: pa.Schema
    spark_names: tuple[str, ...]  # per field, the type as Spark prints it

    def shipped(self, wanted: frozenset[str] | None) -> tuple[str, ...]:
        """The fields handed on to Spark when the network reads only ``wanted`` (see
        :func:`shipped`). Every field is still parsed and checked, so a bad value in a column
        nobody reads is still a dead letter."""
        return shipped(tuple(self.arrow.names), wanted)

    def ddl(self, fields: tuple[str, ...]) -> str:
        """Spark DDL of ``fields``, with the columns :func:`decoded_batch` adds."""
        types = dict(zip(self.arrow.names, self.spark_names, strict=True))
        return ", ".join([*(f"`{n}` {types[n]}" for n in fields), EXTRA_DDL])


def arrow_schema(ddl: str) -> TextSchema | None:
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
    return TextSchema(pa.schema(fields), tuple(names))


#: records parsed together; a block with a bad record is halved until the record is alone
BLOCK = 4096
#: rows per batch handed to Spark
BATCH_ROWS = 50_000


@dataclass(frozen=True)
class Decoded:
    rows: pa.Table  # the records that fit, in order
    good: list[int]  # their positions among the payloads
    bad: list[tuple[int, str]]  # (position, reason) of the others


def _parse(fmt: Format, text: bytes, schema: TextSchema) -> pa.Table | None:
    """``text`` (records separated by newlines) parsed in one go; None if any record fails.
    Blank lines are skipped."""
    if fmt == "csv" and not text.endswith(b"\n"):
        text += b"\n"  # Arrow takes an empty last field after a quoted one for quoted, without it
    read = pa.BufferReader(text)
    block = max(1 << 20, len(text) + 1)  # one block: no record is cut, and one thread
    try:
        if fmt == "json":
            return pajson.read_json(
                read,
                read_options=pajson.ReadOptions(use_threads=False, block_size=block),
                parse_options=pajson.ParseOptions(explicit_schema=schema.arrow, unexpected_field_behavior="ignore"),
            )
        return pacsv.read_csv(
            read,
            read_options=pacsv.ReadOptions(use_threads=False, block_size=block, column_names=schema.arrow.names),
            parse_options=pacsv.ParseOptions(newlines_in_values=False, ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(
                column_types=schema.arrow, strings_can_be_null=True, quoted_strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def decode(fmt: Format, payloads: list[bytes], schema: TextSchema) -> Decoded:
    """``payloads`` (one record each) as rows of ``schema``, and the ones that do not fit."""
    tables: list[pa.Table] = []
    good: list[int] = []
    bad: list[tuple[int, str]] = []

    def parse(lo: int, hi: int) -> None:
        chunk = [_one_line(p) for p in payloads[lo:hi]] if fmt == "json" else payloads[lo:hi]
        table = _parse(fmt, b"\n".join(chunk), schema)
        if table is not None and table.num_rows == hi - lo:
            keep = _complete(fmt, table, chunk, schema, lo, bad)
            tables.append(table if keep is None else table.filter(pa.array(keep)))
            good.extend(range(lo, hi) if keep is None else [lo + i for i, k in enumerate(keep) if k])
        elif hi - lo == 1:
            bad.append((lo, _reason(fmt, payloads[lo], schema)))
        else:  # some record in here does not fit (or is empty): halve until it is alone
            mid = (lo + hi) // 2
            parse(lo, mid)
            parse(mid, hi)

    for lo in range(0, len(payloads), BLOCK):  # a bad record costs halvings of its block only
        parse(lo, min(lo + BLOCK, len(payloads)))
    rows = pa.concat_tables(tables) if tables else schema.arrow.empty_table()
    bad.sort()
    return Decoded(rows, good, bad)


def _one_line(payload: bytes) -> bytes:
    """A JSON record spread over lines, on one line (JSON allows a newline wherever it allows a
    space, and a newline inside a string is escaped)."""
    return payload.replace(b"\n", b" ").replace(b"\r", b" ") if b"\n" in payload or b"\r" in payload else payload


def _complete(
    fmt: Format, table: pa.Table, chunk: list[bytes], schema: TextSchema, lo: int, bad: list[tuple[int, str]]
) -> list[bool] | None:
    """JSON: which rows have every field (a null may stand for a missing key); None when all do."""
    if fmt != "json" or not any(c.null_count for c in table.columns):
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


def _reason(fmt: Format, payload: bytes, schema: TextSchema) -> str:
    """Why one record does not fit, in the JVM path's words."""
    return _json_reason(payload, schema) if fmt == "json" else _csv_reason(payload, schema)


def _json_reason(payload: bytes, schema: TextSchema) -> str:
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
        one = TextSchema(pa.schema([field]), (spark,))
        if _parse("json", json.dumps({field.name: value}).encode(), one) is None:
            text = value if isinstance(value, str) else json.dumps(value)
            return f"field '{field.name}': expected {spark}, got {text[:80]}"
    return "record does not fit the schema"


def _csv_reason(payload: bytes, schema: TextSchema) -> str:
    text = payload.decode(errors="replace").rstrip("\r\n")
    if "\n" in text:
        return f"expected one CSV record, got {text.count(chr(10)) + 1} lines"
    try:
        fields = next(csv.reader([text]), [])
    except csv.Error as e:
        return f"not a valid CSV line: {e}"
    n = len(schema.arrow)
    if len(fields) != n:
        return f"expected {n} CSV fields, got {len(fields)}"
    for value, field, spark in zip(fields, schema.arrow, schema.spark_names, strict=True):
        if value == "":  # fits unless quoted (`""`), which is the empty string, not null
            if field.type != pa.string():
                return f"field '{field.name}': expected {spark}, got \"\""
            continue
        line = io.StringIO()
        csv.writer(line).writerow([value])
        if _parse("csv", line.getvalue().encode(), TextSchema(pa.schema([field]), (spark,))) is None:
            return f"field '{field.name}': expected {spark}, got {value[:80]}"
    return "record does not fit the schema"


def decoded_batch(
    fmt: Format, where: str, positions: list[int], payloads: list[bytes], schema: TextSchema,
    ship: tuple[str, ...] | None = None,
) -> pa.RecordBatch:
    """``payloads`` decoded into one batch of the schema's columns plus ``_file`` (``where``: a
    file, a stream), ``_line`` (the payload's line or sequence from ``positions``), ``_raw`` and
    ``_reason``; a record that fits has nulls in these four (only dead letters need them), one
    that does not has nulls in the schema's columns. ``ship``: the schema's columns the batch
    holds (default: all; see :meth:`TextSchema.shipped`)."""
    return decoded_rows(fmt, where, positions, payloads, schema, ship)[0]


def decoded_rows(
    fmt: Format, where: str, positions: list[int], payloads: list[bytes], schema: TextSchema,
    ship: tuple[str, ...] | None = None, why: Callable[[int, str], str] | None = None,
) -> tuple[pa.RecordBatch, list[int]]:
    """:func:`decoded_batch`, and the payloads' indexes in the order of the batch's rows (those
    that fit, then the others), for a source that adds columns of its own to each row.
    ``why(position, reason)``: the reason a dead letter gives (default: ``reason``)."""
    d = decode(fmt, payloads, schema)
    bad = [(positions[i], payloads[i], why(positions[i], reason) if why else reason) for i, reason in d.bad]
    return _batch(d.rows, schema, where, bad, ship), d.good + [i for i, _ in d.bad]


def _batch(
    rows: pa.Table, schema: TextSchema, where: str, bad: list[tuple[int, bytes, str]], ship: tuple[str, ...] | None
) -> pa.RecordBatch:
    good = rows.num_rows
    fields = [schema.arrow.field(n) for n in ship] if ship is not None else list(schema.arrow)
    columns = [
        pa.concat_arrays([*rows.column(f.name).chunks, pa.nulls(len(bad), f.type)]) if bad
        else rows.column(f.name).combine_chunks()
        for f in fields
    ]
    if bad:
        extra = [
            pa.array([None] * good + [where] * len(bad), pa.string()),
            pa.array([None] * good + [line for line, _, _ in bad], pa.int64()),
            pa.array([None] * good + [raw.decode(errors="replace") for _, raw, _ in bad], pa.string()),
            pa.array([None] * good + [reason for _, _, reason in bad], pa.string()),
        ]
    else:
        extra = [pa.nulls(good, t) for t in (pa.string(), pa.int64(), pa.string(), pa.string())]
    return pa.RecordBatch.from_arrays([*columns, *extra], names=[*(f.name for f in fields), *EXTRA])


def _whole(fmt: Format, text: bytes, schema: TextSchema) -> pa.Table | None:
    """``text`` (records one per line) parsed in one go, row i from line i + 1, when every line
    is a record that fits; None when one does not, or a line is blank. (A JSON line holding two
    objects could make up for a blank line; its two records are then both taken, the only
    difference to decoding line by line.)"""
    table = _parse(fmt, text, schema) if text else None
    if table is None or table.num_rows != text.count(b"\n") + (not text.endswith(b"\n")):
        return None  # the readers skip blank lines: fewer rows than lines
    # the lines are looked at only for rows with a null (a JSON key may be missing)
    nulls = fmt == "json" and any(c.null_count for c in table.columns)
    return table if _complete(fmt, table, text.split(b"\n") if nulls else [], schema, 0, []) is None else None


def _table_batches(table: pa.Table, schema: TextSchema, where: str, ship: tuple[str, ...] | None) -> Iterator[pa.RecordBatch]:
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        yield _batch(pa.Table.from_batches([batch]), schema, where, [], ship)


def file_batches(
    fmt: Format, name: str, text: bytes, schema: TextSchema, *, header: bool = False,
    ship: tuple[str, ...] | None = None, first_line: Callable[[], int] = lambda: 1,
) -> Iterator[pa.RecordBatch]:
    """A whole file of records, or a piece of one that starts at a line (one record per line;
    blank lines skipped, line numbers counted including them, the first being ``first_line()``,
    asked for only when a line number is needed; with ``header`` the first line is not a
    record) decoded into batches as :func:`decoded_batch` gives them. The text is parsed in one
    go; only one in which something does not fit, or that has blank lines, is split into lines
    and decoded record by record."""
    skipped = 0
    if header:
        cut = text.find(b"\n")
        text, skipped = (text[cut + 1 :] if cut >= 0 else b""), 1
    table = _whole(fmt, text, schema)
    if table is not None:
        yield from _table_batches(table, schema, name, ship)
        return
    first = first_line() + skipped
    numbered = [(n, line.rstrip(b"\r")) for n, line in enumerate(text.split(b"\n"), first) if line.strip()]
    for lo in range(0, len(numbered), BATCH_ROWS):
        chunk = numbered[lo : lo + BATCH_ROWS]
        yield decoded_batch(fmt, name, [n for n, _ in chunk], [line for _, line in chunk], schema, ship)


def packed_batches(
    fmt: Format, where: str, positions: list[int], payloads: list[bytes], schema: TextSchema,
    ship: tuple[str, ...] | None = None,
) -> Iterator[pa.RecordBatch]:
    """``payloads`` that hold records one per line (messages of many records), decoded into
    batches as :func:`decoded_batch` gives them, a bad record's ``_line`` being its payload's
    position. Like a file, the payloads are parsed in one go, and split into records only when
    something in them does not fit or a line is blank (a line break that ends a payload makes
    none)."""
    table = _whole(fmt, b"\n".join(p.removesuffix(b"\n") for p in payloads), schema)
    if table is not None:
        yield from _table_batches(table, schema, where, ship)
        return
    lines, records = packed_records(positions, payloads)
    for lo in range(0, len(records), BATCH_ROWS):
        yield decoded_batch(fmt, where, lines[lo : lo + BATCH_ROWS], records[lo : lo + BATCH_ROWS], schema, ship)


def packed_payloads(rows: list[str], per: int) -> list[bytes]:
    """``rows`` (text records) as payloads of ``per`` records each, one per line, the last
    possibly fewer: what :func:`packed_records` takes apart."""
    return ["\n".join(rows[i : i + per]).encode() for i in range(0, len(rows), per)]


def packed_records(positions: list[int], payloads: list[bytes]) -> tuple[list[int], list[bytes]]:
    """The records of ``payloads`` that hold one per line, each under its payload's position (a
    line break may be CRLF; a blank line is no record)."""
    lines: list[int] = []
    records: list[bytes] = []
    for position, payload in zip(positions, payloads, strict=True):
        for line in payload.split(b"\n"):
            if line.strip():
                lines.append(position)
                records.append(line.removesuffix(b"\r"))
    return lines, records


#: the columns :func:`decoded_batch` adds, and their Spark DDL
EXTRA = ("_file", "_line", "_raw", "_reason")
EXTRA_DDL = "_file string, _line long, _raw string, _reason string"
