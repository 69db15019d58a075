"""The lease on an object store (a real S3-compatible server, moto's server mode): a generation is
created with a conditional write the store decides, so of many standbys racing for it, in threads
and in separate processes, exactly one wins each generation; and a race run with the write made
unconditional is caught by the same check."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
import uuid
from collections import Counter

import pytest

from eddyline import objectstore
from eddyline.errors import Fenced
from eddyline.ha.lease import Lease

CONTENDERS = 6  # threads per round
ROUNDS = 4


@pytest.fixture
def checkpoint(s3) -> str:
    return f"{s3.bucket(f'lease-{uuid.uuid4().hex[:8]}')}/net/ckpt"


def race(checkpoint: str, contenders: int) -> list[str]:
    """``contenders`` leases, each in a thread, take the next generation at once (every one has
    read the newest generation before any writes: the store alone decides); the holders that
    said they won."""
    leases = [Lease(checkpoint, timeout_s=60, holder=f"t{i}") for i in range(contenders)]
    ready = threading.Barrier(contenders)
    won: list[str] = []
    create = objectstore.ObjectStore.create

    def at_once(self: objectstore.ObjectStore, key: str, data: bytes) -> bool:
        ready.wait(timeout=30)
        return create(self, key, data)

    def take(lease: Lease) -> None:
        if lease.try_acquire(force=True):
            won.append(lease.holder)

    objectstore.ObjectStore.create = at_once  # type: ignore[method-assign]
    try:
        threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        objectstore.ObjectStore.create = create  # type: ignore[method-assign]
    return won


def test_a_lease_on_the_store_is_taken_renewed_fenced_and_released(checkpoint: str) -> None:
    clock = [1000.0]
    leader = Lease(checkpoint, timeout_s=5, holder="leader", clock=lambda: clock[0])
    standby = Lease(checkpoint, timeout_s=5, holder="standby", clock=lambda: clock[0])
    assert leader.try_acquire() and leader.generation == 1
    assert not standby.try_acquire()  # held and alive
    clock[0] += 3
    leader.renew()  # expiry pushed to 1008
    clock[0] += 4
    assert not standby.try_acquire()
    clock[0] += 2  # past the expiry
    assert standby.try_acquire() and standby.generation == 2
    with pytest.raises(Fenced, match="generation 2"):
        leader.check()
    current = standby.current()
    assert current is not None and (current.generation, current.holder) == (2, "standby")
    standby.release()
    again = Lease(checkpoint, timeout_s=5, holder="next", clock=lambda: clock[0])
    assert again.try_acquire() and again.generation == 3  # released: no wait for the expiry


def test_a_holder_whose_heartbeats_do_not_reach_the_store_fences_itself_before_its_lease_can_expire(checkpoint: str) -> None:
    """Nothing at the store refuses an old holder's writes once it reaches the store again, so a
    holder cut off from it must stop on its own, with a quarter of its lease in hand."""
    clock = [1000.0]
    leader = Lease(checkpoint, timeout_s=4, holder="a", clock=lambda: clock[0])
    assert leader.try_acquire()  # valid until 1004
    clock[0] += 2.9
    leader.check()  # 1.1 s left: still leading
    clock[0] += 0.2  # 0.9 s left: less than a quarter of the timeout
    with pytest.raises(Fenced, match=r"could not renew its lease \(generation 1\) for 3.1s of its 4s"):
        leader.check()
    with pytest.raises(Fenced):
        leader.renew()  # fenced for good: a late heartbeat does not bring it back
    assert leader.current().expires_at == pytest.approx(1004)


def test_threads_racing_for_each_generation_leave_exactly_one_winner(checkpoint: str) -> None:
    for generation in range(1, ROUNDS + 1):
        won = race(checkpoint, CONTENDERS)
        assert len(won) == 1, (generation, won)
        holder = Lease(checkpoint).current()
        assert holder is not None and (holder.generation, holder.holder) == (generation, won[0])


def test_the_race_catches_an_unconditional_write(checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: with ``create`` made a plain PUT, the same race crowns
    several winners of one generation."""
    def unconditional(self: objectstore.ObjectStore, key: str, data: bytes) -> bool:
        self.put(key, data)
        return True

    monkeypatch.setattr(objectstore.ObjectStore, "create", unconditional)
    assert len(race(checkpoint, CONTENDERS)) == CONTENDERS


def _contend(checkpoint: str, env: dict[str, str], name: str, start_at: float, out: multiprocessing.Queue) -> None:
    os.environ.update(env)
    lease = Lease(checkpoint, timeout_s=60, holder=name)
    time.sleep(max(0.0, start_at - time.time()))
    out.put((name, lease.generation if lease.try_acquire(force=True) else None))


def test_processes_racing_for_the_lease_leave_one_winner_per_generation(s3, checkpoint: str) -> None:
    """Separate processes (each its own client and connections), started at one moment, taking
    the lease over from each other: every generation has one holder, and it is the one whose
    write the store kept."""
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    start_at = time.time() + 3.0  # (a spawned interpreter takes a moment to import)
    procs = [ctx.Process(target=_contend, args=(checkpoint, s3.env(), f"p{i}", start_at, out)) for i in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    generations = Counter(g for _, g in results if g is not None)
    assert generations and all(n == 1 for n in generations.values()), results
    store, key = objectstore.at(checkpoint)
    for name, g in results:
        if g is not None:
            got = store.get(f"{key}/lease/{g:010d}.json")
            assert got is not None and json.loads(got[0])["holder"] == name


def test_a_holder_is_fenced_on_time_while_its_heartbeat_waits_on_a_store_that_does_not_answer(
    checkpoint: str,
) -> None:
    """The heartbeat's request hangs (the store's answers vanish); the watch fences the holder
    when a quarter of its lease is left, not when the request gives up."""
    lease = Lease(checkpoint, timeout_s=1.2, holder="cut-off")
    assert lease.try_acquire()
    real = lease.files

    class Silent:  # every request waits 3 s before the store's (late) answer
        def __getattr__(self, name: str):
            def call(*args):
                time.sleep(3)
                return getattr(real, name)(*args)
            return call

    lease.files = Silent()
    fenced_at: list[float] = []
    lease.start_heartbeat(on_fenced=lambda: fenced_at.append(time.time()))
    deadline = time.time() + 5
    while not fenced_at and time.time() < deadline:
        time.sleep(0.02)
    assert fenced_at, "not fenced"
    assert lease.acquired_at + 0.85 <= fenced_at[0] <= lease.acquired_at + 1.2, fenced_at[0] - lease.acquired_at
    with pytest.raises(Fenced, match="could not renew"):
        lease.check()
