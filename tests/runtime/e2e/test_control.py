"""Control lines on local Spark (eddyline.api.live, eddyline.runtime.inbox): a command queued for
a running network takes effect at exactly the next epoch, which logs it, so that a driver that
crashes around that epoch replays it with the same parameters; a command that does not fit is
refused, reported and changes nothing."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from eddyline.api.validate import load_spec
from eddyline.cli import app
from eddyline.errors import EngineError
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.faults import FaultPoint
from eddyline.runtime.inbox import Inbox

from .helpers import BIDS_DDL, Crash, CrashAt, write_bid_files
from .switched import expected, per_epoch

FILES = 5


def spec(src: Path, out: Path) -> dict:
    return {
        "name": "controlled", "trigger": 0, "lanes": 2, "key_groups": 8,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "json", "schema": BIDS_DDL, "max_files_per_epoch": 1}}],
        "steps": [
            {"name": "expensive", "input": "bids", "filter": "price >= 100"},
            {"name": "bucketed", "input": "expensive", "select": [
                "auction", "price", "timestamp_seconds(CAST(floor(unix_seconds(ts) / 20) * 20 + 20 AS BIGINT)) AS bucket_end"]},
            {"name": "top", "input": "bucketed", "top_k": {
                "partition_by": "bucket_end", "order_by": ["price DESC"], "k": 1, "time": "bucket_end", "with_ties": True}},
        ],
        "sinks": [
            {"name": "rows", "input": "expensive", "files": {"path": str(out / "rows"), "format": "parquet"}},
            {"name": "best", "input": "top", "files": {"path": str(out / "best"), "format": "parquet"}},
        ],
    }






def test_on_an_object_store_the_driver_hears_a_command_by_its_bell(s3, spark, tmp_path: Path) -> None:
    """The checkpoint on the store, where the driver lists the inbox only when a command's bell
    rang: a command queued while the network runs takes effect at the next epoch all the same."""
    write_bid_files(tmp_path / "in", files=FILES, rows=60)
    ckpt = f"{s3.bucket(f'ctl-{uuid.uuid4().hex[:8]}')}/net"
    engine = Engine(load_spec(spec(tmp_path / "in", tmp_path / "out")), spark, ckpt)
    engine.run(epochs=3)  # (its inbox listed once, and heard no bell since)
    command = Inbox(ckpt).submit({"expensive.filter": "price >= 500", "top.k": 2})
    engine.run(until_idle=True)
    assert per_epoch(tmp_path / "out") == expected(tmp_path / "in", switch_at=4)
    assert [(d["id"], d["outcome"], d["epoch"]) for d in Inbox(ckpt).done()] == [(command, "applied", 4)]


@pytest.mark.parametrize("crash", [FaultPoint.PLANNED])
def test_a_changed_filter_takes_effect_at_the_next_epoch_also_across_a_crash(spark, tmp_path: Path, crash) -> None:
    write_bid_files(tmp_path / "in", files=FILES, rows=60)
    net = load_spec(spec(tmp_path / "in", tmp_path / "out"))
    ckpt = str(tmp_path / "ckpt")
    Engine(net, spark, ckpt).run(epochs=3)
    command = Inbox(ckpt).submit({"expensive.filter": "price >= 500", "top.k": 2})
    with pytest.raises(Crash):  # before the plan that applies it is logged, or after it published
        Engine(net, spark, ckpt, faults=CrashAt(4, crash)).run(until_idle=True)
    Engine(net, spark, ckpt).run(until_idle=True)

    assert per_epoch(tmp_path / "out") == expected(tmp_path / "in", switch_at=4)
    plans = {e: Checkpoint(ckpt).read_plan(e) for e in (3, 4, 5)}  # 6: the end-of-stream epoch
    assert plans[3].settings == {} and plans[4].settings == plans[5].settings == {"expensive.filter": "price >= 500", "top.k": 2}
    assert [a["id"] for a in plans[4].applied] == [command] and plans[5].applied == []
    done = Inbox(ckpt).done()
    assert [(d["id"], d["outcome"], d["epoch"]) for d in done] == [(command, "applied", 4)]
    assert Inbox(ckpt).pending() == []
    # top.k = 2 from epoch 4: the 20 s buckets that complete from then on show their two best bids
    best = duckdb.connect().execute(
        f"SELECT max(rank) FROM read_parquet('{tmp_path}/out/best/epoch=*/*.parquet', filename=true) "
        "WHERE CAST(regexp_extract(filename, 'epoch=(\\d+)', 1) AS INT) >= 5"
    ).fetchone()
    assert best == (2,)


def test_a_command_that_does_not_fit_is_refused_reported_and_changes_nothing(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=3, rows=40)
    net = load_spec(spec(tmp_path / "in", tmp_path / "out"))
    ckpt = str(tmp_path / "ckpt")
    Engine(net, spark, ckpt).run(epochs=1)
    inbox = Inbox(ckpt)
    bad = [
        inbox.submit({"expensive.filter": "price >>= 5"}),
        inbox.submit({"top.k": 0}),
        inbox.submit({"top.order_by": ["price ASC"]}),
        inbox.submit({"nowhere.filter": "true"}),
    ]
    (tmp_path / "ckpt" / "control" / "inbox" / "99999999999999999999-garbage.json").write_text("{not json")
    progress = tmp_path / "progress.jsonl"
    from eddyline.observe.progress import ProgressReporter

    with ProgressReporter(live=False, json_path=str(progress)) as rep:
        Engine(net, spark, ckpt, reporter=rep).run(until_idle=True)
    assert per_epoch(tmp_path / "out") == expected(tmp_path / "in", switch_at=99)
    records = [json.loads(x) for x in progress.read_text().splitlines()]
    refused = records[0]["refused"]
    assert [r["id"] for r in refused] == [*bad, "99999999999999999999-garbage"]
    reasons = [r["reason"] for r in refused]
    assert "invalid SQL expression" in reasons[0] and "expensive.filter" in reasons[0]
    assert reasons[1] == "control top.k=0: step 'top': k: Input should be greater than 0, got 0"
    assert reasons[2] == ("control top.order_by: 'order_by' of a top_k step cannot change while it runs "
                          "(can: one of k, watermark_delay)")
    assert reasons[3].startswith("control nowhere.filter: no step or sink 'nowhere'")
    assert "not a JSON command" in reasons[4]
    assert all("refused" not in r for r in records[1:])
    assert {d["outcome"] for d in Inbox(ckpt).done()} == {"refused"}
    assert all(p.settings == {} for p in map(Checkpoint(ckpt).read_plan, (2, 3)))


def test_the_cli_refuses_a_bad_value_before_queueing_and_shows_status(tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=1, rows=5)
    path = tmp_path / "net.yaml"
    path.write_text(json.dumps(spec(tmp_path / "in", tmp_path / "out")))
    ckpt = str(tmp_path / "ckpt")
    runner = CliRunner()
    refused = runner.invoke(app, ["control", "set", str(path), "top.k=zero", "--checkpoint", ckpt])
    assert refused.exit_code == 2 and "top.k" in refused.output
    assert Inbox(ckpt).pending() == []
    ok = runner.invoke(app, ["control", "set", str(path), "expensive.filter=price > 7", "--checkpoint", ckpt])
    assert ok.exit_code == 0, ok.output
    assert "expensive.filter = 'price > 7'" in ok.output and "next epoch" in ok.output
    assert [c["set"] for c in Inbox(ckpt).pending()] == [{"expensive.filter": "price > 7"}]
    status = runner.invoke(app, ["control", "status", "--checkpoint", ckpt])
    assert status.exit_code == 0 and "waiting for the next epoch" in status.output


def test_status_shows_the_drivers_mode_and_why_it_came_to_it(spark, tmp_path: Path) -> None:
    """Each progress record carries the driver's mode and its last transition; ``eddyline status``
    shows it: leading after a clean start, replaying for a plan logged before a crash."""
    write_bid_files(tmp_path / "in", files=3, rows=10)
    net = load_spec(spec(tmp_path / "in", tmp_path / "out"))
    ckpt = str(tmp_path / "ckpt")
    Engine(net, spark, ckpt).run(epochs=1)
    (record,) = Checkpoint(ckpt).progress()
    assert record["mode"] | {"since": 0} == {
        "mode": "leading", "from": "starting", "reason": "took the checkpoint up after epoch 0", "since": 0}
    with pytest.raises(Crash):
        Engine(net, spark, ckpt, faults=CrashAt(2, FaultPoint.AFTER_PLAN)).run(epochs=1)
    Engine(net, spark, ckpt).run(epochs=1)
    assert Checkpoint(ckpt).progress()[-1]["mode"]["mode"] == "replaying"
    shown = CliRunner().invoke(app, ["status", ckpt])
    assert shown.exit_code == 0, shown.output
    assert "mode at the last epoch: replaying (since " in shown.output
    assert "from leading: epoch 2 runs the plan logged before this run)" in shown.output


def test_a_control_stream_changes_the_filter_at_the_next_epoch_once(spark, tmp_path: Path) -> None:
    """Control tuples in files (a meta query's output): ours apply at the next epoch, another
    query's are skipped, a malformed one is refused; a crash after the plan that applies them
    replays it, and no file is read twice."""
    write_bid_files(tmp_path / "in", files=5, rows=40)
    raw = spec(tmp_path / "in", tmp_path / "out")
    raw["control"] = {"commands": str(tmp_path / "commands")}
    net = load_spec(raw)
    ckpt = str(tmp_path / "ckpt")
    Engine(net, spark, ckpt).run(epochs=2)
    (tmp_path / "commands").mkdir()
    tuples = [
        {"query": "controlled", "step": "expensive", "parameter": "filter", "value": "price >= 500"},
        {"query": "another", "step": "expensive", "parameter": "filter", "value": "false"},
        {"query": "controlled", "step": "expensive"},
    ]
    (tmp_path / "commands" / "0001.json").write_text("".join(json.dumps(t) + "\n" for t in tuples))
    with pytest.raises(Crash):
        Engine(net, spark, ckpt, faults=CrashAt(3, FaultPoint.AFTER_PLAN)).run(until_idle=True)
    Engine(net, spark, ckpt).run(until_idle=True)
    assert per_epoch(tmp_path / "out") == expected(tmp_path / "in", switch_at=3)
    ck = Checkpoint(ckpt)
    assert [a["id"] for a in ck.read_plan(3).applied] == ["stream-0001.json:1"]
    assert ck.read_plan(3).commands_cursor == ck.latest_commit().commands_cursor == "0001.json"
    outcomes = {d["id"]: (d["outcome"], d.get("reason")) for d in Inbox(ckpt).done()}
    assert outcomes == {
        "stream-0001.json:1": ("applied", None),
        "stream-0001.json:3": ("refused", "control: a control tuple needs query, step, parameter, value; missing parameter, value"),
    }


def test_a_control_stream_on_nats_changes_the_filter_at_the_next_epoch(spark, nats_server, tmp_path: Path) -> None:
    """The same tuples as messages of a JetStream stream; the cursor is the last sequence read."""
    from eddyline.io.natswire import NatsConnection, ensure_stream

    write_bid_files(tmp_path / "in", files=4, rows=30)
    raw = spec(tmp_path / "in", tmp_path / "out")
    raw["control"] = {"commands": f"{nats_server.url}/CONTROL_E2E?subject=control.q"}
    net = load_spec(raw)
    ckpt = str(tmp_path / "ckpt")
    Engine(net, spark, ckpt).run(epochs=2)
    tuples = [
        ("control.q", {"query": "controlled", "step": "expensive", "parameter": "filter", "value": "price >= 500"}),
        ("control.other", {"query": "controlled", "step": "expensive", "parameter": "filter", "value": "false"}),
        ("control.q", {"query": "controlled", "step": "top", "parameter": "k", "value": -1}),
    ]
    with NatsConnection(nats_server.url) as conn:
        ensure_stream(conn, "CONTROL_E2E", ["control.>"])
        conn.publish([(subject, None, json.dumps(t).encode()) for subject, t in tuples])
    Engine(net, spark, ckpt).run(until_idle=True)
    assert per_epoch(tmp_path / "out") == expected(tmp_path / "in", switch_at=3)
    ck = Checkpoint(ckpt)
    assert [a["id"] for a in ck.read_plan(3).applied] == ["stream-CONTROL_E2E:1"]
    assert ck.latest_commit().commands_cursor == "3"
    refused = [d for d in Inbox(ckpt).done() if d["outcome"] == "refused"]
    assert [d["id"] for d in refused] == ["stream-CONTROL_E2E:3"] and "top.k" in refused[0]["reason"]


def test_a_sinks_target_changes_at_the_next_epoch_also_across_a_crash_and_a_replay_may_not_span_it(
        spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=FILES, rows=60)
    net = load_spec(spec(tmp_path / "in", tmp_path / "out"))
    ckpt = str(tmp_path / "ckpt")
    Engine(net, spark, ckpt).run(epochs=3)
    command = Inbox(ckpt).submit({"rows.path": str(tmp_path / "v2" / "rows")})
    with pytest.raises(Crash):  # after the plan that moves the sink was logged
        Engine(net, spark, ckpt, faults=CrashAt(4, FaultPoint.PLANNED)).run(until_idle=True)
    Engine(net, spark, ckpt).run(until_idle=True)

    want = expected(tmp_path / "in", switch_at=FILES + 1)  # the filter never changed
    before, after = per_epoch(tmp_path / "out"), per_epoch(tmp_path / "v2")
    assert before == {e: want[e] for e in (1, 2, 3)}
    assert after == {e: want[e] for e in range(4, FILES + 1)}
    assert [(d["id"], d["outcome"], d["epoch"]) for d in Inbox(ckpt).done()] == [(command, "applied", 4)]
    # epochs 2-5 went to two places: a replay from 2 cannot take them back; from 4 it could
    with pytest.raises(EngineError, match=r"replay: a sink's target changed .* between epoch 2 and 6"):
        Engine(net, spark, ckpt)._check_alone({"replay": 2}, 6)
    Engine(net, spark, ckpt)._check_alone({"replay": 4}, 6)
