"""A network with overload control and made-up epoch costs, for the overload controller's tests."""

from __future__ import annotations

from eddyline.api.validate import load_spec
from eddyline.control.overload import EpochCost


def spec(overload: dict, chain: bool = False) -> object:
    steps = [{"name": "a", "input": "src", "dedup": {"key": "key", "time": "event_time", "ttl": "1m"}}]
    if chain:  # a second, expensive stateful step after the first
        steps.append({"name": "b", "input": "a", "window_aggregate": {
            "key": "key", "time": "event_time", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"}}})
    return load_spec({
        "name": "t", "sources": [{"name": "src", "generator": {}}], "steps": steps,
        "sinks": [{"name": "out", "input": steps[-1]["name"], "memory": {}, "qos": {"latency": "1s", "utility": 1}}],
        "control": {"overload": overload},
    })


def epoch(e: int, rows: int, *, chain: bool = False, ms: float = 500.0, duration: float = 800.0) -> EpochCost:
    steps = ["a", "b"] if chain else ["a"]
    return EpochCost(
        e, duration, {"src": rows}, {s: [rows] for s in steps}, {s: [rows] for s in steps},
        {s: ms for s in steps}, {s: 2 * ms for s in steps}, {s: 2 for s in steps},
        {s: rows for s in steps}, {"out": rows}, 1.0,
    )
