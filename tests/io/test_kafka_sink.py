"""The ``kafka`` sink against a real Kafka-protocol broker (Tansu): one transaction an epoch, a
replayed epoch that Kafka committed written no more, and a zombie driver fenced by the broker.
A plain ``read_committed`` consumer reads the topic back. No Spark but where a frame is staged."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eddyline.api.sinks import SinkSpec
from eddyline.errors import Fenced, SinkError
from eddyline.io.kafka.sink import KafkaSink

from ..kafkaref import read_committed, topic_name

SCHEMA = StructType([StructField("k", StringType()), StructField("n", LongType())])


def _sink(bootstrap: str, topic: str, generation: int, network: str = "net", **params) -> KafkaSink:
    spec = SinkSpec.model_validate({"name": "counts", "input": "x",
                                    "kafka": {"brokers": bootstrap, "topic": topic, "wait": "10s", **params}})
    sink = KafkaSink(spec)
    sink.fence(generation)  # as the engine does, before it opens the sink
    sink.open(network, "ckpt", SCHEMA)
    return sink


def _stage(sink: KafkaSink, epoch: int, rows: list[int]) -> None:
    sink.collected[epoch] = pa.table({"k": pa.array([str(r % 3) for r in rows], pa.string()),
                                      "v": pa.array([json.dumps({"n": r}) for r in rows], pa.string())})


def _values(bootstrap: str, topic: str) -> list[int]:
    return sorted(json.loads(v)["n"] for _, _, _, v, _ in read_committed(bootstrap, topic))


def test_each_epoch_is_one_transaction_and_a_replay_of_a_committed_epoch_writes_nothing(tansu):
    topic = topic_name("out")
    sink = _sink(tansu.bootstrap, topic, 0, partitions=2)
    _stage(sink, 1, [1, 2, 3])
    sink.publish(1)
    records = read_committed(tansu.bootstrap, topic)
    assert sorted(json.loads(v)["n"] for *_, v, _ in records) == [1, 2, 3]
    assert all(dict(h).keys() == {"eddyline-epoch", "eddyline-writer", "eddyline-attempt"} for *_, h in records)
    assert {(dict(h)["eddyline-epoch"], dict(h)["eddyline-writer"]) for *_, h in records} == {(b"1", b"net/ckpt")}
    by_key = {}
    for p, _, k, _, _ in records:
        by_key.setdefault(k, set()).add(p)
    assert all(len(parts) == 1 for parts in by_key.values())  # a key stays in one partition

    # the driver died after Kafka committed epoch 1 but before the checkpoint did: a new one replays it
    again = _sink(tansu.bootstrap, topic, 0)
    _stage(again, 1, [1, 2, 3])
    again.publish(1)
    _stage(again, 2, [4])
    again.publish(2)
    assert _values(tansu.bootstrap, topic) == [1, 2, 3, 4]
    assert again.staged_rows(2) == 0  # published: nothing left staged
    again.close()
    sink.close()


def test_a_zombie_drivers_transaction_is_fenced_by_the_broker(tansu):
    topic = topic_name("out")
    old = _sink(tansu.bootstrap, topic, 1)
    _stage(old, 1, [1])
    old.publish(1)
    _stage(old, 2, [2])  # staged, then the driver froze; a standby took the lease over
    new = _sink(tansu.bootstrap, topic, 2)
    with pytest.raises(Fenced, match="lease generation 1 was taken over"):
        old.publish(2)
    _stage(new, 2, [20])
    new.publish(2)
    # the zombie wakes and opens its sink again: it finds the newer generation and stops, and
    # the producer it started does not fence the one of the generation that holds the lease
    with pytest.raises(Fenced, match="taken over by generation 2"):
        _sink(tansu.bootstrap, topic, 1)
    _stage(new, 3, [30])
    new.publish(3)
    assert _values(tansu.bootstrap, topic) == [1, 20, 30]


def test_the_transactional_id_depends_on_the_generation(tansu):
    """If every generation shared one id, the zombie's reopened producer (above) would have
    fenced the newer generation's: this pins the id to the generation."""
    topic = topic_name("out")
    sink = _sink(tansu.bootstrap, topic, 3)
    assert sink.transactional_id(3) != sink.transactional_id(4)
    assert sink.transactional_id(3) == "eddyline.net.ckpt.counts.g3"


def test_a_sink_that_cannot_write_says_why(tansu):
    with pytest.raises(SinkError, match=r"key: no column\(s\) \['nope'\]"):
        _sink(tansu.bootstrap, topic_name("out"), 0, key=["nope"])
    with pytest.raises(SinkError, match="Kafka brokers 127.0.0.1:1 unreachable"):
        _sink("127.0.0.1:1", topic_name("out"), 0, wait="1s")
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"topic\n.*expected a Kafka topic name .*got 'bad topic'"):
        SinkSpec.model_validate({"name": "c", "input": "x", "kafka": {"topic": "bad topic"}})
    with pytest.raises(SinkError, match="cannot take back tentative epochs"):
        spec = SinkSpec.model_validate({"name": "c", "input": "x", "kafka": {"brokers": tansu.bootstrap, "topic": "t"}})
        KafkaSink(spec).open("net", "ckpt", SCHEMA, tentative=True)


def test_rows_staged_from_a_frame_carry_key_and_revision_fields(spark, tansu):
    topic = topic_name("out")
    sink = _sink(tansu.bootstrap, topic, 0, key=["k"])
    df = spark.createDataFrame([("a", 1, "+", 1), ("b", 2, "-", -1)], "k string, n long, _op string, _diff int")
    sink.stage(df, 1)
    sink.publish(1)
    got = sorted((k, json.loads(v)) for _, _, k, v, _ in read_committed(tansu.bootstrap, topic))
    assert got == [(b"a", {"k": "a", "n": 1, "_op": "+", "_diff": 1}), (b"b", {"k": "b", "n": 2, "_op": "-", "_diff": -1})]


def test_the_two_drivers_of_a_hot_pair_publish_each_epoch_once_racing_for_it(tansu):
    """Both drivers of a hot pair publish every epoch at the same moment (the selector's record
    comes after a publish, so both may get there): each epoch's rows land once, and neither is
    stopped as fenced though they share the transactional id. Tansu shows a transaction one
    took from the other (aborted) too: the reader keeps each epoch's last attempt."""
    import threading

    from ..runtime.e2e.test_kafka_faults import last_attempts

    topic = topic_name("out")
    pair = []
    for driver in ("driver-a", "driver-b"):
        spec = SinkSpec.model_validate({"name": "counts", "input": "x",
                                        "kafka": {"brokers": tansu.bootstrap, "topic": topic, "wait": "20s"}})
        sink = KafkaSink(spec)
        sink.writer = driver  # as the runtime names a pair's drivers, before it opens the sinks
        sink.fence(3)
        pair.append(sink)
    opened = [threading.Thread(target=s.open, args=("net", "group", SCHEMA)) for s in pair]
    for t in opened:
        t.start()
    for t in opened:
        t.join()
    errors = []

    def run(sink: KafkaSink) -> None:
        try:
            for epoch in range(1, 6):
                _stage(sink, epoch, [10 * epoch, 10 * epoch + 1])
                sink.publish(epoch)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    keep, _ = last_attempts(read_committed(tansu.bootstrap, topic))
    assert sorted(json.loads(v)["n"] for *_, v, _ in keep) == sorted(n for e in range(1, 6) for n in (10 * e, 10 * e + 1))
    for s in pair:
        s.close()


def test_a_pair_driver_whose_transaction_is_taken_over_with_a_state_error_looks_again(tansu):
    """The other driver of a hot pair takes the shared transactional id over in the middle of
    this one's transaction and commits the epoch; librdkafka reports that to this producer's next
    call as a local ``_STATE`` ("Erroneous state") rather than as a fence (seen in
    tests/runtime/e2e/test_kafka_faults.py's hot pair, where it stopped the leader). This driver
    looks again, finds the epoch committed, and goes on: the epoch's rows are in the topic once."""
    from confluent_kafka import KafkaError, KafkaException

    from ..runtime.e2e.test_kafka_faults import last_attempts

    topic = topic_name("out")
    pair = []
    for driver in ("driver-a", "driver-b"):
        spec = SinkSpec.model_validate({"name": "counts", "input": "x",
                                        "kafka": {"brokers": tansu.bootstrap, "topic": topic, "wait": "20s"}})
        sink = KafkaSink(spec)
        sink.writer = driver
        sink.fence(3)
        sink.open("net", "group", SCHEMA)
        pair.append(sink)
    a, b = pair
    for s in pair:
        _stage(s, 1, [10, 11, 12, 13])

    def taken_over() -> None:
        b.publish(1)  # takes the id over (a's open transaction is aborted) and commits epoch 1
        raise KafkaException(KafkaError(KafkaError._STATE, "Failed to commit offsets to transaction on broker "
                                        "(none): Local: Erroneous state"))

    a.publish(1, midway=taken_over)
    keep, _ = last_attempts(read_committed(tansu.bootstrap, topic))
    assert sorted(json.loads(v)["n"] for *_, v, _ in keep) == [10, 11, 12, 13]
    _stage(a, 2, [20])
    a.publish(2)  # and it goes on
    assert _values(tansu.bootstrap, topic)[-1] == 20
    for s in pair:
        s.close()
