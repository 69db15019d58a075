"""Failover between drivers on one checkpoint: a standby takes over once the leader's lease
expires, and a leader that was only frozen is fenced when it wakes. The output is the
uninterrupted run's, each row once."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from .drivers import LEASE, commits, finish, kill_the_leader, start, wait_for
from .helpers import bids_window_spec, read_windows, write_bid_files

pytestmark = pytest.mark.slow

def in_mode(spec: Path, execution: str) -> Path:
    """``spec`` run with ``execution`` (the fixture's reference ran per-epoch jobs)."""
    raw = yaml.safe_load(spec.read_text())
    path = spec.with_name(f"net-{execution}.yaml")
    path.write_text(yaml.safe_dump({**raw, "execution": execution}))
    return path


def test_a_frozen_leader_is_fenced_after_the_standby_took_over(windowed_bids, tmp_path: Path) -> None:
    """The leader runs resident lanes (its Spark's tasks, frozen with it), the standby per-epoch
    jobs: a checkpoint changes mode at a takeover as at any restart."""
    spec, expected = windowed_bids
    ckpt = tmp_path / "ckpt"
    # the leader freezes itself (SIGSTOP) once epoch 3's plan is logged, before anything of it ran
    leader = start(in_mode(spec, "resident"), ckpt, "--freeze-at", "3:after_plan")
    wait_for(lambda: (ckpt / "plans" / f"{3:010d}.json").exists() and leader.poll() is None)
    time.sleep(0.5)
    standby = start(spec, ckpt, "--standby", "--progress-json", str(tmp_path / "standby.jsonl"))
    code, err = finish(standby)
    assert code == 0, err[-3000:]
    assert "lease generation 2" in err  # (its Spark took longer to start than the lease to expire)
    progress = [json.loads(x) for x in (tmp_path / "standby.jsonl").read_text().splitlines()]
    assert {r["driver"]["generation"] for r in progress} == {2} and progress[0]["batchId"] == 3
    assert read_windows(tmp_path / "out") == expected  # the standby replayed epoch 3 and went on
    assert (ckpt / "resident").is_dir()  # (the leader's stage)

    leader.send_signal(signal.SIGCONT)
    code, err = finish(leader)
    assert code != 0 and "was taken over" in err, err[-3000:]
    assert read_windows(tmp_path / "out") == expected  # the woken leader published nothing
    done = commits(ckpt)
    assert {e for e, c in done.items() if c["generation"] == 1} == {1, 2}
    assert all(c["generation"] == 2 for e, c in done.items() if e >= 3)


# 48 epochs half a second apart: time for the standby to start its JVM and rehearse (about 10 s)
# before the leader ends
@pytest.mark.parametrize("windowed_bids", [48], indirect=True)
def test_a_standby_takes_over_when_the_leader_dies(windowed_bids, tmp_path: Path) -> None:
    """The leader runs per-epoch jobs, the standby resident lanes (it rehearses an epoch on them
    while it waits, and starts its stage from the last commit once it leads)."""
    spec, expected = windowed_bids
    ckpt = tmp_path / "ckpt"
    leader = start(spec, ckpt)
    wait_for(lambda: (ckpt / "lease" / f"{1:010d}.json").exists())
    standby = start(in_mode(spec, "resident"), ckpt, "--standby")  # its SparkSession up, an epoch rehearsed, waiting for the lease
    died, first = kill_the_leader(leader, standby, lambda: commits(ckpt))
    # (a second line when it first rehearsed an empty epoch, then the leader's first commit)
    ready = [x for x in standby.errfile.read_text().splitlines() if x.startswith("standby ready: ")]
    assert 1 <= len(ready) <= 2 and all("rehearsed in" in x and "failed" not in x for x in ready), ready
    code, err = finish(standby)
    assert code == 0, err[-3000:]
    assert read_windows(tmp_path / "out") == expected
    assert (ckpt / "resident").is_dir()  # (the standby's stage)
    done = commits(ckpt)
    assert all(c["generation"] == (1 if c["committed_at"] < first else 2) for c in done.values())
    takeover_s = first - died
    print(f"takeover: {takeover_s:.1f} s from the leader's death to the standby's first commit (lease {LEASE} s)")
    assert takeover_s > float(LEASE) * 0.5  # it did wait for the lease to expire


class TakenOverMidEpoch:
    """After epoch ``epoch``'s plan is logged: another driver takes the lease (its clock says
    ours expired) and the epoch's input file goes away, so that the epoch's job fails, as the
    old leader's does when the new one clears the staging it was writing."""

    def __init__(self, checkpoint: Path, epoch: int, victim: Path):
        self.checkpoint, self.epoch, self.victim = checkpoint, epoch, victim

    def reached(self, point, epoch: int) -> None:  # noqa: ANN001
        from eddyline.ha.lease import Lease
        from eddyline.runtime.faults import FaultPoint

        if point == FaultPoint.AFTER_PLAN and epoch == self.epoch:
            assert Lease(str(self.checkpoint), holder="the other", clock=lambda: time.time() + 3600).try_acquire()
            self.victim.unlink()


def test_a_job_that_fails_after_a_takeover_stops_its_driver_as_fenced(spark, tmp_path: Path) -> None:
    from eddyline.ha.lease import Fenced, Lease
    from eddyline.runtime.engine import Engine

    write_bid_files(tmp_path / "in", files=3, rows=50, seed=2)
    ckpt = tmp_path / "ckpt"
    lease = Lease(str(ckpt), timeout_s=5)
    assert lease.try_acquire()
    faults = TakenOverMidEpoch(ckpt, 2, sorted((tmp_path / "in").iterdir())[1])
    engine = Engine(bids_window_spec(tmp_path / "in", tmp_path / "out"), spark, str(ckpt), lease=lease, faults=faults)
    with pytest.raises(Fenced, match=r"taken over by the other \(generation 2\)"):
        engine.run(until_idle=True)
    assert not (ckpt / "commits" / f"{2:010d}.json").exists()
