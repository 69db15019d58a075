"""The epoch's records as the checkpoint stores them, and the fault hook's parsing (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline.errors import CheckpointError
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, StepCommit
from eddyline.runtime.faults import FaultPoint, KillDriver


def test_plans_and_commits_round_trip_through_the_checkpoint(tmp_path: Path) -> None:
    ckpt = Checkpoint(str(tmp_path))
    ckpt.open({"name": "t"})
    plan = EpochPlan(3, {"src": {"start": 0, "end": 10}}, {"agg": 5_000}, {"agg": {"lanes": 2}}, 2,
                     decisions=[{"kind": "balance"}], control={"manager": {"placed": ["agg"]}})
    ckpt.write_plan(plan)
    assert ckpt.read_plan(3) == plan
    step = StepCommit(index={7: [[3, 0, "s"]]}, input_max=[9_000, 4_000], watermark=5_000, routing={"lanes": 2})
    assert step.max_event_time == 4_000  # the slowest input
    reached: list[str] = []
    done = EpochCommit(3, {"src": 10}, {"agg": step}, {"out": 4}, control={"manager": {}})
    ckpt.write_commit(done, before_rename=lambda: reached.append(str(sorted(
        [p.name for p in (tmp_path / "commits").iterdir()] + [p.name for p in (tmp_path / "_staging" / "g=0").iterdir()]))))
    # only the temporary file, in the checkpoint's gate (storage.Gate)
    assert reached and ".json." in reached[0] and ".tmp" in reached[0] and "'0000000003.json'" not in reached[0]
    again = ckpt.latest_commit()
    assert again is not None and again.steps["agg"].index == {7: [[3, 0, "s"]]}  # key groups are ints again
    assert again == EpochCommit(**{**done.__dict__, "committed_at": again.committed_at})
    assert ckpt.pending_plan(3) is None and ckpt.pending_plan(2) == plan


def test_crash_points_parse_or_are_refused_with_the_list() -> None:
    kill = KillDriver.parse("4:mid_commit")
    assert (kill.epoch, kill.point) == (4, FaultPoint.MID_COMMIT)
    for bad in ("x:in_task", "4:during_lunch", "4"):
        with pytest.raises(CheckpointError, match="EPOCH:POINT with POINT in planned, after_plan, in_task"):
            KillDriver.parse(bad)
