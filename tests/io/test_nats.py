"""The ``nats`` source and sink against a real ``nats-server -js``; nats-py, the reference client,
writes the input streams and reads the outputs back."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from eddyline.api.sinks import SinkSpec
from eddyline.api.sources import SourceSpec
from eddyline.errors import SourceError
from eddyline.io.jetstream import NatsSink, NatsSource
from eddyline.io.natswire import NatsConnection, NatsError, NatsUnreachable, ensure_stream

from ..natsref import read_stream

SCHEMA = "id long, name string, price double"


def _stream() -> str:
    return f"S{uuid.uuid4().hex[:10]}"


async def _publish(url: str, stream: str, payloads: list[bytes], *, allow_direct: bool = True) -> None:
    import nats
    from nats.js.api import StreamConfig

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.>"], allow_direct=allow_direct))
    for i, p in enumerate(payloads):
        await js.publish(f"{stream}.{'a' if i % 2 == 0 else 'b'}", p)
    await nc.close()


def _source(url: str, stream: str, **extra) -> NatsSource:
    return NatsSource(SourceSpec.model_validate(
        {"name": "bids", "nats": {"url": url, "stream": stream, "schema": SCHEMA, **extra}}))


def test_the_wire_client_reads_ranges_as_nats_py_wrote_them_and_publishes_with_dedup(nats_server):
    stream = _stream()
    payloads = [json.dumps({"id": i}).encode() for i in range(25)]
    asyncio.run(_publish(nats_server.url, stream, payloads))
    with NatsConnection(nats_server.url) as c:
        got = [(s, p) for seqs, ps in c.read_range(stream, 3, 20, batch=4) for s, p in zip(seqs, ps, strict=True)]
        assert got == [(s, payloads[s - 1]) for s in range(3, 20)]
        only_b = [s for seqs, _ in c.read_range(stream, 1, 26, f"{stream}.b") for s in seqs]
        assert only_b == list(range(2, 26, 2))
        assert list(c.read_range(stream, 26, 40)) == []
        # deleted messages: a batch is filled from later sequences, which the next batch reads
        for gone in (5, 8, 9, 10, 11, 24):
            c.api(f"STREAM.MSG.DELETE.{stream}", {"seq": gone})
        kept = [s for s in range(1, 26) if s not in (5, 8, 9, 10, 11, 24)]
        for size in (1, 3, 4, 100):
            got = [(s, p) for seqs, ps in c.read_range(stream, 1, 40, batch=size) for s, p in zip(seqs, ps, strict=True)]
            assert got == [(s, payloads[s - 1]) for s in kept], size
        assert [s for seqs, _ in c.read_range(stream, 8, 12, batch=2) for s in seqs] == []

        out = _stream()
        ensure_stream(c, out, [f"{out}.x"], duplicate_window_ms=60_000)
        first = c.publish([(f"{out}.x", f"id-{i}", b"%d" % i) for i in range(5)])
        again = c.publish([(f"{out}.x", f"id-{i}", b"%d" % i) for i in range(7)])
        assert first == [False] * 5
        assert again == [True] * 5 + [False] * 2
        with pytest.raises(NatsError, match="no stream takes subject"):
            c.publish([("nowhere.at.all", None, b"x")])
    assert [(s, p) for s, p, _ in read_stream(nats_server.url, out)] == [
        (i + 1, b"%d" % i) for i in range(7)]
    with pytest.raises(NatsUnreachable, match="127.0.0.1:1"):
        NatsConnection("nats://127.0.0.1:1", timeout_s=1)


def test_a_read_leaves_no_consumer_behind_though_it_does_not_wait_for_the_delete(nats_server):
    import time

    stream = _stream()
    asyncio.run(_publish(nats_server.url, stream, [b"{}"] * 30))
    for start in (1, 11, 21):  # each read on its own connection, closed right after, as a task does
        with NatsConnection(nats_server.url) as c:
            assert [s for seqs, _ in c.read_range(stream, start, start + 10) for s in seqs] == list(range(start, start + 10))
    with NatsConnection(nats_server.url) as c:
        for _ in range(3):
            assert sum(len(seqs) for seqs, _ in c.read_range(stream, 1, 31)) == 30
        deadline = time.monotonic() + 5  # the server drops idle consumers only after a minute
        while c.stream_info(stream)["state"]["consumer_count"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.stream_info(stream)["state"]["consumer_count"] == 0


def test_the_source_reads_its_planned_range_in_sub_ranges_and_keeps_bad_records_with_the_reason(spark, nats_server):
    stream = _stream()
    good = [json.dumps({"id": i, "name": f"n{i}", "price": i * 1.5}).encode() for i in range(40)]
    bad = {
        41: b"not json at all",
        42: json.dumps({"id": "seven", "name": "x", "price": 1.0}).encode(),  # wrong type
        43: json.dumps({"id": 43, "price": 2.0}).encode(),  # a field missing
        44: json.dumps({"id": 44, "name": "y" * 1_000_000, "price": 3.0}).encode()[:1_000_000],  # cut 1 MB
    }
    payloads = good + [bad[k] for k in sorted(bad)] + [json.dumps({"id": 45, "name": None, "price": 0.5}).encode()]
    asyncio.run(_publish(nats_server.url, stream, payloads))
    src = _source(nats_server.url, stream)
    assert src.available(0.0) == 45
    planned = src.plan(10, 0.0)
    assert (planned["start"], planned["end"], planned["backlog"]) == (10, 45, 0)

    frames = src.frames(spark, planned, 3)
    rows = sorted(tuple(r) for r in frames.data.collect())
    assert rows == [(i, f"n{i}", i * 1.5) for i in range(10, 40)] + [(45, None, 0.5)]  # a null is a value
    dead = {r.line: r for r in frames.dead_letters.collect()}
    assert sorted(dead) == [41, 42, 43, 44] and {r.file for r in dead.values()} == {stream}
    assert dead[41].reason == "not a valid JSON object"
    assert dead[42].reason.startswith("field 'id': expected bigint, got seven")
    assert dead[43].reason == "missing field(s): name"
    assert dead[44].reason == "not a valid JSON object" and len(dead[44].raw) == 1_000_000

    # more partitions than records still reads every record once; an empty range reads none
    assert frames.data.count() == src.frames(spark, planned, 64).data.count() == 31
    assert src.frames(spark, {"start": 45, "end": 45}, 2).data.count() == 0


def test_csv_records_in_a_stream_are_decoded_with_their_dead_letters(spark, nats_server):
    stream = _stream()
    payloads = [b"1,a,1.5", b"2,\"b, c\",2.5", b"3,x", b"four,d,4.0", b"5,,"]
    asyncio.run(_publish(nats_server.url, stream, payloads))
    frames = _source(nats_server.url, stream, format="csv").frames(spark, {"start": 0, "end": 5}, 2)
    assert sorted(tuple(r) for r in frames.data.collect()) == [(1, "a", 1.5), (2, "b, c", 2.5), (5, None, None)]
    dead = sorted((r.file, r.line, r.raw, r.reason) for r in frames.dead_letters.collect())
    assert dead == [(stream, 3, "3,x", "expected 3 CSV fields, got 2"),
                    (stream, 4, "four,d,4.0", "field 'id': expected bigint, got four")]


def test_any_stream_is_read_and_a_missing_one_is_named(spark, nats_server):
    stream = _stream()
    asyncio.run(_publish(nats_server.url, stream, [b'{"id": 1, "name": "a", "price": 2.0}'], allow_direct=False))
    src = _source(nats_server.url, stream)
    assert src.available(0.0) == 1
    assert [tuple(r) for r in src.frames(spark, {"start": 0, "end": 1}, 2).data.collect()] == [(1, "a", 2.0)]
    with pytest.raises(SourceError, match="source 'bids'.*stream not found"):
        _source(nats_server.url, "NOPE").available(0.0)


def test_an_unreachable_server_is_retried_for_wait_then_named_in_the_error():
    src = _source("nats://127.0.0.1:1", "S", wait="1s")
    with pytest.raises(SourceError, match=r"source 'bids': NATS server nats://127.0.0.1:1 unreachable for \d+s"):
        src.available(0.0)
    assert src.status()["status"].startswith("retrying since") and src.status()["retries"] >= 3


def test_the_sink_publishes_each_row_once_and_a_replayed_epoch_adds_nothing(spark, nats_server):
    out = _stream()
    spec = SinkSpec.model_validate(
        {"name": "counts", "input": "x", "nats": {"url": nats_server.url, "stream": out, "subject": f"{out}.counts"}})
    df = spark.createDataFrame([(2, "b"), (1, "a"), (3, "c")], "k long, v string")
    first = NatsSink(spec)
    first.open("net", "ckpt1", df.schema)
    first.stage(df, 7)
    assert first.staged_rows(7) == 3
    first.publish(7)
    # a new driver replays epoch 7 (its rows come in another order) and goes on with epoch 8
    second = NatsSink(spec)
    second.open("net", "ckpt1", df.schema)
    second.stage(df.orderBy("v", ascending=False), 7)
    second.publish(7)
    second.stage(spark.createDataFrame([(4, "d")], "k long, v string"), 8)
    second.publish(8)
    got = read_stream(nats_server.url, out)
    assert [(json.loads(p), mid) for _, p, mid in got] == [
        ({"k": 1, "v": "a"}, "net/ckpt1/counts/7/0"), ({"k": 2, "v": "b"}, "net/ckpt1/counts/7/1"),
        ({"k": 3, "v": "c"}, "net/ckpt1/counts/7/2"), ({"k": 4, "v": "d"}, "net/ckpt1/counts/8/0"),
    ]

    # rows packed two a message, one a line: the same ids number messages, a replay adds nothing
    packed = SinkSpec.model_validate({"name": "counts", "input": "x", "nats": {
        "url": nats_server.url, "stream": f"{out}P", "subject": f"{out}P.counts", "records_per_message": 2}})
    for order in ("v", "k"):
        sink = NatsSink(packed)
        sink.open("net", "ckpt1", df.schema)
        sink.stage(df.orderBy(order, ascending=False), 7)
        sink.publish(7)
    assert [([json.loads(x) for x in p.split(b"\n")], mid) for _, p, mid in read_stream(nats_server.url, f"{out}P")] == [
        ([{"k": 1, "v": "a"}, {"k": 2, "v": "b"}], "net/ckpt1/counts/7/0"), ([{"k": 3, "v": "c"}], "net/ckpt1/counts/7/1"),
    ]


def test_a_url_that_is_not_nats_or_tls_is_refused_with_the_spec_and_names_the_field():
    from pydantic import ValidationError

    from eddyline.api.validate import load_spec
    from eddyline.errors import SpecError

    for bad in ("https://user:secret@host:4222", "http://host", "nats://", "tls://user:secret@host:4222?ca=/nowhere"):
        with pytest.raises(SpecError) as e:
            load_spec({"name": "n", "sources": [{"name": "b", "nats": {"url": bad, "stream": "S", "schema": SCHEMA}}],
                       "steps": [], "sinks": [{"name": "o", "input": "b", "memory": {}}]})
        first = e.value.problems[0]
        assert first.startswith("source 'b': url: ") and "secret" not in first, first
        assert "expected nats://" in first or "TLS files {'ca': '/nowhere'}" in first, first
    with pytest.raises(ValidationError, match=r"nats.url(.|\n)*unknown TLS option"):
        SinkSpec.model_validate({"name": "o", "input": "x", "nats": {"url": "tls://h?cafile=x", "stream": "S", "subject": "s"}})


def test_sequences_a_streams_limits_dropped_before_they_were_read_are_said_in_the_plan(spark, nats_server):
    stream = _stream()
    with NatsConnection(nats_server.url) as conn:  # keeps the newest 10 messages only
        conn.api(f"STREAM.CREATE.{stream}", {"name": stream, "subjects": [f"{stream}.>"], "storage": "memory",
                                             "retention": "limits", "discard": "old", "max_msgs": 10, "num_replicas": 1})
        conn.publish([(f"{stream}.a", f"m{i}", json.dumps({"id": i, "name": "n", "price": 1.0}).encode())
                      for i in range(1, 31)])
    src = NatsSource(SourceSpec.model_validate({"name": "bids", "max_rows_per_epoch": 25,
                                                "nats": {"url": nats_server.url, "stream": stream, "schema": SCHEMA}}))
    planned = src.plan(0, 0.0)  # sequences 1-25, of which 1-20 are gone
    assert (planned["start"], planned["end"], planned["discarded"]) == (0, 25, 20)
    assert sorted(r.id for r in src.frames(spark, planned, 2).data.collect()) == list(range(21, 26))
    assert "discarded" not in src.plan(25, 0.0)  # 26-30 are all there


def test_the_progress_says_how_many_sequences_were_gone_when_read(spark, nats_server, tmp_path):
    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    stream = _stream()
    with NatsConnection(nats_server.url) as conn:
        conn.api(f"STREAM.CREATE.{stream}", {"name": stream, "subjects": [f"{stream}.>"], "storage": "memory",
                                             "retention": "limits", "discard": "old", "max_msgs": 10, "num_replicas": 1})
        conn.publish([(f"{stream}.a", None, json.dumps({"id": i, "name": "n", "price": 1.0}).encode())
                      for i in range(1, 31)])
    records: list[dict] = []

    class Keep(ProgressReporter):
        def report(self, record: dict) -> None:
            records.append(record)

    net = load_spec({"name": "limited", "trigger": 0,
                     "sources": [{"name": "bids", "nats": {"url": nats_server.url, "stream": stream, "schema": SCHEMA}}],
                     "sinks": [{"name": "out", "input": "bids", "files": {"path": str(tmp_path / "out")}}]})
    Engine(net, spark, str(tmp_path / "ckpt"), reporter=Keep()).run(epochs=1)  # type: ignore[arg-type]
    (source,) = records[0]["sources"]
    assert (source["numInputRows"], source["discarded"]) == (10, 20)


def test_messages_that_hold_records_one_per_line_are_read_record_by_record(spark, nats_server):
    stream = _stream()
    row = lambda i: json.dumps({"id": i, "name": f"n{i}", "price": i * 0.5})  # noqa: E731
    payloads = [
        "\n".join(row(i) for i in range(3)).encode(),
        f"{row(3)}\r\nnot json\n\n{row(4)}\n".encode(),  # CRLF, a bad record, a blank line, a final newline
        row(5).encode(),
        b"",  # no record at all
        "\n".join(row(i) for i in range(6, 500)).encode(),
    ]
    asyncio.run(_publish(nats_server.url, stream, payloads))
    src = _source(nats_server.url, stream, records="lines")
    assert src.available(0.0) == 5 and src.min_per_task < NatsSource.min_per_task
    frames = src.frames(spark, src.plan(0, 0.0), 2)
    assert sorted(tuple(r) for r in frames.data.collect()) == [(i, f"n{i}", i * 0.5) for i in range(500)]
    dead = [(r.file, r.line, r.raw, r.reason) for r in frames.dead_letters.collect()]
    assert dead == [(stream, 2, "not json", "not a valid JSON object")]
    # the same stream read a message a record: only the single-record message fits
    whole = _source(nats_server.url, stream).frames(spark, {"start": 0, "end": 5}, 2)
    assert [tuple(r) for r in whole.data.collect()] == [(5, "n5", 2.5)]


def test_a_frame_built_once_reads_a_small_slice_in_one_task_and_a_large_one_in_several(spark, nats_server):
    """A frame whose tasks take the slice when they run has one task for a slice one task reads
    whole (so no Python task runs for nothing) and one per partition for a larger one: a
    different key, so that the engine keeps one frame of each. Both read exactly the slice."""
    from eddyline.io.sources import slice_properties

    stream = _stream()
    asyncio.run(_publish(nats_server.url, stream, [
        json.dumps({"id": i, "name": f"n{i}", "price": 1.0}).encode() for i in range(30)]))
    src = _source(nats_server.url, stream)
    src.min_per_task = 5
    small, large, empty = {"start": 0, "end": 5}, {"start": 5, "end": 30}, {"start": 30, "end": 30}
    assert src.run_time_key(small) == src.run_time_key(empty) != src.run_time_key(large)
    try:
        for planned, tasks in ((small, 1), (large, 3), (empty, 1)):
            src.run_time_key(planned)
            df = src.frames(spark, None, 3).data
            for key, value in slice_properties({src.name: planned}).items():
                spark.sparkContext.setLocalProperty(key, value)
            assert df.rdd.getNumPartitions() == tasks
            assert sorted(r.id for r in df.collect()) == list(range(planned["start"], planned["end"]))
    finally:
        for key in slice_properties({src.name: small}):
            spark.sparkContext.setLocalProperty(key, None)
