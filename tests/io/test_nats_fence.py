"""A ``nats`` sink under a lease: the server, not the writer, refuses the messages of a lease
generation older than the newest that fenced the sink (each message is conditional on the
writer's last fence message), also when the stream's limits keep only its newest messages; two
drivers of one generation (a hot pair) publish side by side. Real ``nats-server``, no Spark."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest

from eddyline.api.sinks import SinkSpec
from eddyline.errors import Fenced
from eddyline.io.jetstream import FENCE_SUBJECTS, NatsSink
from eddyline.io.natswire import NatsConnection

from .natsread import read_stream


def _sink(url: str, stream: str, generation: int) -> NatsSink:
    spec = SinkSpec.model_validate({"name": "counts", "input": "x",
                                    "nats": {"url": url, "stream": stream, "subject": f"{stream}.counts"}})
    sink = NatsSink(spec)
    sink.fence(generation)  # as the engine does, before it opens the sink
    sink.open("net", "ckpt", None)  # type: ignore[arg-type]  (the schema is not used)
    return sink


def _publish(sink: NatsSink, epoch: int, rows: list[int]) -> None:
    sink.collected[epoch] = pa.table({"v": pa.array([json.dumps({"k": k}) for k in rows], pa.string())})
    sink.publish(epoch)


def _rows(url: str, stream: str) -> list[tuple[str, int]]:
    """(message id, k) of the rows on the sink's subject."""
    return [(h["Nats-Msg-Id"], json.loads(p)["k"]) for h, p in read_stream(url, stream)
            if "Nats-Msg-Id" in h and "Eddyline-Retract" not in h]


def _writers(url: str, stream: str) -> list[int]:
    """The lease generation of each row message, in order."""
    return [int(h["Eddyline-Generation"]) for h, _ in read_stream(url, stream)
            if "Nats-Msg-Id" in h and "Eddyline-Retract" not in h]


def test_the_server_refuses_an_older_generation_once_a_newer_one_fenced(nats_server) -> None:
    stream = f"F{uuid.uuid4().hex[:8]}"
    old = _sink(nats_server.url, stream, 1)
    _publish(old, 1, [1, 2])
    old.collected[2] = pa.table({"v": pa.array(['{"k": 3}'], pa.string())})  # staged, then frozen
    new = _sink(nats_server.url, stream, 2)  # the driver that took over
    with pytest.raises(Fenced, match="lease generation 1 was taken over by generation 2: .* refuses its writes"):
        old.publish(2)
    with pytest.raises(Fenced):
        old.retract([1], 3)
    _publish(new, 2, [30])
    assert _rows(nats_server.url, stream) == [("net/ckpt/counts/1/0", 1), ("net/ckpt/counts/1/1", 2),
                                              ("net/ckpt/counts/2/0", 30)]
    assert _writers(nats_server.url, stream) == [1, 1, 2]
    # the fence: one message per fence and epoch, on a subject of its own that the sink added to the stream
    fences = [h for h, _ in read_stream(nats_server.url, stream, fences=True) if "Eddyline-Fence" in h]
    assert [int(h["Eddyline-Fence"]) for h in fences] == [1, 1, 2, 2]
    with NatsConnection(nats_server.url) as conn:
        info = conn.stream_info(stream)
        # a nats source reading the stream (its tasks read ranges so) skips the fence messages
        read = [p for _, payloads in conn.read_range(stream, 1, info["state"]["last_seq"] + 1) for p in payloads]
    subjects = info["config"]["subjects"]
    assert subjects[0] == f"{stream}.counts" and subjects[1].startswith(FENCE_SUBJECTS)
    assert [json.loads(p)["k"] for p in read] == [1, 2, 30] and info["state"]["messages"] == 7
    # a woken driver cannot fence its way back in
    with pytest.raises(Fenced, match="taken over by generation 2"):
        _sink(nats_server.url, stream, 1)


def test_without_a_lease_nothing_is_conditional(nats_server) -> None:
    stream = f"F{uuid.uuid4().hex[:8]}"
    _publish(_sink(nats_server.url, stream, 0), 1, [1])
    assert all("Eddyline-Fence" not in h for h, _ in read_stream(nats_server.url, stream, fences=True))


def test_the_fence_outlives_a_streams_limits_and_a_hot_pair_publishes_under_one_generation(nats_server) -> None:
    stream = f"F{uuid.uuid4().hex[:8]}"
    with NatsConnection(nats_server.url) as conn:  # a stream that keeps only its 12 newest messages
        conn.api(f"STREAM.CREATE.{stream}", {"name": stream, "subjects": [f"{stream}.>"], "max_msgs": 12,
                                              "storage": "memory", "duplicate_window": 120_000_000_000})
    leader, follower = _sink(nats_server.url, stream, 3), _sink(nats_server.url, stream, 3)
    for epoch in range(1, 8):  # far more messages than the stream keeps: the fence stays in it
        _publish(leader if epoch % 2 else follower, epoch, [epoch * 10 + i for i in range(4)])
    zombie = _sink(nats_server.url, stream, 3)
    took_over = _sink(nats_server.url, stream, 4)
    _publish(took_over, 8, [80])
    with pytest.raises(Fenced, match="taken over by generation 4"):
        _publish(leader, 9, [90])
    with pytest.raises(Fenced):
        _publish(zombie, 9, [91])
    assert _rows(nats_server.url, stream)[-1] == ("net/ckpt/counts/8/0", 80)


def test_a_hot_pairs_sink_is_fenced_when_it_opens_not_before(nats_server) -> None:
    """The runtime names a hot pair's drivers (``writer``) and fences every sink before it opens
    them: a stream that does not exist yet is not asked about until the sink opens (and makes it)."""
    stream = f"F{uuid.uuid4().hex[:8]}"
    spec = SinkSpec.model_validate({"name": "counts", "input": "x",
                                    "nats": {"url": nats_server.url, "stream": stream, "subject": f"{stream}.counts"}})
    sink = NatsSink(spec)
    sink.writer = "driver-1234abcd"
    sink.fence(2)  # no stream yet: nothing asked
    sink.open("net", "ckpt", None)  # type: ignore[arg-type]
    _publish(sink, 1, [5])
    assert [int(h["Eddyline-Fence"]) for h, _ in read_stream(nats_server.url, stream, fences=True) if "Eddyline-Fence" in h] == [2, 2]
