"""Decoding Avro and Protobuf records (:mod:`eddyline.io.binrecords`), without Spark: values
written by the reference libraries (fastavro, google.protobuf), plain and in Confluent's wire
format, and the records that do not decode, each with its reason."""

from __future__ import annotations

import base64
import io
import json
import struct
from datetime import UTC, datetime

import pytest

from eddyline.io.binrecords import Codec, decoded_binary
from eddyline.io.textrecords import arrow_schema

AVRO = {"type": "record", "name": "Bid", "namespace": "shop", "fields": [
    {"name": "auction", "type": "long"},
    {"name": "price", "type": ["null", "long"], "default": None},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "small", "type": "int"},
    {"name": "extra", "type": {"type": "array", "items": "int"}},  # no column takes it: left out
]}
COLUMNS = "auction long, price long, ts timestamp, kind string, small smallint"
T = datetime(2026, 1, 1, 12, 30, tzinfo=UTC)


def avro(record: dict, schema: dict = AVRO) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def bid(auction: int, price: int | None = 1, small: int = 3) -> dict:
    return {"auction": auction, "price": price, "ts": T, "kind": "B", "small": small, "extra": [1, 2]}


def confluent(schema_id: int, payload: bytes, indexes: bytes = b"") -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + indexes + payload


def rows(codec: Codec, payloads: list[bytes], columns: str = COLUMNS) -> list[dict]:
    schema = arrow_schema(columns)
    assert schema is not None
    batch, order = decoded_binary(codec, "t/0", list(range(100, 100 + len(payloads))), payloads, schema,
                                  why=lambda at, reason: f"{reason} (offset {at})")
    assert sorted(order) == list(range(len(payloads)))  # every payload once, as a row or a dead letter
    return batch.to_pylist()


def test_plain_avro_records_decode_into_the_columns_and_bad_ones_are_dead_letters_saying_why():
    codec = Codec("avro", json.dumps(AVRO))
    good = avro(bid(1, price=None))
    got = rows(codec, [good, good[:3], good + b"\x00\x00", avro(bid(2, small=70_000)), avro(bid(3))])
    assert [(r["auction"], r["price"], r["ts"], r["kind"], r["small"]) for r in got[:2]] == [
        (1, None, T, "B", 3), (3, 1, T, "B", 3)]
    dead = [(r["_line"], r["_reason"], r["_raw"]) for r in got[2:]]
    assert dead == [
        (101, "not an Avro record of the schema (the value ends inside the record) (offset 101)", base64.b64encode(good[:3]).decode()),
        (102, "not an Avro record of the schema (2 byte(s) left over after the record) (offset 102)",
         base64.b64encode(good + b"\x00\x00").decode()),
        (103, "field 'small': expected smallint, got 70000 (offset 103)", base64.b64encode(avro(bid(2, small=70_000))).decode()),
    ]
    assert all(r["auction"] is None for r in got[2:])


def test_confluent_framed_avro_takes_the_schema_id_it_is_told_and_refuses_unframed_values():
    codec = Codec("avro", json.dumps(AVRO), confluent=True, schema_id=7)
    got = rows(codec, [confluent(7, avro(bid(1))), confluent(8, avro(bid(2))), avro(bid(3)), b"\x00\x00"])
    assert [r["auction"] for r in got[:1]] == [1]
    assert [r["_reason"] for r in got[1:]] == [
        "written with schema id 8, expected 7 (offset 101)",
        "not in Confluent's wire format (a zero byte, then a 4-byte schema id) (offset 102)",
        "not in Confluent's wire format (a zero byte, then a 4-byte schema id) (offset 103)",
    ]
    # without schema_id, any id is decoded with the configured schema
    assert [r["auction"] for r in rows(Codec("avro", json.dumps(AVRO), confluent=True), [confluent(8, avro(bid(2)))])] == [2]


def test_a_column_the_avro_schema_lacks_or_types_otherwise_is_refused_naming_it():
    codec = Codec("avro", json.dumps(AVRO))
    cases = [
        ("auction long, nope long", "column 'nope' is no field of the Avro schema"),
        ("auction int", "column 'auction' is int, but the Avro schema has it as long"),
        ("ts long", "column 'ts' is bigint, but the Avro schema has it as timestamp-millis"),
        ("extra string", "column 'extra' is string, but the Avro schema has it as array"),
    ]
    for columns, message in cases:
        with pytest.raises(ValueError, match=message):
            codec.check(arrow_schema(columns))
    codec.check(arrow_schema("auction double, kind string, price long"))  # these fit
    for text, message in [("{", "schema: not JSON"), ('{"type": "nope"}', "not an Avro schema"),
                          ('"long"', "expected an Avro record schema")]:
        with pytest.raises(ValueError, match=message):
            Codec("avro", text).check(arrow_schema("a long"))


def _descriptors() -> str:
    """A FileDescriptorSet of ``shop.Bid`` (proto3, a Timestamp, an enum, an optional field),
    made as protoc would, without the imports (the Timestamp's file is not in it)."""
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet()
    f = fds.file.add(name="bid.proto", package="shop", syntax="proto3")
    f.dependency.append("google/protobuf/timestamp.proto")
    kind = f.enum_type.add(name="Kind")
    kind.value.add(name="A", number=0)
    kind.value.add(name="B", number=1)
    m = f.message_type.add(name="Bid")
    F = descriptor_pb2.FieldDescriptorProto
    m.field.add(name="auction", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="price", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL, proto3_optional=True, oneof_index=0)
    m.oneof_decl.add(name="_price")
    m.field.add(name="ts", number=3, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=F.LABEL_OPTIONAL)
    m.field.add(name="kind", number=4, type=F.TYPE_ENUM, type_name=".shop.Kind", label=F.LABEL_OPTIONAL)
    m.field.add(name="tags", number=5, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    return base64.b64encode(fds.SerializeToString()).decode()


def _message(codec: Codec, **values):
    from eddyline.io.binrecords import _proto_class

    msg = _proto_class(codec.schema, codec.message)(**{k: v for k, v in values.items() if k != "ts"})
    if "ts" in values:
        msg.ts.FromDatetime(values["ts"])
    return msg.SerializeToString()


def test_protobuf_records_decode_absent_optional_fields_as_null_and_enums_by_name():
    codec = Codec("protobuf", _descriptors(), "shop.Bid")
    got = rows(codec, [_message(codec, auction=1, price=0, ts=T, kind=1), _message(codec, auction=2), b"\x0a\xff"],
               "auction long, price long, ts timestamp, kind string")
    assert [(r["auction"], r["price"], r["ts"], r["kind"]) for r in got[:2]] == [(1, 0, T, "B"), (2, None, None, "A")]
    assert got[2]["_reason"].startswith("not a Protobuf shop.Bid (") and got[2]["_reason"].endswith("(offset 102)")
    # an enum into a number column is its number
    assert [r["kind"] for r in rows(codec, [_message(codec, kind=1)], "kind long")] == [1]


def test_confluent_framed_protobuf_skips_the_message_indexes():
    codec = Codec("protobuf", _descriptors(), "shop.Bid", confluent=True)
    one = _message(codec, auction=5)
    # a lone 0: the file's first message; else a count and that many indexes (zig-zag varints)
    got = rows(codec, [confluent(1, one, b"\x00"), confluent(1, one, b"\x04\x00\x02"), confluent(1, b"", b"\x04\x00")],
               "auction long")
    assert [r["auction"] for r in got[:2]] == [5, 5]
    assert got[2]["_reason"] == "Confluent's message indexes run past the end of the value (offset 102)"


def test_a_bad_message_name_or_column_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"message: no message type 'shop.Nope' .*\['shop.Bid'\]"):
        Codec("protobuf", _descriptors(), "shop.Nope").check(arrow_schema("auction long"))
    with pytest.raises(ValueError, match="column 'tags' is string, but the Protobuf message shop.Bid has it as repeated"):
        Codec("protobuf", _descriptors(), "shop.Bid").check(arrow_schema("tags string"))
    with pytest.raises(ValueError, match="column 'auction' is int, but the Protobuf message shop.Bid has it as int64"):
        Codec("protobuf", _descriptors(), "shop.Bid").check(arrow_schema("auction int"))
    with pytest.raises(ValueError, match="descriptors: not a FileDescriptorSet"):
        Codec("protobuf", base64.b64encode(b"\xff\xff").decode(), "shop.Bid").check(arrow_schema("auction long"))


def test_rows_written_with_the_avro_schema_of_their_columns_decode_to_the_same_values():
    import datetime as dt

    import pyarrow as pa

    from eddyline.io.binrecords import avro_schema_of, avro_writer

    table = pa.table({
        "id": pa.array([1, None], pa.int64()), "n": pa.array([2, 3], pa.int32()), "x": pa.array([0.5, 1.5]),
        "name": pa.array(["a", None]), "ok": pa.array([True, False]),
        "at": pa.array([T, None], pa.timestamp("us", tz="UTC")), "day": pa.array([dt.date(2026, 1, 2), None]),
    })
    schema = avro_schema_of(table.schema, "nexmark.bid-1")
    assert schema["name"] == "nexmark_bid_1"
    write = avro_writer(schema)
    codec = Codec("avro", json.dumps(schema))
    got = rows(codec, [write(r) for r in table.to_pylist()], "id long, n int, x double, name string, ok boolean, "
                                                            "at timestamp, day date")
    assert [{k: r[k] for k in table.column_names} for r in got] == table.to_pylist()
    with pytest.raises(ValueError, match="column 'tags': list<item: int64> has no Avro type here"):
        avro_schema_of(pa.schema([pa.field("tags", pa.list_(pa.int64()))]), "t")
