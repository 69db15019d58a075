"""A hot pair in one process, one driver after the other: the follower runs the leader's logged
plans with its own state and checkpoint, finds every output published already, checks its
digests against the selector's records, publishes nothing twice, and takes the lease over once
the leader is gone. A step that is not deterministic makes the two disagree: the follower stops,
naming the epoch and the sink."""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest

from eddyline.api.validate import load_spec
from eddyline.errors import SpecError
from eddyline.ha.selector import Diverged
from eddyline.runtime import replica
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.faults import FaultPoint
from eddyline.runtime.replica import HotPair

from .drivers import LEASE, commits, finish, start, wait_for
from .helpers import Crash, CrashAt, bids_window_spec, duckdb_windows, read_windows, write_bid_files

pytestmark = pytest.mark.slow


class Records:
    console = None

    def __init__(self) -> None:
        self.records: list[dict] = []

    def report(self, record: dict) -> None:
        self.records.append(record)


def with_memory_sink(spec):  # noqa: ANN001, ANN201
    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["sinks"].append({"name": "mem", "input": "per_auction", "memory": {}})
    return load_spec(raw)


# The drivers of a pair may run in different modes: a digest is Spark's hash of the rows whichever
# computes it (a job's observation, or the resident lanes), so each one checks the other's. (Both
# on jobs: the other tests of this file.)
@pytest.mark.parametrize(("leading", "following"), [("resident", "job"), ("job", "resident")])
def test_the_follower_runs_the_leaders_plans_checks_every_output_and_then_leads(
    spark, tmp_path: Path, monkeypatch, leading: str, following: str
) -> None:
    monkeypatch.setattr(replica, "COPY_BEYOND", 100)  # (here it runs every plan rather than copy the leader's state)
    write_bid_files(tmp_path / "in", files=4, rows=100, seed=11)
    spec = with_memory_sink(bids_window_spec(tmp_path / "in", tmp_path / "out", execution=leading))
    group = tmp_path / "group"

    a = HotPair(str(group), str(tmp_path / "a"), timeout_s=1.0)
    assert a.lease.try_acquire()
    leader = Engine(spec, spark, str(tmp_path / "a"), lease=a.lease, pair=a, reporter=Records())
    led = leader.run(until_idle=True)
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")
    published = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("epoch=*")}
    assert a.selector.lost == 0  # nobody else published

    b = HotPair(str(group), str(tmp_path / "b"), timeout_s=1.0)
    seen = Records()
    follower = Engine(spec.model_copy(update={"execution": following}), spark, str(tmp_path / "b"), pair=b, reporter=seen)
    followed = follower.run(until_idle=True)
    assert (leader.executor.mode, follower.executor.mode) == (leading, following)

    # it ran every epoch the leader ran, from the leader's plans, with its own state ...
    assert followed.last_epoch == led.last_epoch and followed.output_rows == led.output_rows
    assert [r["batchId"] for r in seen.records] == list(range(1, led.last_epoch + 1))
    assert {r["driver"]["role"] for r in seen.records} == {"follower"}
    assert (tmp_path / "b" / "commits").is_dir() and len(list((tmp_path / "b" / "commits").iterdir())) == led.last_epoch
    # ... found each sink's epoch published by the leader, with the same digest, and published nothing
    assert b.selector.lost == led.last_epoch * 2
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("epoch=*")} == published
    assert not any((tmp_path / "out" / "_staging").rglob("*.parquet"))  # its staged copies were dropped
    assert follower.sinks["mem"].collected == {}
    # the leader's rows, all of them in its memory sink
    rows = pa.concat_tables(leader.sinks["mem"].collected.values())
    assert rows.num_rows == sum(1 for _ in duckdb_windows(tmp_path / "in"))
    # the leader released its lease at the end; the follower took it over and found nothing more
    assert b.lease.generation == 2 and a.lease.current().holder == b.lease.holder


def test_a_follower_too_far_behind_goes_on_from_a_copy_of_the_leaders_state_and_a_former_leader_drops_its_own_plans(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """The follower ran epochs 1–2; then the leader, which keeps 2 epochs of plans, ran on to 6
    (and logged its plan of epoch 7, then died). The follower cannot replay epoch 3, so it
    copies the leader's commit 6 and the state files it reads and goes on from there: the
    windows open across epoch 6 come out right. Then the former leader starts again as a
    follower of the new one: a plan of epoch 7 it logged itself is dropped, it runs the new
    leader's plans and its outputs match what was published."""
    write_bid_files(tmp_path / "in", files=9, rows=100, seed=5)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    group, ck_a, ck_b = tmp_path / "group", tmp_path / "a", tmp_path / "b"
    a, b = HotPair(str(group), str(ck_a), timeout_s=60), HotPair(str(group), str(ck_b), timeout_s=60)
    assert a.lease.try_acquire()
    Engine(spec, spark, str(ck_a), lease=a.lease, pair=a, retain_epochs=2).run(epochs=2)
    assert a.lease.try_acquire()  # (run() let go of it) the leader, between two epochs
    Engine(spec, spark, str(ck_b), pair=b).run(epochs=2)
    with pytest.raises(Crash):
        Engine(spec, spark, str(ck_a), lease=a.lease, pair=a, retain_epochs=2,
               faults=CrashAt(7, FaultPoint.AFTER_PLAN)).run(until_idle=True)
    old_a, new_b = Checkpoint(str(ck_a)), Checkpoint(str(ck_b))
    assert old_a.latest_commit().epoch == 6 and old_a.has_plan(7) and not old_a.has_plan(3)
    assert new_b.latest_commit().epoch == 2
    dead = HotPair(str(group), str(ck_a), timeout_s=0.2)  # its last lease, expired when b looks
    assert dead.lease.try_acquire()
    time.sleep(0.3)

    seen = Records()
    Engine(spec, spark, str(ck_b), pair=b, reporter=seen).run(until_idle=True)
    assert b.adopted == {"checkpoint": str(ck_a), "epoch": 6}
    assert new_b.read_commit(6) == old_a.read_commit(6)
    assert new_b.read_plan(7).base == 6  # the engine went on from the copied commit, not from its 2
    # the plan of epoch 7 the leader logged before it died is run first (as a follower), then it leads
    assert [(r["batchId"], r["driver"]["role"]) for r in seen.records][:2] == [(7, "follower"), (8, "leader")]
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")

    # a logged its own plan of epoch 7 as b took over (a race the lease check cannot close)
    old_a.write_plan(dataclasses.replace(new_b.read_plan(8), epoch=7))
    assert old_a.read_plan(7).sources != new_b.read_plan(7).sources
    assert HotPair(str(group), str(ck_b), timeout_s=1.0).lease.try_acquire()  # b leads when a comes back
    monkeypatch.setattr(replica, "COPY_BEYOND", 100)  # (a is 4 epochs behind b: here it runs b's plans)
    a2 = HotPair(str(group), str(ck_a), timeout_s=1.0)
    back = Records()
    followed = Engine(spec, spark, str(ck_a), pair=a2, reporter=back).run(until_idle=True)
    assert a2.adopted is None  # b still keeps the plan after a's last commit
    assert [r["batchId"] for r in back.records] == list(range(7, new_b.latest_commit().epoch + 1))
    assert back.records[0]["driver"]["role"] == "follower"
    assert old_a.read_plan(7).sources == new_b.read_plan(7).sources
    assert a2.selector.lost == followed.epochs  # every epoch published by b already, same digest
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")


def test_a_step_that_is_not_deterministic_makes_the_follower_stop_naming_epoch_and_sink(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=2, rows=100, seed=3)
    raw = bids_window_spec(tmp_path / "in", tmp_path / "out").model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["steps"][0]["filter"] = "price >= 100 AND rand() < 0.5"  # a different half in each driver
    spec = load_spec(raw)
    group = tmp_path / "group"
    a = HotPair(str(group), str(tmp_path / "a"), timeout_s=1.0)
    assert a.lease.try_acquire()
    Engine(spec, spark, str(tmp_path / "a"), lease=a.lease, pair=a).run(until_idle=True)
    b = HotPair(str(group), str(tmp_path / "b"), timeout_s=1.0)
    with pytest.raises(Diverged, match=r"epoch \d+, output 'out': this driver .* staged \d+ rows .* published \d+ rows"):
        Engine(spec, spark, str(tmp_path / "b"), pair=b).run(until_idle=True)


def test_what_a_pair_cannot_replicate_is_refused_and_a_group_runs_one_network(spark, tmp_path: Path) -> None:
    raw = bids_window_spec(tmp_path / "in", tmp_path / "out").model_dump(mode="json", by_alias=True, exclude_none=True)
    pair = HotPair(str(tmp_path / "group"), str(tmp_path / "a"))
    with pytest.raises(SpecError, match="max_delay: Delay-Process-Correct is not supported in a hot pair"):
        Engine(load_spec({**raw, "max_delay": "5s"}), spark, str(tmp_path / "a"), pair=pair)
    pair.join(load_spec(raw).fingerprint())
    other = load_spec({**raw, "name": "another"})
    with pytest.raises(Exception, match="runs another network"):
        HotPair(str(tmp_path / "group"), str(tmp_path / "b")).join(other.fingerprint())


# 48 epochs half a second apart: the leader still runs when a follower that took long to start its
# JVM has caught up (with 16 it could finish first, and the follower join a finished run)
@pytest.mark.parametrize("windowed_bids", [48], indirect=True)
def test_when_the_leader_is_killed_the_warm_follower_leads_on_without_a_gap(windowed_bids, tmp_path: Path) -> None:
    """Two ``eddyline run --hot`` processes; the leader gets SIGKILL once the follower has caught
    up with it. The follower takes the lease over and goes on from its own state:
    the output is the uninterrupted run's, each window once, and the sink's output stops for
    little longer than the lease's timeout."""
    spec, expected = windowed_bids
    group, a, b = tmp_path / "group", tmp_path / "a", tmp_path / "b"
    leader = start(spec, a, "--hot", str(group))
    wait_for(lambda: "leading as" in leader.errfile.read_text())
    follower = start(spec, b, "--hot", str(group), "--progress-json", str(tmp_path / "b.jsonl"))
    wait_for(lambda: "following" in follower.errfile.read_text())
    # it catches up from the leader's retained plans, then keeps up (the leader waits for it)
    wait_for(lambda: len(commits(b)) >= 3 and len(commits(b)) >= len(commits(a)) - 1)
    assert leader.poll() is None, "the leader ended before the follower caught up"
    led = len(commits(a))
    wait_for(lambda: len(commits(a)) > led)  # the leader runs on, no longer held
    leader.send_signal(signal.SIGKILL)
    killed = time.time()
    assert leader.wait(timeout=60) == -signal.SIGKILL
    code, err = finish(follower)
    assert code == 0, err[-3000:]
    assert read_windows(tmp_path / "out") == expected  # nothing lost, nothing twice

    # it took over at once, without waiting for the dead leader's lease to expire: its process was gone
    lease = {int(p.name[:-5]): json.loads(p.read_text()) for p in (group / "lease").glob("*.json")}
    expired_at = json.loads((group / "lease" / f"{1:010d}.beat").read_text())["expires_at"]
    assert lease[2]["acquired_at"] < expired_at, (lease[2]["acquired_at"] - killed, expired_at - killed)
    progress = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    roles = [r["driver"]["role"] for r in progress]
    assert roles[0] == "follower" and roles[-1] == "leader" and roles == sorted(roles, key=["follower", "leader"].index)
    # when each epoch's output was written (its directory's last change, just before its publish)
    times = sorted(p.stat().st_mtime for p in (tmp_path / "out").glob("epoch=*"))
    before = [t for t in times if t < killed]
    after = [t for t in times if t >= killed]
    assert len(before) >= 3 and after
    period = sorted(b - a for a, b in zip(before, before[1:], strict=False))[len(before) // 2 - 1]
    gap = after[0] - before[-1]
    print(f"hot pair: output gap {gap:.2f} s around the kill (first output {after[0] - killed:.2f} s after it); "
          f"epochs {period:.2f} s apart before it (lease {LEASE} s)")
    assert gap < 2 * period + float(LEASE) + 1.0, (gap, period)


def test_a_follower_joining_late_copies_the_leaders_state_and_never_holds_it(tmp_path: Path) -> None:
    """A follower started next to a leader well past epoch 10 (the leader keeps its plans from
    epoch 1): it copies the leader's latest commit instead of running those plans, the leader
    does not wait for it meanwhile (its output never stops for longer than two steady epochs),
    then it follows, and the output is exact."""
    write_bid_files(tmp_path / "in", files=70, rows=100, seed=21)
    raw = bids_window_spec(tmp_path / "in", tmp_path / "out").model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = tmp_path / "net.yaml"
    spec.write_text(json.dumps(raw | {"trigger": 500, "history": 40}))
    group, a, b = tmp_path / "group", tmp_path / "a", tmp_path / "b"
    leader = start(spec, a, "--hot", str(group))
    wait_for(lambda: len(commits(a)) >= 12, 180)
    assert (a / "plans" / f"{1:010d}.json").exists()  # every plan since epoch 1 is there to run
    joined = time.time()
    follower = start(spec, b, "--hot", str(group), "--progress-json", str(tmp_path / "b.jsonl"))
    code, err = finish(follower)
    assert code == 0, err[-3000:]
    code, err = finish(leader)
    assert code == 0, err[-3000:]
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")

    progress = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    first = progress[0]
    assert first["driver"]["role"] == "follower" and first["driver"]["copied_state"]["epoch"] > 12
    assert first["batchId"] == first["driver"]["copied_state"]["epoch"] + 1  # none of the plans before it ran
    states = [r["driver"].get("state") for r in progress if r["driver"]["role"] == "follower"]
    assert states[0] == "copying" and states[-1] == "following"  # following once it ran an epoch of its own
    # the sink's epochs (their directories' last change, at publish): no pause while it joined
    times = sorted(p.stat().st_ctime for p in (tmp_path / "out").glob("epoch=*"))
    gaps = [y - x for x, y in zip(times, times[1:], strict=False)]
    steady = sorted(gaps)[len(gaps) // 2]
    during = [y - x for x, y in zip(times, times[1:], strict=False) if y > joined]
    print(f"follower joined: longest pause of the output {max(during):.2f} s, steady epochs {steady:.2f} s apart")
    assert max(during) <= 2 * steady + 0.25, (max(during), steady)
