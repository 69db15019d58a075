"""Time travel into a NATS stream on local Spark: test_replay's network (a filter on the auction,
a select) publishing into JetStream. Its predicate is changed and the epochs from 3 on are run
again with it: the replaying epoch publishes one correction per epoch it takes back, then the new
rows, so a reader that follows the sink's rules ends with what a run that changed the predicate
at epoch 3 shows; undoing the replay brings back what it showed before."""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from eddyline.api.sinks import SinkSpec
from eddyline.api.validate import load_spec
from eddyline.io.jetstream import NatsSink
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.inbox import Inbox
from tests.io.natsread import consume, read_stream

from .helpers import write_bid_files
from .replay_net import q2


def network(src: Path, url: str, stream: str, predicate: str) -> dict[str, Any]:
    net = q2(src, src.parent / "unused", predicate)
    net["sinks"] = [{"name": "rows", "input": "q2", "nats": {"url": url, "stream": stream, "subject": f"{stream}.rows"}}]
    return net


def shown(url: str, stream: str) -> Counter:
    rows, stable = consume(read_stream(url, stream))
    assert rows == stable  # nothing tentative here
    return Counter((r["auction"], r["price"]) for r in rows)


def test_replay_into_nats_with_a_changed_predicate_then_undo(spark, nats_server, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=5, rows=20)
    stream, ref_stream = f"R{uuid.uuid4().hex[:8]}", f"F{uuid.uuid4().hex[:8]}"
    old = network(tmp_path / "in", nats_server.url, stream, "auction % 3 = 0")
    new = copy.deepcopy(old)
    new["steps"][0]["filter"] = "auction % 2 = 0"
    ckpt = str(tmp_path / "ckpt")
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    before = shown(nats_server.url, stream)
    assert before

    # the reference: the same network with the predicate changed at epoch 3, from the start
    ref = network(tmp_path / "in", nats_server.url, ref_stream, "auction % 3 = 0")
    Engine(load_spec(ref), spark, str(tmp_path / "ref-ckpt")).run(epochs=2)
    Inbox(str(tmp_path / "ref-ckpt")).submit_network({**new, "sinks": ref["sinks"]}, [])
    Engine(load_spec(ref), spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)
    want = shown(nats_server.url, ref_stream)
    assert want != before

    ck = Checkpoint(ckpt)
    at = ck.latest_commit().epoch + 1
    Inbox(ckpt).submit_command({"replay": 3, "network": new, "reset": []})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert ck.read_plan(at).retracts == list(range(3, at))
    assert shown(nats_server.url, stream) == want
    corrections = [h["Eddyline-Retract"] for h, _ in read_stream(nats_server.url, stream) if "Eddyline-Retract" in h]
    assert corrections == [str(e) for e in range(3, at)]

    # undoing the replay: corrections take its epochs back, and what it took back is read from
    # the stream and published again, as rows of the undoing epoch
    undo = ck.latest_commit().epoch + 1
    Inbox(ckpt).submit_command({"undo": at})
    Engine(load_spec(old), spark, ckpt).run(until_idle=True)
    assert [d["outcome"] for d in Inbox(ckpt).done()] == ["applied", "applied"]
    assert (ck.read_plan(undo).retracts, ck.read_plan(undo).restores) == (list(range(at, undo)), [at])
    assert shown(nats_server.url, stream) == before
    ids = [h["Nats-Msg-Id"] for h, _ in read_stream(nats_server.url, stream)]
    again = [i for i in ids if i.split("/")[3] == str(undo)]
    assert again and all(int(i.split("/")[4].split(".")[0]) in range(3, at) for i in again)

    # the undoing epoch run again (a driver that died before its commit): nothing more
    published = read_stream(nats_server.url, stream)
    sink = NatsSink(SinkSpec.model_validate(old["sinks"][0]))
    sink.open("q2", str(ck.metadata()["id"]), None)
    sink.retract(list(range(at, undo)), undo)
    sink.restore(at)
    sink.publish(undo)
    assert read_stream(nats_server.url, stream) == published
