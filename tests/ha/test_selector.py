"""The stream selector's records: one publisher per output and epoch, the other checks; in a
local directory and on an object store (a real S3-compatible server, moto's server mode)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from eddyline import objectstore
from eddyline.ha.selector import FORGOTTEN, Digest, Diverged, Selector


@pytest.fixture(params=["local", "s3"])
def group(request, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path)
    return f"{request.getfixturevalue('s3').bucket(f'sel-{uuid.uuid4().hex[:8]}')}/group"


def kept(group: str) -> list[str]:
    """The names left under the selector's folder."""
    if "://" not in group:
        return sorted(p.name for p in (Path(group) / "selector").iterdir())
    store, key = objectstore.at(group)
    return sorted({k[len(key) + len("/selector/"):].split("/")[0] for k in store.list(f"{key}/selector/")})


def test_the_first_to_record_publishes_and_the_other_checks_and_skips(group: str) -> None:
    a, b = Selector(group, "a"), Selector(group, "b")
    same = Digest(3, "42")
    assert a.first(1, "out", same) and b.first(1, "out", same)  # neither has published yet
    a.done(1, "out", same)
    b.done(1, "out", same)  # both published (idempotent sinks): the second checks the first
    assert not b.first(1, "out", same) and b.lost == 2
    assert a.published(1, "out").by == "a"
    # a replay by the publisher itself skips too, and does not count as lost
    assert not a.first(1, "out", same) and a.lost == 0


def test_a_different_digest_is_an_error_naming_epoch_output_and_both_drivers(group: str) -> None:
    a, b = Selector(group, "a"), Selector(group, "b")
    a.done(7, "alerts", Digest(3, "42"))
    with pytest.raises(Diverged, match=r"epoch 7, output 'alerts': this driver \(b\) staged 4 rows \(hash 42\), a published 3 rows"):
        b.first(7, "alerts", Digest(4, "42"))
    with pytest.raises(Diverged):
        b.done(7, "alerts", Digest(3, "43"))
    assert not b.first(7, "alerts", None)  # no digest of its own (a sink it could not observe): no check


def test_records_of_old_epochs_are_forgotten(group: str) -> None:
    s = Selector(group, "a")
    for epoch in (1, 2, 3):
        s.done(epoch, "out", Digest(1, "1"))
    s.forget_before(3)
    s.forget_before(2)  # the floor never goes back
    assert [s.published(e, "out").by for e in (1, 2, 3)] == [FORGOTTEN, FORGOTTEN, "a"]
    assert kept(group) == ["0000000003", "forgotten"]
    # the other driver, frozen inside epoch 2 while these were dropped, wakes: it must not
    # publish epoch 2 again (nothing to compare its digest with)
    b = Selector(group, "b")
    assert not b.first(2, "out", Digest(1, "1")) and b.lost == 1
    assert b.first(4, "out", Digest(1, "1"))  # a later epoch is still its to publish


def test_of_two_drivers_recording_the_same_output_at_once_exactly_one_is_the_publisher(group: str) -> None:
    """Both published (a race the sinks make harmless); the records must still name one of them,
    the same for both, for every epoch: the store decides, not the drivers."""
    drivers = [Selector(group, name) for name in ("a", "b")]
    answers: dict[str, list] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def run(s: Selector) -> None:
        start.wait()
        for epoch in range(1, 13):
            answers[s.driver].append(s.record(epoch, "out", Digest(1, "1")))

    threads = [threading.Thread(target=run, args=(s,)) for s in drivers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for epoch in range(1, 13):
        a, b = answers["a"][epoch - 1], answers["b"][epoch - 1]
        assert (a is None) != (b is None), (epoch, a, b)  # one recorded, the other got its record
        winner = "a" if a is None else "b"
        assert (b or a).by == winner and drivers[0].published(epoch, "out").by == winner
