"""Arrow's JSON reader in the Python worker: the records that fit as typed rows, the others with
the reason, whatever mix of bad records a block holds (checked against Python's json module)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.io.jsonrecords import BLOCK, arrow_schema, decode_json

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
    d = decode_json(payloads, SCHEMA)
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
    d = decode_json(payloads, schema)
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
    d = decode_json(payloads, arrow_schema("id long, name string, price double"))
    assert d.bad == [(BLOCK + 7, "not a valid JSON object")] and d.rows.num_rows == 3 * BLOCK - 1
