"""The stream selector's records: one publisher per output and epoch, the other checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline.ha.selector import FORGOTTEN, Digest, Diverged, Selector


def test_the_first_to_record_publishes_and_the_other_checks_and_skips(tmp_path: Path) -> None:
    a, b = Selector(str(tmp_path), "a"), Selector(str(tmp_path), "b")
    same = Digest(3, "42")
    assert a.first(1, "out", same) and b.first(1, "out", same)  # neither has published yet
    a.done(1, "out", same)
    b.done(1, "out", same)  # both published (idempotent sinks): the second checks the first
    assert not b.first(1, "out", same) and b.lost == 2
    assert a.published(1, "out").by == "a"
    # a replay by the publisher itself skips too, and does not count as lost
    assert not a.first(1, "out", same) and a.lost == 0


def test_a_different_digest_is_an_error_naming_epoch_output_and_both_drivers(tmp_path: Path) -> None:
    a, b = Selector(str(tmp_path), "a"), Selector(str(tmp_path), "b")
    a.done(7, "alerts", Digest(3, "42"))
    with pytest.raises(Diverged, match=r"epoch 7, output 'alerts': this driver \(b\) staged 4 rows \(hash 42\), a published 3 rows"):
        b.first(7, "alerts", Digest(4, "42"))
    with pytest.raises(Diverged):
        b.done(7, "alerts", Digest(3, "43"))
    assert not b.first(7, "alerts", None)  # no digest of its own (a sink it could not observe): no check


def test_records_of_old_epochs_are_forgotten(tmp_path: Path) -> None:
    s = Selector(str(tmp_path), "a")
    for epoch in (1, 2, 3):
        s.done(epoch, "out", Digest(1, "1"))
    s.forget_before(3)
    s.forget_before(2)  # the floor never goes back
    assert [s.published(e, "out").by for e in (1, 2, 3)] == [FORGOTTEN, FORGOTTEN, "a"]
    assert sorted(p.name for p in (tmp_path / "selector").iterdir()) == ["0000000003", "forgotten"]
    # the other driver, frozen inside epoch 2 while these were dropped, wakes: it must not
    # publish epoch 2 again (nothing to compare its digest with)
    b = Selector(str(tmp_path), "b")
    assert not b.first(2, "out", Digest(1, "1")) and b.lost == 1
    assert b.first(4, "out", Digest(1, "1"))  # a later epoch is still its to publish
