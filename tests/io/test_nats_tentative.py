"""The ``nats`` sink's tentative epochs (Delay-Process-Correct) against a real ``nats-server -js``:
tentative messages are marked, a retraction publishes one correction per epoch, once, and a
consumer that follows the module's rules ends with the stable rows; nats-py, the reference
client, reads the stream back with every header."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from eddyline.api.sinks import SinkSpec
from eddyline.errors import SinkError
from eddyline.io.jetstream import NatsSink
from eddyline.io.natswire import NatsConnection, ensure_stream
from tests.io.natsread import consume, read_stream

pytestmark = pytest.mark.spark

SCHEMA = "k long, v string"


def _stream() -> str:
    return f"T{uuid.uuid4().hex[:10]}"


def _sink(url: str, stream: str, name: str = "counts") -> NatsSink:
    return NatsSink(
        SinkSpec.model_validate(
            {
                "name": name,
                "input": "x",
                "nats": {"url": url, "stream": stream, "subject": f"{stream}.{name}"},
            }
        )
    )


def _epoch(
    sink: NatsSink, spark: Any, rows: list[tuple[int, str]], epoch: int, tentative: bool = False
) -> None:
    sink.stage(spark.createDataFrame(rows, SCHEMA), epoch)
    sink.publish(epoch, tentative=tentative)


def test_tentative_messages_are_marked_and_retracted_once_by_one_correction_per_epoch(
    spark, nats_server
):
    out = _stream()
    with NatsConnection(nats_server.url) as c:  # a stream for both sinks' subjects
        ensure_stream(c, out, [f"{out}.>"])
    sink = _sink(nats_server.url, out)
    sink.open("net", "ckpt1", spark.createDataFrame([], SCHEMA).schema, tentative=True)
    # another sink on the same stream, tentative too: its rows are not the first one's to retract
    other = _sink(nats_server.url, out, name="other")
    other.open("net", "ckpt1", spark.createDataFrame([], SCHEMA).schema, tentative=True)
    _epoch(sink, spark, [(1, "a"), (2, "b")], 1)
    _epoch(sink, spark, [(3, "c"), (4, "d")], 2, tentative=True)
    _epoch(other, spark, [(9, "z")], 2, tentative=True)
    _epoch(sink, spark, [(5, "e")], 3, tentative=True)
    got = read_stream(nats_server.url, out)
    assert [h for h, _ in got] == [
        {"Nats-Msg-Id": "net/ckpt1/counts/1/0"},
        {"Nats-Msg-Id": "net/ckpt1/counts/1/1"},
        {
            "Nats-Msg-Id": "net/ckpt1/counts/2/0",
            "Eddyline-Tentative": "true",
            "Eddyline-Epoch": "2",
        },
        {
            "Nats-Msg-Id": "net/ckpt1/counts/2/1",
            "Eddyline-Tentative": "true",
            "Eddyline-Epoch": "2",
        },
        {"Nats-Msg-Id": "net/ckpt1/other/2/0", "Eddyline-Tentative": "true", "Eddyline-Epoch": "2"},
        {
            "Nats-Msg-Id": "net/ckpt1/counts/3/0",
            "Eddyline-Tentative": "true",
            "Eddyline-Epoch": "3",
        },
    ]
    # a new driver replays tentative epoch 3: the server drops it, marked or not
    again = _sink(nats_server.url, out)
    again.open("net", "ckpt1", spark.createDataFrame([], SCHEMA).schema, tentative=True)
    _epoch(again, spark, [(5, "e")], 3, tentative=True)
    assert len(read_stream(nats_server.url, out)) == 6

    again.retract([3, 2], at_epoch=4)
    corrections = read_stream(nats_server.url, out)[6:]
    assert [(h, json.loads(p)) for h, p in corrections] == [
        (
            {"Nats-Msg-Id": "net/ckpt1/counts/retract/2", "Eddyline-Retract": "2"},
            {"retract_epoch": 2, "at_epoch": 4, "writer": "net/ckpt1", "sink": "counts"},
        ),
        (
            {"Nats-Msg-Id": "net/ckpt1/counts/retract/3", "Eddyline-Retract": "3"},
            {"retract_epoch": 3, "at_epoch": 4, "writer": "net/ckpt1", "sink": "counts"},
        ),
    ]
    # a replay of epoch 4, by this driver or the first one: nothing more
    again.retract([2, 3], at_epoch=4)
    sink.retract([2, 3], at_epoch=4)
    assert len(read_stream(nats_server.url, out)) == 8
    # the correcting epoch publishes as usual, unmarked
    _epoch(again, spark, [(3, "c"), (5, "e2")], 4)
    got = read_stream(nats_server.url, out)
    assert [h for h, _ in got[8:]] == [
        {"Nats-Msg-Id": "net/ckpt1/counts/4/0"},
        {"Nats-Msg-Id": "net/ckpt1/counts/4/1"},
    ]
    shown, final = consume(got)
    stable = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 5, "v": "e2"}]
    assert final == stable
    assert shown == [
        *stable[:2],
        {"k": 9, "v": "z"},
        *stable[2:],
    ]  # the other sink's row stays till it retracts
    other.retract([2], at_epoch=3)
    assert consume(read_stream(nats_server.url, out)) == (stable, stable)


def test_retracting_nothing_publishes_nothing_and_before_open_is_refused(spark, nats_server):
    out = _stream()
    sink = _sink(nats_server.url, out)
    with pytest.raises(
        SinkError, match=r"sink 'counts': asked to retract epochs \[1\] before it was opened"
    ):
        sink.retract([1], at_epoch=2)
    sink.open("net", "ckpt1", spark.createDataFrame([], SCHEMA).schema, tentative=True)
    sink.retract([], at_epoch=2)
    _epoch(sink, spark, [], 1, tentative=True)  # an empty tentative epoch: no messages
    assert read_stream(nats_server.url, out) == []


def test_the_wire_client_adds_the_same_headers_to_every_message_of_a_call(nats_server):
    out = _stream()
    with NatsConnection(nats_server.url) as c:
        ensure_stream(c, out, [f"{out}.x"], duplicate_window_ms=60_000)
        marks = b"Eddyline-Tentative: true\r\nX-Odd: 100%s%d\r\n"
        assert c.publish([(f"{out}.x", "a", b"1"), (f"{out}.x", None, b"2")], headers=marks) == [
            False,
            False,
        ]
        assert c.publish([(f"{out}.x", "b", b"3"), (f"{out}.x", None, b"4")]) == [False, False]
        assert c.publish([(f"{out}.x", "a", b"1")], headers=b"Other: header\r\n") == [
            True
        ]  # the id decides
        for bad in (b"No-Line-End: x", b"A: b\r\n\r\nC: d\r\n", b"\r\n"):
            with pytest.raises(ValueError, match="headers: expected lines"):
                c.publish([(f"{out}.x", "c", b"5")], headers=bad)
    assert read_stream(nats_server.url, out) == [
        ({"Nats-Msg-Id": "a", "Eddyline-Tentative": "true", "X-Odd": "100%s%d"}, b"1"),
        ({"Eddyline-Tentative": "true", "X-Odd": "100%s%d"}, b"2"),
        ({"Nats-Msg-Id": "b"}, b"3"),
        ({}, b"4"),
    ]
