"""The control inbox on an object store: the driver lists it only when a command was queued since
(the bell), while commands it listed are open, or every ``RELIST_S``; an epoch otherwise costs one
small GET, not a LIST (a real S3-compatible server, moto's server mode)."""

from __future__ import annotations

import uuid

import pytest

from eddyline import objectstore
from eddyline.runtime import inbox as inbox_module
from eddyline.runtime.inbox import Inbox
from eddyline.storage import Gate


@pytest.fixture
def checkpoint(s3) -> str:
    return f"{s3.bucket(f'inbox-{uuid.uuid4().hex[:8]}')}/net"


def looks(driver: Inbox) -> tuple[list[str], dict[str, int]]:
    """One epoch's look at the inbox: the commands' ids, and the requests it made."""
    before = objectstore.REQUESTS.copy()
    found = [c["id"] for c in driver.waiting()]
    return found, objectstore.requests_since(before)


def test_the_driver_lists_the_inbox_only_after_the_bell(checkpoint: str) -> None:
    driver = Inbox(checkpoint, Gate(checkpoint))
    assert looks(driver) == ([], {"GET": 1, "LIST": 1})  # the first look lists
    assert looks(driver) == ([], {"GET": 1})  # nothing queued since: the bell only
    queued = Inbox(checkpoint).submit({"agg.threshold": 3})  # an operator (another process)
    found, made = looks(driver)
    assert found == [queued] and made.get("LIST") == 1
    found, made = looks(driver)  # still open (not closed yet): listed again
    assert found == [queued] and made.get("LIST") == 1
    driver.close(driver.pending()[0], "applied", 4)
    assert looks(driver)[0] == []  # the listing that finds it closed
    assert looks(driver) == ([], {"GET": 1})


def test_a_command_left_without_its_bell_is_found_within_relist_s(checkpoint: str, monkeypatch) -> None:
    driver = Inbox(checkpoint, Gate(checkpoint))
    looks(driver)
    store, key = objectstore.at(checkpoint)
    store.put(f"{key}/control/inbox/00000000000000000001-byhand.json", b'{"id": "byhand", "set": {}}')
    assert looks(driver)[0] == []  # no bell rang
    monkeypatch.setattr(inbox_module, "RELIST_S", 0.0)
    assert looks(driver)[0] == ["byhand"]


def test_a_local_inbox_is_listed_at_every_look(tmp_path) -> None:
    driver = Inbox(str(tmp_path), Gate(str(tmp_path)))
    assert driver.waiting() == []
    queued = Inbox(str(tmp_path)).submit({"agg.threshold": 3})
    assert [c["id"] for c in driver.waiting()] == [queued]
    assert not (tmp_path / "control" / "bell.json").exists()
