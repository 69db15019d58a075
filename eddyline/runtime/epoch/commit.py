"""Stage 7, commit: the single atomic step that moves source offsets, state versions,
watermarks, sink counts and the controller's state forward together. An epoch is committed iff
its commit file exists; the fault point :attr:`FaultPoint.MID_COMMIT` is the moment the commit
is written to a temporary file but not yet renamed into place."""

from __future__ import annotations

from typing import Any

from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, Folded, Staged
from eddyline.runtime.faults import FaultPoint, Faults


def commit(
    ckpt: Checkpoint, plan: EpochPlan, last: EpochCommit | None, staged: Staged, folded: Folded,
    control: dict[str, Any], faults: Faults, *, generation: int = 0, exclusive: bool = False,
) -> EpochCommit:
    """``last``: the commit the epoch continued from. With ``exclusive`` (a driver under a
    lease), the commit is only created if the epoch has none; if a driver that was fenced
    meanwhile committed the same logged plan first, its commit stands (the plan's outputs and
    state files are the same) and is returned."""
    done = EpochCommit(
        epoch=plan.epoch,
        source_ends={n: s["end"] for n, s in plan.sources.items()},
        steps=folded.steps,
        sinks=staged.sink_rows,
        end_of_stream=plan.end_of_stream,
        cursors={n: s["cursor"] for n, s in plan.sources.items() if s.get("cursor") is not None},
        tables=plan.tables,
        control=control,
        generation=generation,
        tentative=plan.tentative,
        stable=_stable_ancestor(plan, last),
        settings=plan.settings,
        commands_cursor=plan.commands_cursor,
    )
    if not ckpt.write_commit(done, before_rename=lambda: faults.reached(FaultPoint.MID_COMMIT, plan.epoch),
                             exclusive=exclusive):
        return ckpt.read_commit(plan.epoch)
    return done


def _stable_ancestor(plan: EpochPlan, last: EpochCommit | None) -> int | None:
    """For a tentative epoch, the last stable commit its state descends from (0: none)."""
    if not plan.tentative:
        return None
    if last is None:
        return 0
    return last.stable if last.tentative else last.epoch
