"""Stage 5, fold: the lanes' manifests into each stateful step's new state index, its newest
event times and its load statistics (what the commit and the controller need)."""

from __future__ import annotations

from typing import Any

from eddyline.api.network import NetworkSpec
from eddyline.control.stats import step_load
from eddyline.eventtime import NO_WATERMARK
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.epoch.records import (
    EpochCommit,
    EpochPlan,
    Folded,
    LaneManifest,
    Staged,
    StepCommit,
)
from eddyline.state.store import with_chains


def fold(
    spec: NetworkSpec, ckpt: Checkpoint, plan: EpochPlan, last: EpochCommit | None, staged: Staged, wall_s: float
) -> Folded:
    """``wall_s``: seconds since the previous epoch started (the loads' time base)."""
    steps: dict[str, StepCommit] = {}
    manifests: dict[str, list[LaneManifest]] = {}
    loads: dict[str, Any] = {}
    output_rows: dict[str, int] = {}
    late_rows: dict[str, int] = {}
    for s in spec.stateful_steps():
        lanes = RoutingTable.from_json(plan.routing[s.name]).lanes
        raw = staged.manifests.get(s.name) or ckpt.lane_manifests(plan.epoch, s.name, lanes)
        manifests[s.name] = [LaneManifest(m) for m in raw]
        prev = last.steps.get(s.name) if last else None
        index = dict(prev.index) if prev else {}
        for m in manifests[s.name]:
            index = with_chains(index, m.chains)
        # Each input's newest event time so far; the step's watermark follows the slowest.
        inputs = len(s.time_columns())
        input_max = list(prev.input_max) if prev else [NO_WATERMARK] * inputs
        for i in range(inputs):
            seen = staged.observed.get(f"step:{s.name}:{i}", {}).get("max_t")
            if seen is not None:
                input_max[i] = max(input_max[i], int(seen))
        late = sum(int(o.get("late") or 0) for k, o in staged.observed.items() if k.startswith(f"step:{s.name}:"))
        late_rows[s.name] = late + sum(int(m.metrics.get("late_rows", 0)) for m in manifests[s.name])
        loads[s.name] = step_load(plan.epoch, lanes, raw, wall_s, spec.control.load)
        output_rows[s.name] = sum(m.output_rows for m in manifests[s.name])
        watermark = plan.advance.get(s.name, plan.watermarks[s.name])
        steps[s.name] = StepCommit(index, input_max, watermark, plan.routing[s.name])
    return Folded(steps, manifests, loads, output_rows, late_rows)
