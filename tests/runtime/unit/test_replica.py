"""A hot pair's follower without Spark: when it copies the leader's state instead of running its
plans, which followers the leader waits for, and when a leader is known to be gone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from eddyline.ha.lease import Holding
from eddyline.runtime import replica
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.epoch.records import EpochCommit
from eddyline.runtime.replica import COPYING, FOLLOWING, JOINING, Following, HotPair, gone


def commit(ck: Checkpoint, epoch: int) -> None:
    ck.write_commit(EpochCommit(epoch, {"bids": epoch * 10}, {}, {}))


def beats(group: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (group / "followers").glob("*.json")}


def test_a_follower_far_behind_copies_the_leaders_commit_and_is_waited_for_only_once_it_follows(tmp_path: Path) -> None:
    group = tmp_path / "group"
    leader_pair = HotPair(str(group), str(tmp_path / "a"), timeout_s=30)
    assert leader_pair.lease.try_acquire()
    leader = Checkpoint(str(tmp_path / "a"))
    for e in range(1, 18):  # 17 epochs, every plan kept
        commit(leader, e)
    pair = HotPair(str(group), str(tmp_path / "b"), timeout_s=30)
    follower = Following(None, pair, None, lambda: None, Checkpoint(str(tmp_path / "b")))  # type: ignore[arg-type]
    assert pair.state == JOINING and leader_pair.behind(18) == []  # a joining follower holds nobody

    states: list[str] = []
    pair.beat = lambda done, state=None, beat=pair.beat: (beat(done, state), states.append(pair.state))  # type: ignore[method-assign]
    assert follower._catch_up(leader, 0) == 17  # it copied commit 17 rather than run 17 plans
    assert states[0] == COPYING and pair.state == COPYING  # not following before it ran an epoch
    assert follower.adopted is not None and follower.adopted.epoch == 17
    assert Checkpoint(str(tmp_path / "b")).latest_commit().epoch == 17
    assert leader_pair.behind(20) == []
    commit(leader, 18)
    commit(Checkpoint(str(tmp_path / "b")), 18)  # it ran epoch 18 itself
    assert follower._catch_up(leader, 18) == 18 and pair.state == FOLLOWING
    # following, it is waited for once more than max_lag (1) epochs behind
    assert leader_pair.behind(20) == []
    assert leader_pair.behind(21) == [f"follower {pair.lease.holder}"]


def test_a_follower_close_behind_runs_the_plans_and_follows_within_max_lag(tmp_path: Path, monkeypatch) -> None:
    group = tmp_path / "group"
    leader = Checkpoint(str(tmp_path / "a"))
    for e in range(1, 4):
        commit(leader, e)
    pair = HotPair(str(group), str(tmp_path / "b"), timeout_s=30, max_lag=2)
    follower = Following(None, pair, None, lambda: None, Checkpoint(str(tmp_path / "b")))  # type: ignore[arg-type]
    assert follower._catch_up(leader, 0) == 0 and pair.state == JOINING  # 3 behind: it runs the plans
    assert follower._catch_up(leader, 1) == 1 and pair.state == FOLLOWING  # ran one, within 2
    assert list(beats(group).values())[0]["state"] == FOLLOWING
    monkeypatch.setattr(replica, "COPY_BEYOND", 0)
    commit(leader, 4)
    assert follower._catch_up(leader, 2) == 4  # frozen, then far behind: it copies again


def test_a_leader_is_gone_only_when_its_process_on_this_host_no_longer_exists() -> None:
    host = socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    now = time.time()
    assert gone(Holding(1, f"{host}:{child.pid}:abc123", now, now + 60))
    assert not gone(Holding(1, f"{host}:{os.getpid()}:abc123", now, now + 60))  # alive
    assert not gone(Holding(1, f"elsewhere:{child.pid}:abc123", now, now + 60))  # another host: only the lease tells
    assert not gone(Holding(1, "odd-name", now, now + 60))
