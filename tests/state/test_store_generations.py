"""On an object store the store cannot refuse an older lease generation's write of a state file as
a gate on a file system does; instead each generation writes under its own names, and the chains
a commit holds name the files they read. A driver woken past its lease writes the same epoch and
lane as the newer driver did, with other rows (a step that is not deterministic): the newer
driver's state reads back unchanged, and the former holder's file goes with the next cleanup."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from eddyline import objectstore
from eddyline.state.store import KeyGroupStore, StateCache, parse_state_file, state_file
from eddyline.storage import Gate
from tests.state.storerows import PK, SCHEMA, as_dict, table


def writer(root: str, generation: int) -> KeyGroupStore:
    return KeyGroupStore(root, "agg", SCHEMA, PK, cache=StateCache(1 << 20), gate=Gate(root, generation))


def names(root: str) -> list[str]:
    store, key = objectstore.at(root)
    return sorted(k.rsplit("/", 1)[1] for k in store.list(f"{key}/state/agg/"))


def test_a_former_holders_state_file_lands_beside_the_newer_ones_never_over_it(s3) -> None:
    root = f"{s3.bucket(f'st-{uuid.uuid4().hex[:8]}')}/net"
    newer, older = writer(root, 2), writer(root, 1)
    rows = {(0, 1): 10, (1, 2): 20}
    res = newer.write(3, 0, {}, table(rows), table(rows), table({}).select(list(PK)), [0, 1])
    index = {kg: c for kg, c in res.chains.items() if c}
    wrong = {(0, 1): 99, (1, 2): 99}  # what the woken driver computed (another draw of rand())
    older.write(3, 0, {}, table(wrong), table(wrong), table({}).select(list(PK)), [0, 1])
    assert names(root) == ["0000000003-0000-g1.arrow", "0000000003-0000-g2.arrow"]
    fresh = KeyGroupStore(root, "agg", SCHEMA, PK, cache=StateCache(1 << 20))  # nothing cached
    assert as_dict(fresh.load(index, [0, 1])) == rows
    assert fresh.cleanup([index], below_epoch=4) == 1
    assert names(root) == ["0000000003-0000-g2.arrow"]


def test_names_without_a_generation_are_a_file_systems_and_read_back(tmp_path: Path) -> None:
    # a gate on a file system refuses a former holder itself: no generation in the names
    s = KeyGroupStore(str(tmp_path), "agg", SCHEMA, PK, gate=Gate(str(tmp_path), 2).open())
    rows = {(0, 1): 1}
    s.write(1, 0, {}, table(rows), table(rows), table({}).select(list(PK)), [0])
    assert [p.name for p in (tmp_path / "state" / "agg").iterdir()] == ["0000000001-0000.arrow"]


@pytest.mark.parametrize("file_id", [0, 3, (2 << 16) | 1, (7 << 32) | 3, (1 << 40) | (1 << 16) | 2])
def test_a_state_files_name_gives_back_its_epoch_and_id(file_id: int) -> None:
    name = state_file("b", "agg", 12, file_id).rsplit("/", 1)[1]
    assert parse_state_file(name) == (12, file_id)


@pytest.mark.parametrize("name", ["x.arrow", "0001-a.arrow", "0001-0002-gx.arrow", "0001-0002.json", "0001"])
def test_other_names_are_not_state_files(name: str) -> None:
    assert parse_state_file(name) is None
