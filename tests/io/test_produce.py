"""``eddyline produce``: a generator's rows published to a real NATS JetStream stream, one a
message or several a message, and read back by the ``nats`` source."""

from __future__ import annotations

import json
import uuid

import pytest

from eddyline.api.sources import SourceSpec
from eddyline.errors import EddylineError
from eddyline.io import produce as producing
from eddyline.io.jetstream import NatsSource
from eddyline.io.nexmark import Nexmark, nexmark_frame, nexmark_schema
from eddyline.io.produce import Feed, produce

from ..natsref import read_stream

EVENTS = 600
BID = {"stream": "bid", "rate": 1_000, "unpaced": True}


def _bids(spark) -> list[dict]:
    rows = nexmark_frame(spark, Nexmark(**BID), 0, EVENTS, 2).toArrow().to_pylist()
    return sorted(rows, key=lambda r: (r["date_time"], r["auction"], r["bidder"], r["price"]))


@pytest.mark.parametrize("per", [1, 7])
def test_rows_cut_into_messages_the_same_way_however_the_offsets_are_chunked(spark, nats_server, monkeypatch, per):
    stream = f"P{uuid.uuid4().hex[:8]}"
    feeds = [Feed(SourceSpec.model_validate({"name": "bid", "nexmark": BID}), f"{stream}.bid")]
    monkeypatch.setattr(producing, "UNPACED_CHUNK", 300)  # chunks of 276 bids: no multiple of 7
    assert produce(spark, nats_server.url, stream, feeds, end=EVENTS, records_per_message=per) == EVENTS
    first = read_stream(nats_server.url, stream)
    monkeypatch.setattr(producing, "UNPACED_CHUNK", 1_000)
    produce(spark, nats_server.url, stream, feeds, end=EVENTS, records_per_message=per)  # a restarted producer
    messages = read_stream(nats_server.url, stream)
    assert messages == first, "producing the same offsets again added messages"
    bids = _bids(spark)
    assert len(messages) == -(-len(bids) // per)
    short = len(bids) % per
    assert [mid for _, _, mid in messages] == [f"bid/0/{n}" for n in range(len(messages) - bool(short))] + (
        [f"bid/0/{len(messages) - 1}.{short}"] if short else [])
    assert all(len(p.split(b"\n")) == per for _, p, _ in messages[:-1])

    source = NatsSource(SourceSpec.model_validate({"name": "bids", "nats": {
        "url": nats_server.url, "stream": stream, "schema": nexmark_schema("bid"),
        "records": "lines" if per > 1 else "message"}}))
    got = source.frames(spark, source.plan(0, 0.0), 2).data.toArrow().to_pylist()
    assert sorted(got, key=lambda r: (r["date_time"], r["auction"], r["bidder"], r["price"])) == bids


def test_a_message_count_below_one_is_refused(spark, nats_server):
    feeds = [Feed(SourceSpec.model_validate({"name": "bid", "nexmark": BID}), "X.bid")]
    with pytest.raises(ValueError, match="records_per_message: expected at least 1, got 0"):
        produce(spark, nats_server.url, "X", feeds, end=10, records_per_message=0)


def test_a_stopped_producer_sends_its_short_last_message_and_a_restart_sends_those_rows_again(
    spark, nats_server, monkeypatch
):
    stream = f"P{uuid.uuid4().hex[:8]}"
    feeds = [Feed(SourceSpec.model_validate({"name": "bid", "nexmark": BID}), f"{stream}.bid")]
    monkeypatch.setattr(producing, "UNPACED_CHUNK", 300)  # 276 bids: 39 messages of 7 and 3 bids left
    chunks = []
    reached = produce(spark, nats_server.url, stream, feeds, end=EVENTS, records_per_message=7,
                      should_stop=lambda: bool(chunks), on_chunk=lambda done, n: chunks.append(n))
    assert reached == 300 and chunks == [39]
    stopped = read_stream(nats_server.url, stream)
    assert len(stopped) == 40 and stopped[-1][2] == "bid/0/39.3" and len(stopped[-1][1].split(b"\n")) == 3
    produce(spark, nats_server.url, stream, feeds, end=EVENTS, records_per_message=7)
    rows = [line for _, p, _ in read_stream(nats_server.url, stream) for line in p.split(b"\n")]
    bids = _bids(spark)
    assert len(rows) == len(bids) + 3 and len(set(rows)) == len(bids)


def test_nexmark_bids_produced_to_a_kafka_topic_are_read_back_by_the_kafka_source(spark, tansu):
    from eddyline.cli.producing import _target
    from eddyline.errors import SpecError
    from eddyline.io.kafka import KafkaSource
    from eddyline.io.produce import produce_kafka

    topic = f"bids-{uuid.uuid4().hex[:8]}"
    assert _target(f"kafka://{tansu.bootstrap}/{topic}") == (f"kafka://{tansu.bootstrap}", topic)
    with pytest.raises(SpecError, match="expected kafka://host:port"):
        _target("kafka://host:9092/")
    feeds = [Feed(SourceSpec.model_validate({"name": "bid", "nexmark": BID}), topic)]
    assert produce_kafka(spark, tansu.bootstrap, feeds, end=EVENTS, partitions=2) == EVENTS
    source = KafkaSource(SourceSpec.model_validate({"name": "bids", "kafka": {
        "brokers": tansu.bootstrap, "topics": [topic], "schema": nexmark_schema("bid")}}))
    planned = source.plan(0, 0.0)
    assert sorted(json.loads(planned["cursor"])) == [f"{topic}/0", f"{topic}/1"]  # made with two partitions
    got = source.frames(spark, planned, 2).data.toArrow().to_pylist()
    assert sorted(got, key=lambda r: (r["date_time"], r["auction"], r["bidder"], r["price"])) == _bids(spark)


def test_nexmark_bids_produced_as_avro_are_read_back_by_the_kafka_source_with_the_schema_written(
    spark, tansu, tmp_path
):
    from eddyline.io.kafka import KafkaSource
    from eddyline.io.produce import produce_kafka

    topic = f"bids-{uuid.uuid4().hex[:8]}"
    feeds = [Feed(SourceSpec.model_validate({"name": "bid", "nexmark": BID}), topic)]
    schemas: dict[str, dict] = {}
    assert produce_kafka(spark, tansu.bootstrap, feeds, end=EVENTS, value_format="avro",
                         on_schema=schemas.__setitem__) == EVENTS
    (tmp_path / "bid.avsc").write_text(json.dumps(schemas[topic]))
    source = KafkaSource(SourceSpec.model_validate({"name": "bids", "kafka": {
        "brokers": tansu.bootstrap, "topics": [topic], "schema": nexmark_schema("bid"), "format": "avro",
        "avro": {"schema": str(tmp_path / "bid.avsc")}}}))
    frames = source.frames(spark, source.plan(0, 0.0), 2)
    got = frames.data.toArrow().to_pylist()
    assert sorted(got, key=lambda r: (r["date_time"], r["auction"], r["bidder"], r["price"])) == _bids(spark)
    assert frames.dead_letters.count() == 0
    with pytest.raises(EddylineError, match="value format: expected json, avro, protobuf, got 'xml'"):
        produce_kafka(spark, tansu.bootstrap, feeds, end=1, value_format="xml")


def test_nexmark_bids_produced_as_protobuf_by_the_cli_are_read_back_with_the_descriptors_it_wrote(
    spark, tansu, tmp_path, monkeypatch
):
    from typer.testing import CliRunner

    from eddyline.cli import app
    from eddyline.io.kafka import KafkaSource

    monkeypatch.setattr("signal.signal", lambda *_: None)  # the command's Ctrl-C handler: not pytest's to keep
    topic = f"pb-{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    done = runner.invoke(app, ["produce", "nexmark", "--to", f"kafka://{tansu.bootstrap}/{topic}", "--only", "bid",
                               "--set", "rate=1000", "--events", str(EVENTS), "--partitions", "2",
                               "--format", "protobuf", "--schemas", str(tmp_path / "schemas")])
    assert done.exit_code == 0, done.output
    descriptors = tmp_path / "schemas" / f"{topic}.bid.desc"
    message = f"eddyline.{topic.replace('-', '_')}_bid"
    assert f"Protobuf message {message}" in done.output
    source = KafkaSource(SourceSpec.model_validate({"name": "bids", "kafka": {
        "brokers": tansu.bootstrap, "topics": [f"{topic}.bid"], "schema": nexmark_schema("bid"),
        "format": "protobuf", "protobuf": {"descriptors": str(descriptors), "message": message}}}))
    frames = source.frames(spark, source.plan(0, 0.0), 2)
    got = frames.data.toArrow().to_pylist()
    assert sorted(got, key=lambda r: (r["date_time"], r["auction"], r["bidder"], r["price"])) == _bids(spark)
    assert frames.dead_letters.count() == 0

    for args, says in [(["--format", "thrift"], "--format: expected json, avro, protobuf, got 'thrift'"),
                       (["--format", "protobuf", "--to", "nats://127.0.0.1:4222/NEXMARK"],
                        "--format protobuf: Kafka only (--to kafka://...)")]:
        refused = runner.invoke(app, ["produce", "nexmark", "--to", f"kafka://{tansu.bootstrap}/{topic}",
                                      "--events", "1", *args])
        assert refused.exit_code != 0 and says in refused.output, refused.output


def test_protobuf_descriptors_of_rows_refuse_a_column_protobuf_has_no_type_for():
    import pyarrow as pa

    from eddyline.io.binrecords import protobuf_descriptors_of

    with pytest.raises(ValueError, match="column 'day': date32.* has no Protobuf type"):
        protobuf_descriptors_of(pa.schema([("id", pa.int64()), ("day", pa.date32())]), "t")
