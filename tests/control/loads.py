"""A stateful step's spec and made-up per-epoch loads, for the distribution manager's tests."""

from __future__ import annotations

from eddyline.api.validate import load_spec
from eddyline.control.stats import StepLoad
from eddyline.plan.keygroups import RoutingTable

K = 8


def spec(control: dict, join: bool = False) -> object:
    step = (
        {"name": "s", "join": {"left": "a", "right": "b", "left_key": "key", "right_key": "key"}}
        if join
        else {"name": "s", "input": "a", "dedup": {"key": "key", "time": "event_time", "ttl": "1m"}}
    )
    return load_spec({
        "name": "t", "key_groups": K, "lanes": 2,
        "sources": [{"name": "a", "generator": {}}, *([{"name": "b", "generator": {}}] if join else [])],
        "steps": [step],
        "sinks": [{"name": "o", "input": "s", "memory": {}}],
        "control": control,
    })


def load(epoch: int, table: RoutingTable, per_kg: dict[int, float], rows_per_ms: float = 10.0, wall_s: float = 1.0) -> StepLoad:
    busy = [0.0] * table.lanes
    for kg, v in per_kg.items():
        busy[table.lane_of(kg)] += v
    rows = {kg: int(v * rows_per_ms) for kg, v in per_kg.items()}
    return StepLoad(epoch, table.lanes, dict(per_kg), rows, {}, busy, sum(rows.values()), 0, 0, 0, wall_s)
