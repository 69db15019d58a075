"""Stage 6, observe: the controller learns what the epoch measured (lane loads, rows shed, its
duration), before the commit, so the committed controller state includes this epoch."""

from __future__ import annotations

from dataclasses import dataclass

from eddyline.api.network import NetworkSpec
from eddyline.control.catchup import Taken
from eddyline.control.controller import Controller
from eddyline.control.overload import EpochCost
from eddyline.runtime.epoch.records import EpochPlan, Folded, Staged


@dataclass(frozen=True)
class Shedding:
    """Per stateful step and input, the rows offered to and kept by the shed point; per step
    with a utility, the utility's quantiles among them."""

    offered: dict[str, list[int]]
    kept: dict[str, list[int]]
    quantiles: dict[str, list[float]]


def shedding(spec: NetworkSpec, staged: Staged) -> Shedding:
    offered: dict[str, list[int]] = {}
    kept: dict[str, list[int]] = {}
    quantiles: dict[str, list[float]] = {}
    for s in spec.stateful_steps():
        o, k = [], []
        for i in range(len(s.inputs)):
            v = staged.observed.get(f"shed:{s.name}:{i}", {})
            o.append(int(v.get("offered") or 0))
            k.append(int(v.get("kept") or 0))
            if v.get("q"):
                quantiles[s.name] = [float(x) for x in v["q"] if x is not None]
        offered[s.name], kept[s.name] = o, k
    return Shedding(offered, kept, quantiles)


def observe(
    controller: Controller,
    spec: NetworkSpec,
    plan: EpochPlan,
    staged: Staged,
    folded: Folded,
    duration_ms: float,
    wall_s: float,
    *,
    cold: bool,
) -> Shedding | None:
    """``cold``: the first epoch of this process (its costs include warming up, which the
    overload model leaves out). Returns what was shed, when overload control is on."""
    for name, load in folded.loads.items():
        controller.manager.observe(name, load)
    read = {n.name: int(staged.observed.get(f"source:{n.name}", {}).get("rows") or 0) for n in spec.sources}
    if controller.catch_up is not None:
        controller.catch_up.observe(Taken(
            plan.epoch, duration_ms, read, {n: s["end"] - s["start"] for n, s in plan.sources.items()},
            {n: sum(s["sizes"]) for n, s in plan.sources.items() if "sizes" in s}, cold))
    if controller.overload is None:
        return None
    shed = shedding(spec, staged)
    controller.overload.observe(
        EpochCost(
            plan.epoch,
            duration_ms,
            read,
            shed.offered,
            shed.kept,
            {n: load.makespan_ms for n, load in folded.loads.items()},
            {n: load.busy_ms for n, load in folded.loads.items()},
            {n: load.lanes for n, load in folded.loads.items()},
            folded.output_rows,
            dict(staged.sink_rows),
            wall_s,
        ),
        shed.quantiles,
        cold=cold,
    )
    return shed
