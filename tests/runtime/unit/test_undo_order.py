"""Replays undone in the reverse order they were made bring back exactly what the sinks held
before the undone replay; an undo out of that order is refused before anything changes.

The sink is a real files target on a temporary directory, taking epochs back either way it can
(moving directories aside, or as revisions: rows written again with ``_diff`` negated); each
epoch retracts, puts back and publishes as the epoch loop's publish stage does
(``retracts``/``restores`` as the planner makes them for a replay and an undo), and the
commands go through the engine's own check."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.api.units import Files
from eddyline.io.files import FilesTarget
from eddyline.io.files.changelog import Revisions
from eddyline.runtime.admission import undo_blocked

Applied = dict[int, list[dict]]


def _in_force(base: Path, revisions: bool) -> set[int]:
    """The epochs whose rows a reader of the sink sees (each epoch writes one row naming it)."""
    if not revisions:
        return {int(p.name.split("=")[1]) for p in base.glob("epoch=*")}
    weight: Counter = Counter()
    for part in base.glob("epoch=*/*.parquet"):
        for row in pq.read_table(part).to_pylist():
            weight[row["wrote"]] += row["_diff"]
    assert set(weight.values()) <= {0, 1}, weight  # never taken back twice, nor shown twice
    return {e for e, w in weight.items() if w}


def _epoch(target: FilesTarget, revisions: Revisions | None, epoch: int, retracts: list[int], restores: list[int]) -> None:
    """One epoch: stage its row, take back, put back, then publish (the publish stage's order)."""
    staged = Path(target.staging(epoch))
    staged.mkdir(parents=True)
    pq.write_table(pa.table({"wrote": [epoch], "_diff": pa.array([1], pa.int64())}), staged / "part-0.parquet")
    if retracts:
        target.retract(retracts, epoch) if revisions is None else revisions.take_back(retracts, epoch)
    for undone in restores:
        target.restore(undone) if revisions is None else revisions.put_back(undone)
    if revisions is not None:
        revisions.write(epoch)
    target.publish(epoch)


def _blocked(replay: int, applied: Applied) -> str | None:
    return undo_blocked(replay, sorted((e, a) for e, a in applied.items() if e > replay))


@pytest.mark.parametrize("retract", ["move", "revisions"])
@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["epoch", "replay", "undo"]), st.integers(0, 1_000)), max_size=16))
def test_undos_in_reverse_order_bring_back_exactly_what_the_sink_held(retract: str, ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = FilesTarget(Files(path=tmp, format="parquet"))
        revisions = Revisions(target) if retract == "revisions" else None
        held: dict[int, set[int]] = {0: set()}  # what the sink showed after each epoch
        applied: Applied = {}
        for kind, pick in ops:
            epoch = len(applied) + 1
            retracts: list[int] = []
            restores: list[int] = []
            command: list[dict] = []
            replays = [e for e, a in applied.items() if any("replay" in c for c in a)]
            if kind == "replay" and epoch > 1:
                start = 1 + pick % (epoch - 1)
                retracts, command = list(range(start, epoch)), [{"replay": start}]
            elif kind == "undo" and replays:
                replay = replays[pick % len(replays)]
                if _blocked(replay, applied) is not None:
                    continue  # refused: nothing changes
                retracts, restores, command = list(range(replay, epoch)), [replay], [{"undo": replay}]
            _epoch(target, revisions, epoch, retracts, restores)
            applied[epoch] = command
            held[epoch] = _in_force(Path(tmp), revisions is not None)
            if restores:  # the content from before the replay, and the undoing epoch's own output
                assert held[epoch] == held[restores[0] - 1] | {epoch}
            else:
                assert held[epoch] == held[epoch - 1] - set(retracts) | {epoch}


def test_an_undo_out_of_order_or_twice_is_refused_with_the_replay_to_undo_first() -> None:
    applied: Applied = {e: [] for e in range(1, 21)}
    applied[9] = [{"replay": 5}]
    applied[13] = [{"replay": 3}]  # reaches further back than the one at 9
    assert _blocked(9, {e: a for e, a in applied.items() if e <= 16}) == (
        "the replay at epoch 13 came later and is still in force; undo it first "
        "(replays are undone in the reverse order they were made)")
    assert _blocked(13, {e: a for e, a in applied.items() if e <= 16}) is None
    applied[17] = [{"undo": 13}]
    assert _blocked(9, applied) is None
    applied[21] = [{"undo": 9}]
    assert _blocked(9, applied) == "the replay at epoch 9 was undone at epoch 21 already"
    assert _blocked(13, applied) == "the replay at epoch 13 was undone at epoch 17 already"
