"""What the dashboard's tests draw from: a small network and hand-made progress records."""

from __future__ import annotations

from eddyline.api.validate import load_spec

NET = load_spec({
    "name": "shop", "key_groups": 8, "lanes": 2,
    "sources": [{"name": "bids", "generator": {}}, {"name": "asks", "generator": {}}],
    "steps": [
        {"name": "cheap", "input": "bids", "filter": "value < 500"},
        {"name": "per_key", "input": "cheap", "aggregate": {"key": "key", "aggregates": {"n": "count(*)"}}},
        {"name": "fresh", "input": "asks", "dedup": {"key": "key", "time": "event_time", "ttl": "1m"}},
    ],
    "sinks": [{"name": "counts", "input": "per_key", "memory": {}}, {"name": "firsts", "input": "fresh", "memory": {}}],
    "control": {"scale": {"auto": False}},
})


def record(epoch: int, busy: dict[str, list[float]], decisions: list[dict] | None = None) -> dict:
    return {
        "batchId": epoch, "numInputRows": 2000, "durationMs": {"triggerExecution": 500.0, "planning": 100.0,
                                                                "execution": 300.0, "publish": 50.0, "commit": 40.0,
                                                                "cleanup": 10.0},
        "eventTime": {"watermark": "2026-01-01T00:00:05.000Z"}, "deadLetters": 0, "lateRows": 0,
        "sources": [{"description": "bids", "numInputRows": 1500}, {"description": "asks", "numInputRows": 500}],
        "sinks": [{"description": "counts", "numOutputRows": 10}, {"description": "firsts", "numOutputRows": 5}],
        "stateOperators": [{"operatorName": s, "numRowsTotal": 10, "numRowsUpdated": 100, "memoryUsedBytes": 1000}
                           for s in busy],
        "routing": {s: {"version": epoch, "lanes": 2, "keyGroupsPerLane": [4, 4], "assignment": [0, 0, 0, 0, 1, 1, 1, 1],
                        "spread": {"3": [0, 1]}} for s in busy},
        "load": {s: {"laneBusyMs": b} for s, b in busy.items()},
        "decisions": decisions or [], "recentDecisions": decisions or [], "backlog": {"bids": 0, "asks": 0},
    }
