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
