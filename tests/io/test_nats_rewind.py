"""The ``nats`` sink taking epochs back for a replay and putting them back for its undo, against
a real ``nats-server -js``: a reader that follows the sink's rules (tests/io/natsread.py) sees,
after each step, what the epochs in force published; an undo puts back only what was in force
before the replay it undoes, also after earlier replays and undos of the same epochs."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from eddyline.api.sinks import SinkSpec
from eddyline.errors import SinkError
from eddyline.io.jetstream import NatsSink
from tests.io.natsread import consume, read_stream

pytestmark = pytest.mark.spark

SCHEMA = "k long, v string"


def _sink(url: str, stream: str, dedup_window: str = "2m") -> NatsSink:
    return NatsSink(SinkSpec.model_validate({"name": "out", "input": "x", "nats": {
        "url": url, "stream": stream, "subject": f"{stream}.out", "dedup_window": dedup_window}}))


def _shown(url: str, stream: str) -> list[Any]:
    rows, stable = consume(read_stream(url, stream))
    assert rows == stable
    return sorted((r["k"], r["v"]) for r in rows)


def _epochs(spark: Any, sink: NatsSink):
    def epoch(n: int, rows: list[tuple[int, str]], retracts: tuple[int, ...] = (), restores: tuple[int, ...] = ()) -> None:
        """Epoch ``n`` as the publish stage runs it."""
        sink.stage(spark.createDataFrame(rows, SCHEMA), n)
        sink.retract(list(retracts), n)
        for r in restores:
            sink.restore(r)
        sink.publish(n)

    return epoch


def test_replays_and_undos_of_overlapping_epochs_show_what_is_in_force(spark, nats_server) -> None:
    """With a de-duplication window short enough that a second correction of an epoch is kept
    too: an undo puts back only the epochs that were in force when the replay took them back."""
    stream = f"W{uuid.uuid4().hex[:10]}"
    sink = _sink(nats_server.url, stream, dedup_window="1s")
    sink.open("net", "ck", spark.createDataFrame([], SCHEMA).schema)
    epoch = _epochs(spark, sink)

    for n in range(1, 5):  # epochs 1-4: one row each
        epoch(n, [(n, "a")])
    original = [(n, "a") for n in range(1, 5)]
    assert _shown(nats_server.url, stream) == original
    epoch(5, [(3, "b"), (4, "b")], retracts=(3, 4))  # a replay from 2
    assert _shown(nats_server.url, stream) == [(1, "a"), (2, "a"), (3, "b"), (4, "b")]
    epoch(6, [], retracts=(5,), restores=(5,))  # its undo: 3 and 4 come back, as rows of epoch 6
    assert _shown(nats_server.url, stream) == original
    time.sleep(1.5)  # past the window: the corrections of 3, 4 and 5 are kept again
    epoch(7, [(2, "c")], retracts=(2, 3, 4, 5, 6))  # a replay from 1 (3, 4, 5 were gone already)
    assert _shown(nats_server.url, stream) == [(1, "a"), (2, "c")]
    epoch(8, [], retracts=(7,), restores=(7,))  # its undo: epochs 2 and 6 come back, not 3, 4, 5
    assert _shown(nats_server.url, stream) == original
    messages = read_stream(nats_server.url, stream)
    assert sum(h.get("Eddyline-Retract") == "4" for h, _ in messages) == 2  # (so the second counted)
    ids = [h["Nats-Msg-Id"] for h, _ in messages if "Nats-Msg-Id" in h]
    assert sorted(i for i in ids if i.startswith("net/ck/out/8/")) == [
        "net/ck/out/8/2.0", "net/ck/out/8/6.3.0", "net/ck/out/8/6.4.0"]


def test_an_undoing_epoch_run_again_publishes_nothing_more(spark, nats_server) -> None:
    stream = f"W{uuid.uuid4().hex[:10]}"
    sink = _sink(nats_server.url, stream)
    sink.open("net", "ck", spark.createDataFrame([], SCHEMA).schema)
    epoch = _epochs(spark, sink)
    epoch(1, [(1, "a")])
    epoch(2, [(2, "a")])
    epoch(3, [(2, "b")], retracts=(2,))
    epoch(4, [], retracts=(3,), restores=(3,))
    assert _shown(nats_server.url, stream) == [(1, "a"), (2, "a")]
    count = len(read_stream(nats_server.url, stream))
    again = _sink(nats_server.url, stream)  # a new driver runs epoch 4 again
    again.open("net", "ck", spark.createDataFrame([], SCHEMA).schema)
    _epochs(spark, again)(4, [], retracts=(3,), restores=(3,))
    assert len(read_stream(nats_server.url, stream)) == count


def test_putting_back_before_open_is_refused(nats_server) -> None:
    with pytest.raises(SinkError, match=r"sink 'out': asked to put back epoch 3's take-back before it was opened"):
        _sink(nats_server.url, "NOPE").restore(3)
