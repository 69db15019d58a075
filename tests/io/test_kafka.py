"""The ``kafka`` source against a real Kafka-protocol broker (Tansu, started by the ``tansu``
fixture); confluent-kafka, used plainly, writes the input topics."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import ValidationError

from eddyline.api.sources import SourceSpec
from eddyline.errors import SourceError, SourceUnreachable
from eddyline.io.kafka.client import read_ends, watermarks
from eddyline.io.kafka.source import KafkaSource, pieces, share_out, slice_of

from ..kafkaref import create_topic, produce, topic_name

SCHEMA = "id long, name string, price double"


def _source(bootstrap: str, name: str = "bids", **params) -> KafkaSource:
    return KafkaSource(SourceSpec.model_validate({"name": name, "kafka": {"brokers": bootstrap, "schema": SCHEMA, **params}}))


def _rows(n: int, first: int = 0) -> list[bytes]:
    return [json.dumps({"id": i, "name": f"n{i}", "price": i * 0.5}).encode() for i in range(first, first + n)]


def test_the_end_of_a_partition_is_found_by_reading_where_list_offsets_answers_short(tansu):
    """Tansu answers ListOffsets(latest) with the last batch's base offset + 1 (docs/perf-notes.md);
    the source reads to the end instead. The first assertion documents the broker's answer: if a
    later Tansu answers right, it fails, and the reading can go."""
    from confluent_kafka import Consumer

    topic = create_topic(tansu.bootstrap, topic_name())
    produce(tansu.bootstrap, topic, _rows(4000), partition=0)
    c = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": "g", "isolation.level": "read_committed",
                  "enable.partition.eof": True, "auto.offset.reset": "error"})
    listed = watermarks(c, [(topic, 0)])[(topic, 0)][1]
    assert listed < 4000
    assert read_ends(c, {(topic, 0): listed}, 10) == {(topic, 0): 4000}
    assert read_ends(c, {(topic, 0): 4000}, 10) == {(topic, 0): 4000}  # from the end: the end
    c.close()
    assert _source(tansu.bootstrap, topics=[topic]).plan(0, 0.0)["end"] == 4000


def test_the_source_plans_offset_ranges_per_partition_and_reads_them_in_tasks(spark, tansu):
    topic = create_topic(tansu.bootstrap, topic_name(), partitions=3)
    for p in range(3):
        produce(tansu.bootstrap, topic, _rows(10 * (p + 1), first=100 * p), partition=p)
    src = _source(tansu.bootstrap, topics=[topic], metadata=["partition", "offset", "key", "headers", "timestamp"])
    src.min_per_task = 4
    first = src.plan(0, 0.0, None, cap=33)  # the cap is shared out evenly: 10 + 11 + 12
    assert first["ranges"] == [[topic, 0, 0, 10], [topic, 1, 0, 11], [topic, 2, 0, 12]]
    assert (first["start"], first["end"], first["backlog"]) == (0, 33, 27)
    assert first["lag"] == {f"{topic}/0": 0, f"{topic}/1": 9, f"{topic}/2": 18}
    rows = src.frames(spark, first, 3).data.collect()
    assert sorted((r.kafka_partition, r.kafka_offset, r.id) for r in rows) == sorted(
        [(p, o, 100 * p + o) for p, n in ((0, 10), (1, 11), (2, 12)) for o in range(n)])
    assert all(r.kafka_key is None and r.kafka_timestamp is not None for r in rows)

    second = src.plan(first["end"], 0.0, first["cursor"])  # the rest
    assert second["ranges"] == [[topic, 1, 11, 20], [topic, 2, 12, 30]] and second["end"] == 60
    assert src.frames(spark, second, 2).data.count() == 27
    assert src.plan(60, 0.0, second["cursor"])["ranges"] == []  # nothing new

    # a replay of the first plan reads the same records, however many tasks
    again = src.frames(spark, first, 7).data.collect()
    assert sorted((r.kafka_partition, r.kafka_offset) for r in again) == sorted(
        (r.kafka_partition, r.kafka_offset) for r in rows)


def test_a_per_partition_budget_bounds_each_partition(tansu):
    topic = create_topic(tansu.bootstrap, topic_name(), partitions=2)
    produce(tansu.bootstrap, topic, _rows(50), partition=0)
    produce(tansu.bootstrap, topic, _rows(5), partition=1)
    planned = _source(tansu.bootstrap, topics=[topic], max_records_per_partition=20).plan(0, 0.0)
    assert planned["ranges"] == [[topic, 0, 0, 20], [topic, 1, 0, 5]] and planned["backlog"] == 30


def test_bad_records_are_dead_letters_naming_partition_and_offset(spark, tansu):
    topic = create_topic(tansu.bootstrap, topic_name())
    produce(tansu.bootstrap, topic, [*_rows(3), b"not json", json.dumps({"id": "x", "name": "a", "price": 1}).encode(),
                                      json.dumps({"id": 9, "price": 1.0}).encode(), b"1,a,2.5"], partition=0)
    src = _source(tansu.bootstrap, topics=[topic])
    frames = src.frames(spark, src.plan(0, 0.0), 2)
    assert sorted(r.id for r in frames.data.collect()) == [0, 1, 2]
    dead = sorted((r.file, r.line, r.reason) for r in frames.dead_letters.collect())
    where = f"(topic {topic}, partition 0, offset"
    assert dead == [(f"{topic}/0", 3, f"not a valid JSON object {where} 3)"),
                    (f"{topic}/0", 4, f"field 'id': expected bigint, got x {where} 4)"),
                    (f"{topic}/0", 5, f"missing field(s): name {where} 5)"),
                    (f"{topic}/0", 6, f"not a valid JSON object {where} 6)")]


def test_csv_values_are_decoded(spark, tansu):
    topic = create_topic(tansu.bootstrap, topic_name())
    produce(tansu.bootstrap, topic, [b"1,a,1.5", b'2,"b, c",2.5', b"3,x"], partition=0)
    src = _source(tansu.bootstrap, topics=[topic], format="csv")
    frames = src.frames(spark, src.plan(0, 0.0), 1)
    assert sorted(tuple(r) for r in frames.data.collect()) == [(1, "a", 1.5), (2, "b, c", 2.5)]
    assert [r.reason for r in frames.dead_letters.collect()] == [
        f"expected 3 CSV fields, got 2 (topic {topic}, partition 0, offset 2)"]


def test_new_partitions_and_topics_of_a_pattern_are_read_from_the_next_plan(tansu):
    from confluent_kafka.admin import AdminClient, NewPartitions

    prefix = topic_name("pat")
    a = create_topic(tansu.bootstrap, f"{prefix}-a")
    produce(tansu.bootstrap, a, _rows(5), partition=0)
    src = _source(tansu.bootstrap, pattern=f"{prefix}-.*")
    first = src.plan(0, 0.0)
    assert first["ranges"] == [[a, 0, 0, 5]]
    b = create_topic(tansu.bootstrap, f"{prefix}-b")
    produce(tansu.bootstrap, b, _rows(2), partition=0)
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    try:
        for f in admin.create_partitions([NewPartitions(a, 2)]).values():
            f.result()
        grown = True
    except Exception:  # noqa: BLE001 (a broker that cannot add partitions: the new topic still shows)
        grown = False
    if grown:
        produce(tansu.bootstrap, a, _rows(3), partition=1)
    second = src.plan(first["end"], 0.0, first["cursor"])
    assert [b, 0, 0, 2] in second["ranges"]
    if grown:
        assert [a, 1, 0, 3] in second["ranges"]


def test_unknown_topics_shrunk_partitions_and_an_unreachable_broker_are_clear_errors(tansu):
    with pytest.raises(SourceError, match=r"topic\(s\) \['nope-[0-9a-f]+'\] do not exist"):
        _source(tansu.bootstrap, topics=[topic_name("nope")]).plan(0, 0.0)
    topic = create_topic(tansu.bootstrap, topic_name())
    read_before = json.dumps({f"{topic}/0": 0, f"{topic}/3": 7})
    with pytest.raises(SourceError, match=rf"topic {topic} has 1 partition\(s\) now, fewer than before \(partition 3"):
        _source(tansu.bootstrap, topics=[topic]).plan(7, 0.0, read_before)
    with pytest.raises(SourceUnreachable, match="Kafka brokers 127.0.0.1:1 unreachable"):
        _source("127.0.0.1:1", topics=[topic], wait="1s").plan(0, 0.0)


def test_a_partition_that_lost_records_the_source_read_is_an_error(tansu):
    topic = create_topic(tansu.bootstrap, topic_name())
    produce(tansu.bootstrap, topic, _rows(3), partition=0)
    with pytest.raises(SourceError, match="ends before offset 10, which this source read up to"):
        _source(tansu.bootstrap, topics=[topic]).plan(10, 0.0, json.dumps({f"{topic}/0": 10}))


def test_bad_specs_name_the_field():
    cases = [
        ({"schema": SCHEMA}, "give either 'topics'"),
        ({"schema": SCHEMA, "topics": ["a"], "pattern": "a.*"}, "give either 'topics'"),
        ({"schema": SCHEMA, "topics": ["a b"]}, "topics: 'a b' is not a Kafka topic name"),
        ({"schema": SCHEMA, "pattern": "(("}, "pattern: not a regular expression"),
        ({"schema": "a array<int>", "topics": ["a"]}, "schema: expected flat Spark DDL"),
        ({"schema": "kafka_offset long", "topics": ["a"], "metadata": ["offset"]}, r"metadata: the column\(s\)"),
        ({"schema": SCHEMA, "topics": ["a"], "metadata": ["size"]}, "metadata.0"),
        ({"schema": SCHEMA, "topics": ["a"], "options": {"isolation.level": "read_uncommitted"}}, "options: 'isolation.level'"),
        ({"schema": SCHEMA, "topics": ["a"], "max_records_per_partition": 0}, "max_records_per_partition"),
    ]
    for params, message in cases:
        with pytest.raises(ValidationError, match=message):
            SourceSpec.model_validate({"name": "s", "kafka": params})


def test_shares_and_pieces_are_even_and_cover_every_offset():
    assert share_out({"a": 100, "b": 3, "c": 50}, 60) == {"a": 29, "b": 3, "c": 28}
    assert share_out({"a": 1, "b": 0}, 10) == {"a": 1, "b": 0}
    got = pieces([["t", 0, 0, 100], ["t", 1, 5, 12]], 3, 30)
    assert sorted(r for task in got for r in task) == [("t", 0, 0, 33), ("t", 0, 33, 66), ("t", 0, 66, 100), ("t", 1, 5, 12)]
    assert [len(t) for t in got] == [2, 1, 1]


def test_offsets_retention_removed_before_they_were_read_are_discarded_not_skipped_in_silence():
    """Pure planning (Tansu cannot remove records: it has no DeleteRecords nor retention here)."""
    read = {"t/0": 5, "t/1": 40}
    planned = slice_of(45, read, lows={"t/0": 12, "t/1": 0, "t/2": 3}, ends={"t/0": 20, "t/1": 50, "t/2": 4},
                       budget=100, per_partition=None)
    assert planned["discarded"] == 7  # offsets 5..11 of t/0
    assert planned["ranges"] == [["t", 0, 12, 20], ["t", 1, 40, 50], ["t", 2, 3, 4]]  # t/2 is new: from its first
    assert json.loads(planned["cursor"]) == {"t/0": 20, "t/1": 50, "t/2": 4}
    assert planned["end"] == 74 and planned["backlog"] == 0
    assert "discarded" not in slice_of(0, {}, {"t/0": 3}, {"t/0": 3}, 10, None)


def test_keys_headers_and_timestamps_are_columns(spark, tansu):
    topic = create_topic(tansu.bootstrap, topic_name())
    produce(tansu.bootstrap, topic, _rows(2), partition=0, keys=[b"k0", None], headers=[("trace", b"t-1"), ("v", b"2")])
    src = _source(tansu.bootstrap, topics=[topic], metadata=["topic", "key", "headers", "timestamp"])
    rows = sorted(src.frames(spark, src.plan(0, 0.0), 1).data.collect(), key=lambda r: r.id)
    assert [(r.kafka_topic, r.kafka_key) for r in rows] == [(topic, b"k0"), (topic, None)]
    assert all(dict(r.kafka_headers) == {"trace": b"t-1", "v": b"2"} for r in rows)
    assert all(abs(r.kafka_timestamp.timestamp() - time.time()) < 600 for r in rows)  # the producer's time


def test_a_byte_budget_per_partition_ends_each_range_after_the_last_record_that_fits(spark, tansu):
    """Ranges planned under ``max_bytes_per_partition`` hold the records whose keys and values
    fit (at least one), and a replay of a plan reads exactly its records."""
    topic = create_topic(tansu.bootstrap, topic_name(), partitions=2)
    small = [json.dumps({"id": i, "name": "x" * (48 - len(str(i))), "price": 1.0}).encode() for i in range(30)]
    produce(tansu.bootstrap, topic, small, partition=0, keys=[b"k"] * 30)  # 82 + 1 bytes a record
    big = [json.dumps({"id": 100 + i, "name": "y" * 300, "price": 2.0}).encode() for i in range(3)]
    produce(tansu.bootstrap, topic, big, partition=1)  # 337 bytes a record, above the budget
    assert {len(v) + 1 for v in small} == {83} and {len(v) for v in big} == {337}
    src = _source(tansu.bootstrap, topics=[topic], max_bytes_per_partition=300, metadata=["partition", "offset"])
    first = src.plan(0, 0.0)
    assert first["ranges"] == [[topic, 0, 0, 3], [topic, 1, 0, 1]]  # 3 × 83 = 249 ≤ 300 < 332; one big alone
    assert first["backlog"] == 27 + 2 and first["lag"] == {f"{topic}/0": 27, f"{topic}/1": 2}
    got = sorted((r.kafka_partition, r.kafka_offset) for r in src.frames(spark, first, 2).data.collect())
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0)]
    again = sorted((r.kafka_partition, r.kafka_offset) for r in src.frames(spark, first, 3).data.collect())
    assert again == got
    # with a record budget as well, the smaller bound wins; planning goes on from the cursor
    both = _source(tansu.bootstrap, topics=[topic], max_bytes_per_partition=1000, max_records_per_partition=5)
    second = both.plan(first["end"], 0.0, first["cursor"])
    assert second["ranges"] == [[topic, 0, 3, 8], [topic, 1, 1, 3]]  # 5 records of 83; 2 of 337 = 674
    # over the whole topic, every offset is planned once
    cursor, start, seen = None, 0, []
    while True:
        p = src.plan(start, 0.0, cursor)
        if not p["ranges"]:
            break
        seen += [(t, part, o) for t, part, a, b in p["ranges"] for o in range(a, b)]
        cursor, start = p["cursor"], p["end"]
    assert sorted(seen) == sorted([(topic, 0, o) for o in range(30)] + [(topic, 1, o) for o in range(3)])


AVRO_BID = {"type": "record", "name": "Bid", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]},
    {"name": "price", "type": "double"}, {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}


def _avro(record: dict) -> bytes:
    import io

    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_BID), record)
    return out.getvalue()


def test_avro_values_plain_and_confluent_framed_are_decoded_and_bad_ones_are_dead_letters(spark, tansu, tmp_path):
    import struct
    from datetime import UTC, datetime

    t = datetime(2026, 3, 1, tzinfo=UTC)
    topic = create_topic(tansu.bootstrap, topic_name())
    produce(tansu.bootstrap, topic, [_avro({"id": 1, "name": "a", "price": 1.5, "ts": t}),
                                      _avro({"id": 2, "name": None, "price": 2.5, "ts": t}), b"\x02"], partition=0)
    schema_file = tmp_path / "bid.avsc"
    schema_file.write_text(json.dumps(AVRO_BID))
    src = _source(tansu.bootstrap, topics=[topic], format="avro", avro={"schema": str(schema_file)},
                  schema="id long, name string, price double, ts timestamp")
    frames = src.frames(spark, src.plan(0, 0.0), 2)
    got = sorted(tuple(r.values()) for r in frames.data.toArrow().to_pylist())  # (Arrow: timestamps in UTC)
    assert got == [(1, "a", 1.5, t), (2, None, 2.5, t)]
    assert [(r.file, r.line, r.reason) for r in frames.dead_letters.collect()] == [
        (f"{topic}/0", 2, f"not an Avro record of the schema (the value ends inside the record) (topic {topic}, "
                          "partition 0, offset 2)")]

    framed = create_topic(tansu.bootstrap, topic_name())
    wire = b"\x00" + struct.pack(">I", 42)
    produce(tansu.bootstrap, framed, [wire + _avro({"id": 3, "name": "c", "price": 3.0, "ts": t}), _avro(
        {"id": 4, "name": "d", "price": 4.0, "ts": t})], partition=0)
    src = _source(tansu.bootstrap, topics=[framed], format="avro", schema="id long, price double",
                  avro={"schema": json.dumps(AVRO_BID), "confluent": True, "schema_id": 42})
    frames = src.frames(spark, src.plan(0, 0.0), 1)
    assert [tuple(r) for r in frames.data.collect()] == [(3, 3.0)]
    assert [r.reason for r in frames.dead_letters.collect()] == [
        f"not in Confluent's wire format (a zero byte, then a 4-byte schema id) (topic {framed}, partition 0, offset 1)"]


def test_protobuf_values_are_decoded_with_the_descriptors(spark, tansu, tmp_path):
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fds = descriptor_pb2.FileDescriptorSet()
    f = fds.file.add(name="bid.proto", package="shop", syntax="proto3")
    m = f.message_type.add(name="Bid")
    F = descriptor_pb2.FieldDescriptorProto
    m.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="name", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    (tmp_path / "bid.desc").write_bytes(fds.SerializeToString())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    Bid = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Bid"))
    topic = create_topic(tansu.bootstrap, topic_name())
    produce(tansu.bootstrap, topic, [Bid(id=7, name="p").SerializeToString(), Bid(id=8).SerializeToString(), b"\x0a\xff"],
            partition=0)
    src = _source(tansu.bootstrap, topics=[topic], format="protobuf", schema="id long, name string",
                  protobuf={"descriptors": str(tmp_path / "bid.desc"), "message": "shop.Bid"})
    frames = src.frames(spark, src.plan(0, 0.0), 1)
    assert sorted(tuple(r) for r in frames.data.collect()) == [(7, "p"), (8, "")]
    [dead] = frames.dead_letters.collect()
    assert dead.line == 2 and dead.reason.startswith("not a Protobuf shop.Bid (")
    assert dead.reason.endswith(f"(topic {topic}, partition 0, offset 2)")


def test_bad_avro_and_protobuf_settings_are_refused_naming_the_field(tmp_path):
    good = json.dumps(AVRO_BID)
    (tmp_path / "junk.desc").write_bytes(b"\xff\xff")
    cases = [
        ({"format": "avro"}, "format: avro needs 'avro'"),
        ({"avro": {"schema": good}}, "avro: given, but format is 'json'"),
        ({"format": "avro", "avro": {"schema": "{nope"}}, "avro.schema: not JSON"),
        ({"format": "avro", "avro": {"schema": str(tmp_path / "missing.avsc")}}, "avro.schema: neither inline Avro JSON nor a readable file"),
        ({"format": "avro", "avro": {"schema": '{"type": "enum"}'}}, "avro.schema: not an Avro schema"),
        ({"format": "avro", "avro": {"schema": good}, "schema": "id long, size long"}, "column 'size' is no field of the Avro schema"),
        ({"format": "avro", "avro": {"schema": good}, "schema": "name long"}, "column 'name' is bigint, but the Avro schema has it as string"),
        ({"format": "protobuf", "protobuf": {"descriptors": str(tmp_path / "nope.desc"), "message": "a.B"}},
         "protobuf.descriptors: cannot read"),
        ({"format": "protobuf", "protobuf": {"descriptors": str(tmp_path / "junk.desc"), "message": "a.B"}},
         "protobuf.descriptors: not a FileDescriptorSet"),
        ({"format": "protobuf", "protobuf": {"descriptors": "x.desc"}}, r"protobuf.message\n  Field required"),
        ({"max_bytes_per_partition": 0}, "max_bytes_per_partition"),
    ]
    for params, message in cases:
        with pytest.raises(ValidationError, match=message):
            SourceSpec.model_validate({"name": "s", "kafka": {"schema": "id long", "topics": ["a"], **params}})
