"""Arrow's JSON and CSV readers in the Python worker: the records that fit as typed rows, the
others with the reason, whatever mix of bad records a block holds (checked against Python's json
and csv modules)."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.io.textrecords import (
    BLOCK,
    arrow_schema,
    decode,
    decoded_batch,
    file_batches,
    packed_batches,
    packed_records,
)

SCHEMA = arrow_schema("id long, name string, price double, at timestamp")


def test_flat_schemas_only():
    assert SCHEMA is not None and SCHEMA.spark_names == ("bigint", "string", "double", "timestamp")
    assert arrow_schema("id long, tags array<string>") is None
    assert arrow_schema("amount decimal(10,2)") is None


def test_each_kind_of_bad_record_gets_its_reason_and_good_ones_keep_their_values():
    good = {"id": 1, "name": "a", "price": 1.5, "at": "2026-01-01T00:00:00.000123Z"}
    payloads = [
        json.dumps(good).encode(),
        b"not json",
        json.dumps({**good, "id": "seven"}).encode(),
        json.dumps({k: v for k, v in good.items() if k != "name"}).encode(),
        json.dumps({**good, "name": None, "extra": [1]}).encode(),  # null is a value, extras ignored
        b"",
        b"[1, 2]",
        json.dumps({**good, "at": "yesterday"}).encode(),
        json.dumps(good, indent=2).encode(),  # spread over lines
    ]
    d = decode("json", payloads, SCHEMA)
    assert d.good == [0, 4, 8]
    assert d.bad == [
        (1, "not a valid JSON object"),
        (2, "field 'id': expected bigint, got seven"),
        (3, "missing field(s): name"),
        (5, "not a valid JSON object"),
        (6, "not a valid JSON object"),
        (7, "field 'at': expected timestamp, got yesterday"),
    ]
    rows = d.rows.to_pylist()
    assert rows[0] == {"id": 1, "name": "a", "price": 1.5, "at": datetime(2026, 1, 1, 0, 0, 0, 123, tzinfo=UTC)}
    assert rows[1]["name"] is None and rows[2] == rows[0]


record = st.one_of(
    st.builds(lambda i, n, p: {"id": i, "name": n, "price": p},
              st.integers(-(2**62), 2**62), st.text(max_size=5), st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(lambda i: {"id": i, "price": 1.0}, st.integers(0, 9)),  # name missing
    st.builds(lambda s: {"id": s, "name": "x", "price": 1.0}, st.text(min_size=1, max_size=3)),  # wrong type
    st.just("garbage"),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(record, max_size=40), st.integers(0, 3))
def test_any_mix_splits_exactly_into_good_and_bad(records, spread):
    schema = arrow_schema("id long, name string, price double")
    payloads = [(r if isinstance(r, str) else json.dumps(r)).encode() for r in records] * (1 + spread)
    d = decode("json", payloads, schema)
    expected_good = [i for i, p in enumerate(payloads) if _fits(p)]
    assert d.good == expected_good
    assert [i for i, _ in d.bad] == [i for i in range(len(payloads)) if i not in set(expected_good)]
    assert d.rows.to_pylist() == [
        {k: json.loads(payloads[i])[k] for k in ("id", "name", "price")} for i in expected_good]


def _fits(payload: bytes) -> bool:
    try:
        r = json.loads(payload)
    except ValueError:
        return False
    return (isinstance(r, dict) and {"id", "name", "price"} <= r.keys() and isinstance(r["id"], int)
            and isinstance(r["name"], str) and isinstance(r["price"], int | float))


def test_one_bad_record_among_several_blocks_is_found_and_the_rest_kept():
    payloads = [json.dumps({"id": i, "name": "n", "price": 0.5}).encode() for i in range(3 * BLOCK)]
    payloads[BLOCK + 7] = b"{broken"
    d = decode("json", payloads, arrow_schema("id long, name string, price double"))
    assert d.bad == [(BLOCK + 7, "not a valid JSON object")] and d.rows.num_rows == 3 * BLOCK - 1


CSV_SCHEMA = arrow_schema("id long, name string, price double, at timestamp")


def test_each_kind_of_bad_csv_line_gets_its_reason_and_good_ones_keep_spark_s_values():
    payloads = [
        b"1,a,1.5,2026-01-01T00:00:00.000123Z",
        b"2,\"b, with a comma\",2,2026-01-01T00:00:00Z",
        b"seven,a,1.5,2026-01-01T00:00:00Z",
        b"3,a,1.5",
        b"4,,,",  # empty unquoted fields are nulls
        b"5,\"\",0,2026-01-01T00:00:00Z",  # a quoted empty string is a string
        b"6,a,1.5,yesterday",
        b"7,a,1.5,2026-01-01T00:00:00Z,extra",
        b"8,a\n9,b,1,2026-01-01T00:00:00Z",
        b'9,"say ""hi""",,',  # RFC 4180: a quote inside quotes written twice; empty last fields
        b'10,a\\b,"",',  # a backslash is a character; "" is an empty string, not a number
    ]
    d = decode("csv", payloads, CSV_SCHEMA)
    assert d.good == [0, 1, 4, 5, 9]
    assert d.bad == [
        (2, "field 'id': expected bigint, got seven"),
        (3, "expected 4 CSV fields, got 3"),
        (6, "field 'at': expected timestamp, got yesterday"),
        (7, "expected 4 CSV fields, got 5"),
        (8, "expected one CSV record, got 2 lines"),
        (10, "field 'price': expected double, got \"\""),
    ]
    rows = d.rows.to_pylist()
    assert rows[0] == {"id": 1, "name": "a", "price": 1.5, "at": datetime(2026, 1, 1, 0, 0, 0, 123, tzinfo=UTC)}
    assert rows[1]["name"] == "b, with a comma"
    assert rows[2] == {"id": 4, "name": None, "price": None, "at": None}
    assert rows[3]["name"] == ""
    assert rows[4] == {"id": 9, "name": 'say "hi"', "price": None, "at": None}


csv_field = st.text(alphabet="ab,\" 1", max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(csv_field, min_size=1, max_size=4), max_size=40))
def test_any_mix_of_csv_lines_splits_exactly_into_good_and_bad(records):
    """Checked against Python's csv module: a line fits when it has two fields, the first an
    integer (or empty). Like Python's int(), Arrow takes a number with spaces around it."""
    schema = arrow_schema("id long, name string")
    payloads = [_csv_line(r) for r in records]
    d = decode("csv", payloads, schema)
    parsed = [next(csv.reader([p.decode()])) for p in payloads]
    fits = [i for i, f in enumerate(parsed) if len(f) == 2 and (f[0] == "" or _is_int(f[0]))]
    assert d.good == fits
    assert [i for i, _ in d.bad] == [i for i in range(len(payloads)) if i not in set(fits)]
    assert [r["id"] for r in d.rows.to_pylist()] == [int(parsed[i][0]) if parsed[i][0] else None for i in fits]


def _csv_line(fields: list[str]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(fields)
    return out.getvalue().encode()


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return "_" not in text


def _lines(batches) -> list[tuple[int | None, str | None]]:
    table = pa.Table.from_batches(list(batches))
    return list(zip(table.column("_line").to_pylist(), table.column("_reason").to_pylist(), strict=True))


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_whole_file_decodes_alike_in_one_go_or_line_by_line(fmt):
    """A clean file is parsed at once; blank lines, a bad line or (JSON) a missing field send it
    line by line; both give the same rows, and dead letters carry their line numbers."""
    schema = arrow_schema("id long, name string")
    line = (lambda i: json.dumps({"id": i, "name": f"n{i}"})) if fmt == "json" else (lambda i: f"{i},n{i}")
    clean = "\n".join(line(i) for i in range(1000)).encode()
    fast = list(file_batches(fmt, "f", clean, schema))
    assert pa.Table.from_batches(fast).column("id").to_pylist() == list(range(1000))
    assert {r for _, r in _lines(fast)} == {None}
    bad = b"{oops" if fmt == "json" else b"x,y"
    messy = b"\r\n".join([line(0).encode(), b"", b"  ", line(1).encode(), bad, line(2).encode()]) + b"\n"
    got = list(file_batches(fmt, "f", messy, schema))
    table = pa.Table.from_batches(got)
    assert table.column("id").to_pylist() == [0, 1, 2, None]
    assert _lines(got)[3] == (5, "not a valid JSON object" if fmt == "json" else "field 'id': expected bigint, got x")
    if fmt == "json":
        missing = "\n".join([line(0), json.dumps({"id": 9}), json.dumps({"id": 8, "name": None})]).encode()
        table = pa.Table.from_batches(list(file_batches(fmt, "f", missing, schema)))
        assert table.column("id").to_pylist() == [0, 8, None]
        assert table.column("_reason").to_pylist() == [None, None, "missing field(s): name"]
        assert table.column("_line").to_pylist() == [None, None, 2]


def test_a_header_line_is_skipped_and_line_numbers_still_count_it():
    schema = arrow_schema("id long, name string")
    for text in (b"id,name\n1,a\n2,b\n", b"id,name\n1,a\nx,b\n"):
        table = pa.Table.from_batches(list(file_batches("csv", "f", text, schema, header=True)))
        assert table.column("name").to_pylist()[:1] == ["a"]
    assert _lines(file_batches("csv", "f", b"id,name\n1,a\nx,b\n", schema, header=True))[1] == (
        3, "field 'id': expected bigint, got x")
    assert list(file_batches("csv", "f", b"id,name", schema, header=True)) == []


def test_only_the_columns_read_are_shipped_but_every_column_is_checked():
    ship = SCHEMA.shipped(frozenset({"price", "id"}))
    assert ship == ("id", "price")  # the schema's order
    assert SCHEMA.shipped(None) == tuple(SCHEMA.arrow.names)
    assert SCHEMA.shipped(frozenset({"price", "typo"})) == tuple(SCHEMA.arrow.names)  # a name no field has
    assert SCHEMA.ddl(ship) == "`id` bigint, `price` double, _file string, _line long, _raw string, _reason string"
    good = {"id": 1, "name": "a", "price": 1.5, "at": "2026-01-01T00:00:00Z"}
    text = "\n".join(json.dumps(r) for r in [good, {**good, "at": "yesterday"}, {**good, "id": 2}]).encode()
    (batch,) = file_batches("json", "f.json", text, SCHEMA, ship=ship)
    assert batch.schema.names == ["id", "price", "_file", "_line", "_raw", "_reason"]
    assert batch.column("id").to_pylist() == [1, 2, None]
    # the bad value is in a column nobody reads, and the record is a dead letter all the same
    assert batch.column("_reason").to_pylist() == [None, None, "field 'at': expected timestamp, got yesterday"]
    assert batch.column("_line").to_pylist() == [None, None, 2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(record, st.sampled_from(["", "  "])), max_size=6), max_size=8), st.booleans(),
       st.booleans())
def test_messages_of_many_records_decode_alike_in_one_go_or_record_by_record(messages, crlf, ended):
    """Packed messages (records one per line) are parsed all at once when everything fits; any
    bad or blank line sends them record by record. Either way the rows, and the dead letters
    under their message's sequence, are those of decoding the records one by one."""
    schema = arrow_schema("id long, name string, price double")
    eol = b"\r\n" if crlf else b"\n"
    payloads = [eol.join((r if isinstance(r, str) else json.dumps(r)).encode() for r in m) + (eol if ended else b"")
                for m in messages]
    seqs = list(range(101, 101 + len(payloads)))
    got = list(packed_batches("json", "s", seqs, payloads, schema))
    lines, records = packed_records(seqs, payloads)
    want = decoded_batch("json", "s", lines, records, schema).to_pylist()
    assert [row for batch in got for row in batch.to_pylist()] == want


def test_a_bad_line_in_a_packed_message_is_a_dead_letter_under_the_message_s_sequence():
    schema = arrow_schema("id long, name string")
    clean = [b'{"id": 1, "name": "a"}\n{"id": 2, "name": "b"}', b'{"id": 3, "name": "c"}']
    (batch,) = packed_batches("json", "bids", [7, 8], clean, schema)
    assert batch.column("id").to_pylist() == [1, 2, 3] and batch.column("_reason").null_count == 3
    messy = [clean[0], b'{"id": 3, "name": "c"}\r\n\r\n{"id": "x", "name": "d"}\n']
    (batch,) = packed_batches("json", "bids", [7, 8], messy, schema)
    assert batch.column("id").to_pylist() == [1, 2, 3, None]
    assert _lines([batch])[3] == (8, "field 'id': expected bigint, got x")
    assert batch.column("_file").to_pylist()[3] == "bids"
    # a key left out is a dead letter, an explicit null a value, even where everything parses
    (batch,) = packed_batches("json", "bids", [7, 8], [b'{"id": 1}', b'{"id": 2, "name": null}'], schema)
    assert batch.column("id").to_pylist() == [2, None] and _lines([batch])[1] == (7, "missing field(s): name")


def test_clean_packed_messages_are_never_split_into_records(monkeypatch):
    """The fast path: messages whose every line fits, each ending in a line break or not, are
    parsed as one text without being split into their records."""
    import eddyline.io.textrecords as textrecords

    def split(*_):
        raise AssertionError("split into records")

    monkeypatch.setattr(textrecords, "packed_records", split)
    schema = arrow_schema("id long, name string")
    messages = [b'{"id": 1, "name": "a"}\n{"id": 2, "name": "b"}\n', b'{"id": 3, "name": "c"}\r\n', b'{"id": 4, "name": "d"}']
    (batch,) = packed_batches("json", "bids", [1, 2, 3], messages, schema)
    assert batch.column("id").to_pylist() == [1, 2, 3, 4]
    with pytest.raises(AssertionError, match="split"):
        list(packed_batches("json", "bids", [1, 2], [messages[0], b'{"id": 5, "name": "e"}\n\n{"id": 6, "name": "f"}'], schema))
