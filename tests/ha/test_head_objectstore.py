"""A checkpoint on an object store (a real S3-compatible server, moto's server mode) is committed
by replacing its head conditionally: once a newer lease generation has fenced it, the store
refuses an older generation's commit and change of network, however the older driver got there,
and the older driver stops naming the newer generation. The same sequence with the head written
unconditionally is caught by the same checks."""

from __future__ import annotations

import json
import uuid

import pytest

from eddyline import objectstore
from eddyline.errors import Fenced
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.epoch.records import EpochCommit

FINGERPRINT = {"key_groups": 8}


@pytest.fixture
def location(s3) -> str:
    return f"{s3.bucket(f'head-{uuid.uuid4().hex[:8]}')}/net"


def commit(epoch: int, generation: int) -> EpochCommit:
    return EpochCommit(epoch=epoch, source_ends={"bids": 10 * epoch}, steps={}, sinks={}, generation=generation)


def stored(location: str, name: str) -> dict | None:
    store, key = objectstore.at(location)
    got = store.get(f"{key}/{name}")
    return json.loads(got[0]) if got is not None else None


def test_a_fenced_generation_can_neither_commit_nor_change_the_network(location: str) -> None:
    old, new = Checkpoint(location), Checkpoint(location)
    old.fence(1)
    old.open(FINGERPRINT)
    assert old.write_commit(commit(1, 1), exclusive=True)
    new.fence(2)  # the standby took the lease over: before it reads anything
    assert new.latest_commit().epoch == 1

    refused = []
    with pytest.raises(Fenced, match="generation 1 was taken over by generation 2"):
        old.write_commit(commit(2, 1), exclusive=True)
    refused.append("commit")
    with pytest.raises(Fenced, match="generation 2"):
        old.record_change(FINGERPRINT, "abc", {"epoch": 2})
    refused.append("metadata")
    assert refused == ["commit", "metadata"]

    head = stored(location, "head.json")
    assert (head["epoch"], head["generation"]) == (1, 2)
    assert stored(location, f"commits/{2:010d}.json") is None  # nothing of the older one's epoch 2
    assert "applied" not in stored(location, "metadata.json")
    assert new.write_commit(commit(2, 2), exclusive=True)
    assert (new.latest_commit().epoch, new.latest_commit().generation) == (2, 2)
    assert stored(location, f"commits/{2:010d}.json")["generation"] == 2


def test_a_driver_fenced_before_it_ever_wrote_is_refused_too(location: str) -> None:
    """An older driver that has no version of the head in hand reads it, and finds the newer
    generation there."""
    first = Checkpoint(location)
    first.fence(1)
    first.open(FINGERPRINT)
    first.write_commit(commit(1, 1))
    Checkpoint(location).fence(3)
    late = Checkpoint(location)
    late.guarded.generation = 2  # as a driver of generation 2 that froze before it fenced
    with pytest.raises(Fenced, match="generation 2 was taken over by generation 3"):
        late.write_commit(commit(2, 2))
    with pytest.raises(Fenced, match="generation 3"):
        Checkpoint(location).fence(2)


def test_an_unconditional_head_is_caught(location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above, with the store told to write the head whatever version it holds: the
    older generation's commit goes through, which is what they catch."""
    put = objectstore.ObjectStore.put

    def unconditional(self: objectstore.ObjectStore, key: str, data: bytes, etag: str | None) -> str:
        return put(self, key, data)

    monkeypatch.setattr(objectstore.ObjectStore, "put_if", unconditional)
    old, new = Checkpoint(location), Checkpoint(location)
    old.fence(1)
    old.open(FINGERPRINT)
    old.write_commit(commit(1, 1))
    new.fence(2)
    assert old.write_commit(commit(2, 1))  # not refused: what the first test's checks catch
    head = stored(location, "head.json")
    assert (head["epoch"], head["generation"]) == (2, 1)


def test_the_history_follows_a_head_whose_copy_was_not_written(location: str) -> None:
    """A driver stopped between replacing the head and copying it into the history: the next
    holder's fence copies it, and its commits go on from there."""
    ck = Checkpoint(location)
    ck.fence(1)
    ck.open(FINGERPRINT)
    ck.write_commit(commit(1, 1))
    store, key = objectstore.at(location)
    store.delete(f"{key}/commits/{1:010d}.json")
    assert [c.epoch for c in Checkpoint(location).commits()] == []
    nxt = Checkpoint(location)
    nxt.fence(2)
    assert [c.epoch for c in nxt.commits()] == [1]
    assert nxt.write_commit(commit(2, 2), exclusive=True)
    assert [c.epoch for c in nxt.commits()] == [1, 2]


def test_a_checkpoint_made_before_heads_is_taken_up_from_its_history(location: str) -> None:
    """Commits written by an Eddyline that kept no head: the head starts at the newest."""
    store, key = objectstore.at(location)
    for epoch in (1, 2):
        store.put(f"{key}/commits/{epoch:010d}.json", json.dumps(commit(epoch, 1).to_json()).encode())
    assert Checkpoint(location).latest_commit().epoch == 2
    ck = Checkpoint(location)
    ck.fence(2)
    assert stored(location, "head.json")["epoch"] == 2
    assert ck.write_commit(commit(3, 2), exclusive=True)
    assert ck.latest_commit().epoch == 3
