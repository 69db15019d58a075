"""The ``nats_core`` source (a core NATS subject kept in a write-ahead log) against a real
``nats-server``; nats-py, the reference client, publishes."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from eddyline.api.sources import SourceSpec
from eddyline.errors import SourceError
from eddyline.io.corenats import CoreNatsSource
from eddyline.io.local import LocalNats
from eddyline.io.natswire import NatsError, Subscription
from eddyline.io.wal import read_range, segments

SCHEMA = "id long, name string, price double"


def _subject() -> str:
    return f"core.{uuid.uuid4().hex[:10]}"


def publish(url: str, subject: str, payloads: list[bytes], headers: dict[int, dict[str, str]] | None = None) -> None:
    """Core NATS publish (no JetStream) with nats-py, flushed: the server has them all."""

    async def go() -> None:
        import nats

        nc = await nats.connect(url)
        for i, p in enumerate(payloads):
            await nc.publish(subject, p, headers=(headers or {}).get(i))
        await nc.flush()
        await nc.close()

    asyncio.run(go())


def _spec(url: str, subject: str, **extra) -> SourceSpec:
    return SourceSpec.model_validate({"name": "bids", "nats_core": {"url": url, "subject": subject, "schema": SCHEMA, **extra}})


def _wait_for(test, timeout_s: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not test():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_spec_names_the_field_that_is_wrong() -> None:
    ok = _spec("nats://127.0.0.1:4222", "orders.>", max_backlog="1MiB", segment_size="64KiB")
    assert (ok.params.max_backlog, ok.params.segment_size, ok.params.wait) == (1 << 20, 64 << 10, 30_000)
    cases = {
        "nats_core.subject": {"subject": "orders.>.x"},
        "nats_core.max_backlog": {"subject": "a", "max_backlog": "lots"},
        "nats_core.url": {"subject": "a", "url": "http://h:4222"},
        "nats_core.schema": {"subject": "a", "schema": ""},
    }
    for where, params in cases.items():
        with pytest.raises(ValidationError) as e:
            _spec(**{"url": "nats://127.0.0.1:4222", **params})
        assert where in str(e.value).replace("\n", " ").replace("  ", " ") or where.split(".")[1] in str(e.value), (where, e.value)
    with pytest.raises(ValidationError, match="segment_size: expected at most half of max_backlog"):
        _spec("nats://127.0.0.1:4222", "a", max_backlog="1MiB", segment_size="1MiB")
    with pytest.raises(ValidationError, match="subject"):
        SourceSpec.model_validate({"name": "b", "nats_core": {"schema": SCHEMA}})


def test_a_subscription_receives_messages_whole_in_order_with_headers_and_large_payloads(nats_server) -> None:
    subject = _subject()
    big = b"B" * 900_000  # more than one read of the socket
    payloads = [b"one", b"", big, b"with headers", *(b"m%d" % i for i in range(5000))]
    with Subscription(nats_server.url, f"{subject}.>") as sub:
        publish(nats_server.url, f"{subject}.x", payloads, headers={3: {"Nats-Msg-Id": "abc"}})
        publish(nats_server.url, "elsewhere.x", [b"not for us"])
        got: list[bytes] = []
        while len(got) < len(payloads):
            batch = sub.receive(2.0, max_bytes=64 << 10)
            assert batch, "nothing more arrived"
            got += batch
        assert got == payloads
        assert sub.receive(0.2) == []
    with pytest.raises(NatsError, match="invalid subject"):
        Subscription(nats_server.url, "has space")


def test_received_messages_go_to_the_log_and_are_read_in_tasks_with_dead_letters(spark, nats_server, tmp_path: Path) -> None:
    subject = _subject()
    src = CoreNatsSource(_spec(nats_server.url, subject))
    src.attach(str(tmp_path / "ckpt"), 0)
    try:
        good = [json.dumps({"id": i, "name": f"n{i}", "price": i * 1.5}).encode() for i in range(40)]
        bad = [b"not json at all", json.dumps({"id": "seven", "name": "x", "price": 1.0}).encode(),
               json.dumps({"id": 43, "price": 2.0}).encode()]
        publish(nats_server.url, subject, good + bad + [json.dumps({"id": 44, "name": None, "price": 0.5}).encode()])
        _wait_for(lambda: src.available(0.0) == 44)
        assert src.status() | {"wal_bytes": 0} == {"status": "ok", "retries": 0, "wal_bytes": 0, "wal_records": 44,
                                                   "wal_dropped": 0, "max_backlog": 256 << 20}
        planned = src.plan(10, 0.0)
        assert (planned["start"], planned["end"], planned["backlog"]) == (10, 44, 0)
        src.min_per_task = 5  # so that three tasks read sub-ranges
        frames = src.frames(spark, planned, 3)
        assert frames.data.rdd.getNumPartitions() == 3
        rows = sorted(tuple(r) for r in frames.data.collect())
        assert rows == [(i, f"n{i}", i * 1.5) for i in range(10, 40)] + [(44, None, 0.5)]
        dead = {r.line: r for r in frames.dead_letters.collect()}
        assert sorted(dead) == [41, 42, 43] and {(r.source, r.file) for r in dead.values()} == {("bids", subject)}
        assert dead[41].reason == "not a valid JSON object" and dead[41].raw == "not json at all"
        assert dead[42].reason.startswith("field 'id': expected bigint, got seven")
        assert dead[43].reason == "missing field(s): name"
        # a resident lane's share, read from the log's files by a copy of the source as a stage
        # pickles it (without the driver's receiver and open log): what Spark's task read
        lane = pickle.loads(pickle.dumps(src))
        assert lane.receiver is None and lane.wal is None
        shares = [lane.read_arrow(planned, task=i, tasks=3) for i in range(3)]
        assert all(s.data.num_rows for s in shares)
        assert sorted(tuple(r.values()) for s in shares for r in s.data.to_pylist()) == rows
        assert sorted(r["line"] for s in shares if s.dead_letters is not None for r in s.dead_letters.to_pylist()) == [41, 42, 43]
        assert src.frames(spark, {"start": 44, "end": 44}, 2).data.count() == 0
        # a range the log no longer holds is an error in the task, never an empty read
        src.committed(44)
        with pytest.raises(Exception, match="not in the log"):
            src.frames(spark, {"start": 44, "end": 50}, 1).data.collect()
    finally:
        src.detach()


def test_csv_records_and_the_spark_parsed_path_keep_their_dead_letters(spark, nats_server, tmp_path: Path) -> None:
    subject = _subject()
    src = CoreNatsSource(_spec(nats_server.url, subject, format="csv"))
    src.attach(str(tmp_path / "ckpt"), 0)
    try:
        publish(nats_server.url, subject, [b"1,a,1.5", b"2,\"b, c\",2.5", b"3,x", b"four,d,4.0"])
        _wait_for(lambda: src.available(0.0) == 4)
        frames = src.frames(spark, {"start": 0, "end": 4}, 2)
        assert sorted(tuple(r) for r in frames.data.collect()) == [(1, "a", 1.5), (2, "b, c", 2.5)]
        assert sorted((r.line, r.reason) for r in frames.dead_letters.collect()) == [
            (3, "expected 3 CSV fields, got 2"), (4, "field 'id': expected bigint, got four")]
    finally:
        src.detach()
    # a schema Arrow does not take is parsed in the JVM, from the same log
    nested = CoreNatsSource(SourceSpec.model_validate(
        {"name": "n", "nats_core": {"url": nats_server.url, "subject": subject, "schema": "id long, tags array<string>"}}))
    nested.attach(str(tmp_path / "ckpt2"), 0)
    try:
        publish(nats_server.url, subject, [b'{"id": 1, "tags": ["a"]}', b"{broken"])
        _wait_for(lambda: nested.available(0.0) == 2)
        frames = nested.frames(spark, {"start": 0, "end": 2}, 2)
        assert [tuple(r) for r in frames.data.collect()] == [(1, ["a"])]
        assert [(r.file, r.line) for r in frames.dead_letters.collect()] == [(subject, 2)]
    finally:
        nested.detach()


def test_a_full_log_drops_new_messages_counts_them_and_says_so(nats_server, tmp_path: Path) -> None:
    subject = _subject()
    src = CoreNatsSource(_spec(nats_server.url, subject, max_backlog="4KiB", segment_size="1KiB"))
    src.attach(str(tmp_path / "ckpt"), 0)
    try:
        payloads = [json.dumps({"id": i, "name": "x" * 40, "price": 1.0}).encode() for i in range(400)]
        for lo in range(0, 400, 50):  # in bursts, so the log takes several blocks
            publish(nats_server.url, subject, payloads[lo:lo + 50])
        _wait_for(lambda: src.receiver.received == 400)
        status = src.status()
        kept = src.available(0.0)
        assert 0 < kept < 400 and status["wal_dropped"] == 400 - kept and status["wal_bytes"] <= 4096
        assert status["status"].startswith("WAL full since") and status["wal_records"] == kept
        # what was kept is the messages as they came, in order, each once
        got = [p for _, ps in read_range(src.directory, 1, kept + 1) for p in ps]
        assert got == payloads[:kept]
        # once the epochs that read them commit, whole segments go and there is room again
        src.committed(kept)
        assert src.status()["wal_bytes"] < 1024 + 200
        publish(nats_server.url, subject, [b'{"id": 1000, "name": "late", "price": 2.0}'])
        _wait_for(lambda: src.available(0.0) == kept + 1)
        assert src.status()["status"] == "ok" and src.status()["wal_dropped"] == 400 - kept
    finally:
        src.detach()


def test_one_driver_at_a_time_writes_a_log_and_a_remote_checkpoint_is_refused(nats_server, tmp_path: Path) -> None:
    subject = _subject()
    first = CoreNatsSource(_spec(nats_server.url, subject))
    first.attach(str(tmp_path / "ckpt"), 0)
    try:
        second = CoreNatsSource(_spec(nats_server.url, subject, wait="500ms"))
        with pytest.raises(SourceError, match="source 'bids': write-ahead log: .* held by another process"):
            second.attach(str(tmp_path / "ckpt"), 0)
    finally:
        first.detach()
    with pytest.raises(SourceError, match="local or mounted file system"):
        CoreNatsSource(_spec(nats_server.url, subject)).attach("s3://bucket/ckpt", 0)
    with pytest.raises(SourceError, match="not receiving"):
        CoreNatsSource(_spec(nats_server.url, subject)).available(0.0)


def test_a_lost_server_is_retried_shown_and_after_wait_named_while_the_log_keeps_what_it_has(tmp_path: Path) -> None:
    server = LocalNats().start()
    subject = _subject()
    src = CoreNatsSource(_spec(server.url, subject, wait="3s"))
    try:
        src.attach(str(tmp_path / "ckpt"), 0)
        publish(server.url, subject, [b'{"id": 1, "name": "a", "price": 1.0}'])
        _wait_for(lambda: src.available(0.0) == 1)
        server.kill()
        _wait_for(lambda: src.status()["status"].startswith("retrying since"))
        assert src.available(0.0) == 1  # the log is still there to read
        server.start()  # same port: the subscriber comes back by itself
        _wait_for(lambda: src.receiver.subscribed.is_set() and src.status()["status"] == "ok")
        assert src.status()["retries"] >= 1
        publish(server.url, subject, [b'{"id": 2, "name": "b", "price": 2.0}'])
        _wait_for(lambda: src.available(0.0) == 2)
        server.kill()
        time.sleep(3.5)
        with pytest.raises(SourceError, match=r"source 'bids': NATS server nats://127.0.0.1:\d+ unreachable for \d+s "
                                              r"\(wait: 3s\); its write-ahead log keeps the 2 messages"):
            src.available(0.0)
    finally:
        src.detach()
        server.stop()
    # a server that is not there when the run starts: attach gives up after wait
    src = CoreNatsSource(_spec("nats://127.0.0.1:1", subject, wait="1s"))
    with pytest.raises(SourceError, match="unreachable for"):
        src.attach(str(tmp_path / "ckpt"), 0)
    assert src.receiver is None and src.wal is None
    assert len(segments(str(tmp_path / "ckpt" / "wal" / "bids"))) == 1
