"""The lease: one holder at a time, taken over only once it expired, and a former holder fenced."""

from __future__ import annotations

import threading
import time

import pytest

from eddyline.errors import CheckpointError
from eddyline.ha.lease import Fenced, Lease


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_live_lease_is_not_taken_an_expired_one_is_and_its_former_holder_is_fenced(tmp_path):
    clock = Clock()
    leader = Lease(str(tmp_path), timeout_s=5, holder="a", clock=clock)
    standby = Lease(str(tmp_path), timeout_s=5, holder="b", clock=clock)
    assert leader.try_acquire() and leader.generation == 1
    clock.now += 3.5
    assert not standby.try_acquire()
    leader.renew()  # expiry now 1008.5
    clock.now += 3.5
    assert not standby.try_acquire()
    leader.check()
    clock.now += 2  # 1009: expired
    assert standby.try_acquire() and standby.generation == 2
    assert standby.current().holder == "b"
    with pytest.raises(Fenced, match=r"generation 1\) was taken over by b \(generation 2\)"):
        leader.check()
    with pytest.raises(Fenced):
        leader.renew()  # and it does not push the new holder's expiry
    assert standby.current().expires_at == pytest.approx(1014)


def test_of_standbys_racing_for_an_expired_lease_exactly_one_wins(tmp_path):
    clock = Clock()
    Lease(str(tmp_path), timeout_s=1, holder="old", clock=clock).try_acquire()
    clock.now += 2
    racers = [Lease(str(tmp_path), timeout_s=1, holder=f"s{i}", clock=clock) for i in range(8)]
    start = threading.Barrier(len(racers))
    won: list[str] = []

    def race(lease: Lease) -> None:
        start.wait()
        if lease.try_acquire():
            won.append(lease.holder)

    threads = [threading.Thread(target=race, args=(r,)) for r in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and racers[0].current().holder == won[0]
    assert {r.generation for r in racers} == {None, 2}


def test_the_heartbeat_keeps_the_lease_a_dead_holder_loses_it_and_a_release_frees_it_at_once(tmp_path):
    leader = Lease(str(tmp_path), timeout_s=0.3, holder="a")
    assert leader.try_acquire()
    leader.start_heartbeat()
    standby = Lease(str(tmp_path), timeout_s=0.3, holder="b")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert not standby.try_acquire()
        time.sleep(0.05)
    leader._stop.set()  # the holder dies: no more beats, no release
    t0 = time.monotonic()
    assert standby.acquire(poll_s=0.02)
    assert 0.1 < time.monotonic() - t0 < 1.0 and standby.generation == 2
    standby.release()
    third = Lease(str(tmp_path), timeout_s=30, holder="c")
    assert third.try_acquire() and third.generation == 3  # no wait for the 30 s timeout


def test_a_lease_needs_links_or_conditional_writes():
    """A local path (hard links) or an object store (conditional writes, see
    test_lease_objectstore.py); any other URI is refused, naming both."""
    with pytest.raises(CheckpointError, match="local or mounted path or an object store"):
        Lease("hdfs://namenode/ckpt")


def test_a_standby_waits_through_a_store_that_does_not_answer_and_takes_the_lease_once_it_does(tmp_path):
    lease = Lease(str(tmp_path), timeout_s=5, holder="standby")
    real, outage = lease.files, {"calls": 0}

    class Away:  # the checkpoint's store, unreachable for its first 5 requests
        def __getattr__(self, name: str):
            def call(*args):
                outage["calls"] += 1
                if outage["calls"] <= 5:
                    raise ConnectionError("the store did not answer")
                return getattr(real, name)(*args)
            return call

    lease.files = Away()
    assert lease.acquire(poll_s=0.01) and lease.generation == 1
    assert outage["calls"] > 5
