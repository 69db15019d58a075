"""The generation gate (:class:`eddyline.storage.Gate`): once a newer generation opened its gate
on a store, the file system refuses every write of an older one, whatever that one checked
before; what an older one left half-moved goes back; and a revoked driver racing the revocation
(re-making its directories the way a Spark task's ``mkdirs`` does) gets nothing visible after
the newer :meth:`Gate.open` returned."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from eddyline.errors import Fenced
from eddyline.storage import Gate


def test_a_newer_gate_revokes_the_older_ones_and_the_store_refuses_their_writes(tmp_path: Path) -> None:
    store = tmp_path / "out"
    old = Gate(str(store), 1).open()
    assert old.put(str(store / "a.json"), b"1")
    old.makedirs(old.staging("epoch=1"))
    (Path(old.staging("epoch=1")) / "part.parquet").write_bytes(b"rows")

    Gate(str(store), 2).open()
    assert (store / "_staging" / "g=1").is_file()  # the tombstone: no mkdir passes it
    assert (store / "_staging" / "g=2").is_dir()
    assert sorted(os.listdir(store / "_staging")) == ["g=1", "g=2"]  # the revoked gate's files are gone
    with pytest.raises(Fenced, match="generation 1 was taken over by generation 2: .* refuses its writes"):
        old.put(str(store / "b.json"), b"2")
    with pytest.raises(Fenced):
        old.publish(old.staging("epoch=1"), str(store / "epoch=1"))
    with pytest.raises(Fenced):
        old.move(str(store / "a.json"), str(store / "_corrections" / "a.json"))
    with pytest.raises(Fenced):
        old.remove(str(store / "a.json"))
    with pytest.raises(Fenced):
        old.makedirs(old.staging("epoch=2"))
    with pytest.raises(Fenced, match="taken over by generation 2"):
        Gate(str(store), 1).open()  # woken, it cannot make its gate again
    assert sorted(p.name for p in store.iterdir()) == ["_staging", "a.json"] and (store / "a.json").read_bytes() == b"1"


def test_an_older_generation_opening_after_a_newer_one_is_refused(tmp_path: Path) -> None:
    Gate(str(tmp_path), 5).open()
    with pytest.raises(Fenced, match="generation 3 was taken over by generation 5"):
        Gate(str(tmp_path), 3).open()
    assert (tmp_path / "_staging" / "g=3").is_file()
    Gate(str(tmp_path), 5).open()  # the same generation again (a restarted stage, a moved sink)
    Gate(str(tmp_path), 0).open()  # no lease: fences nobody, checked by nobody


def test_exclusive_puts_publish_replaces_and_moves(tmp_path: Path) -> None:
    gate = Gate(str(tmp_path), 1).open()
    assert gate.put(str(tmp_path / "plan.json"), b"first", exclusive=True)
    assert not gate.put(str(tmp_path / "plan.json"), b"second", exclusive=True)
    assert (tmp_path / "plan.json").read_bytes() == b"first"
    for attempt in (b"one", b"two"):  # a replayed epoch replaces what an earlier attempt published
        staged = Path(gate.staging("epoch=7"))
        gate.makedirs(str(staged))
        (staged / "part").write_bytes(attempt)
        gate.publish(str(staged), str(tmp_path / "epoch=7"))
    assert (tmp_path / "epoch=7" / "part").read_bytes() == b"two"
    assert gate.move(str(tmp_path / "epoch=7"), str(tmp_path / "_corrections" / "epoch=8" / "epoch=7"))
    assert not gate.move(str(tmp_path / "epoch=7"), str(tmp_path / "elsewhere"))
    assert (tmp_path / "_corrections" / "epoch=8" / "epoch=7" / "part").read_bytes() == b"two"
    assert gate.remove(str(tmp_path / "_corrections")) and not (tmp_path / "_corrections").exists()
    assert os.listdir(tmp_path / "_staging" / "g=1") == []  # nothing left behind


def test_two_writers_publishing_one_epoch_at_once_both_succeed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two drivers of a hot pair may both publish an epoch (the selector's record comes after
    the publish): the other's directory landing between this one's parking the old one and its
    rename must not fail the publish; the epoch ends up published whole, once."""
    mine, theirs = Gate(str(tmp_path), 1, "a").open(), Gate(str(tmp_path), 1, "b")
    staged, other = Path(mine.staging("epoch=7")), Path(theirs.staging("epoch=7"))
    for gate, path, data in ((mine, staged, b"mine"), (theirs, other, b"theirs")):
        gate.makedirs(str(path))
        (path / "part").write_bytes(data)
    park = Gate._park
    landed = []

    def park_then_the_other_publishes(self: Gate, path: str) -> str | None:
        parked = park(self, path)
        if self is mine and not landed:
            landed.append(True)
            os.rename(other, tmp_path / "epoch=7")  # the other driver's publish, just in between
        return parked

    monkeypatch.setattr(Gate, "_park", park_then_the_other_publishes)
    mine.publish(str(staged), str(tmp_path / "epoch=7"))
    assert landed and (tmp_path / "epoch=7" / "part").read_bytes() == b"mine"
    assert os.listdir(tmp_path / "epoch=7") == ["part"]
    assert os.listdir(tmp_path / "_staging" / "g=1" / "a") == []  # the other's copy was not left parked


def test_what_a_revoked_driver_left_between_its_two_renames_goes_back(tmp_path: Path) -> None:
    old = Gate(str(tmp_path), 1, writer="driver-a").open()
    (tmp_path / "epoch=3").mkdir()
    (tmp_path / "epoch=3" / "part").write_bytes(b"published")
    old._park(str(tmp_path / "epoch=3"))  # a retraction cut after its first rename
    assert not (tmp_path / "epoch=3").exists()
    Gate(str(tmp_path), 2).open()
    assert (tmp_path / "epoch=3" / "part").read_bytes() == b"published"


def _zombie(store: str, started: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """Generation 1, woken: publishes epochs as fast as it can, making its staging again with a
    recursive mkdir each time (as Hadoop's committer does), until it is killed."""
    gate = Gate(store, 1).open()
    started.set()
    n = 0
    while True:
        n += 1
        staged = gate.staging(f"epoch={n}")
        try:
            os.makedirs(staged, exist_ok=True)  # recursive: it would make a revoked gate again
            with open(f"{staged}/part", "wb") as f:
                f.write(b"x")
            gate.publish(staged, f"{store}/epoch={n}")
        except (Fenced, OSError):
            pass


def test_nothing_of_a_racing_revoked_driver_becomes_visible_once_the_newer_gate_is_open(tmp_path: Path) -> None:
    store = str(tmp_path / "out")
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        started = ctx.Event()
        zombie = ctx.Process(target=_zombie, args=(store, started), daemon=True)
        zombie.start()
        assert started.wait(10)
        time.sleep(0.2)  # let it publish a while
        Gate(store, 2).open()
        after = {p for p in os.listdir(store) if p.startswith("epoch=")}
        time.sleep(0.5)
        late = {p for p in os.listdir(store) if p.startswith("epoch=")} - after
        zombie.kill()
        zombie.join()
        assert after and late == set(), f"published after the newer gate opened: {sorted(late)}"
        for name in os.listdir(store):  # the next round's zombie starts on a fresh store
            path = f"{store}/{name}"
            import shutil

            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def test_two_generations_opening_at_once_leave_the_older_unable_to_write(tmp_path: Path) -> None:
    for i in range(40):
        store = str(tmp_path / f"s{i}")
        gates = {1: Gate(store, 1), 2: Gate(store, 2)}
        errors: dict[int, BaseException] = {}

        def open_(g: int, gates: dict[int, Gate] = gates, errors: dict[int, BaseException] = errors) -> None:
            try:
                gates[g].open()
            except Fenced as e:
                errors[g] = e

        threads = [threading.Thread(target=open_, args=(g,)) for g in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 2 not in errors
        with pytest.raises(Fenced):
            gates[1].put(f"{store}/late.json", b"late")
        assert not os.path.exists(f"{store}/late.json")
