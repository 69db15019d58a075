"""A checkpoint on an object store (a real S3-compatible server, moto's server mode): plans,
commits, state and the lease live only there. A driver killed in the middle of an epoch is
replayed from the plan it left on the store, and a standby takes the lease over with a conditional
write when the leader dies; the output is the uninterrupted run's, each window once."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

from eddyline import objectstore

from .drivers import finish, kill_the_leader, start, wait_for
from .helpers import read_windows

pytestmark = pytest.mark.slow


def commits(ckpt: str) -> dict[int, dict]:
    """The checkpoint's commits by epoch, read from the store."""
    store, key = objectstore.at(ckpt)
    out = {}
    for name in store.list(f"{key}/commits"):
        got = store.get(name)
        if got is not None and name.endswith(".json"):
            out[int(name.rsplit("/", 1)[1][:-5])] = json.loads(got[0])
    return out


def test_a_killed_driver_is_replayed_from_the_plan_it_left_on_the_store(s3, windowed_bids, tmp_path: Path) -> None:
    spec, expected = windowed_bids
    ckpt = f"{s3.bucket(f'ck-{uuid.uuid4().hex[:8]}')}/net"
    code, err = finish(start(spec, ckpt, "--crash-at", "3:after_stage"))
    assert code == -signal.SIGKILL, err[-2000:]
    assert sorted(commits(ckpt)) == [1, 2]
    store, key = objectstore.at(ckpt)
    assert store.get(f"{key}/plans/{3:010d}.json") is not None  # the plan the restart replays
    code, err = finish(start(spec, ckpt))
    assert code == 0, err[-3000:]
    assert read_windows(tmp_path / "out") == expected
    local = [p for p in (*tmp_path.rglob("commits"), *tmp_path.rglob("plans")) if "ref-ckpt" not in p.parts]
    assert not local  # nothing of the checkpoint on the local disk (but the reference run's)


# 48 epochs half a second apart: time for the standby to start its JVM and rehearse before the
# leader ends
@pytest.mark.parametrize("windowed_bids", [48], indirect=True)
def test_a_standby_takes_the_lease_on_the_store_over_when_the_leader_dies(s3, windowed_bids, tmp_path: Path) -> None:
    spec, expected = windowed_bids
    ckpt = f"{s3.bucket(f'ck-{uuid.uuid4().hex[:8]}')}/net"
    store, key = objectstore.at(ckpt)
    leader = start(spec, ckpt)
    wait_for(lambda: store.get(f"{key}/lease/{1:010d}.json") is not None)
    standby = start(spec, ckpt, "--standby")
    died, first = kill_the_leader(leader, standby, lambda: commits(ckpt))
    code, err = finish(standby)
    assert code == 0, err[-3000:]
    assert read_windows(tmp_path / "out") == expected
    done = commits(ckpt)
    assert all(c["generation"] == (1 if c["committed_at"] < first else 2) for c in done.values())
    print(f"takeover on the store: {first - died:.1f} s from the leader's death to the standby's first commit")
