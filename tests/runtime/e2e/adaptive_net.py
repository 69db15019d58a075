"""The adaptive network of the control-plane tests (a skewed generator, a window, a join, a dedup)
and the churn its control plane applies: random moves, a rescale schedule, a split hot key group."""

from __future__ import annotations

import json
from pathlib import Path

ROWS = 4_500


def network(out: Path, control: dict | None = None, *, lanes: int = 2) -> dict:
    bounded = {"rate": 500, "unpaced": True}
    spec = {
        "name": "adaptive", "trigger": 0, "lanes": lanes, "key_groups": 16,
        "sources": [
            {"name": "clicks", "generator": {**bounded, "keys": 200, "skew": 1.2, "seed": 5}, "limit": ROWS,
             "max_rows_per_epoch": 750},
            {"name": "auction", "nexmark": {"stream": "auction", **bounded, "hot_auction_ratio": 1}, "limit": ROWS,
             "max_rows_per_epoch": 750},
            {"name": "bid", "nexmark": {"stream": "bid", **bounded}, "limit": ROWS, "max_rows_per_epoch": 750},
        ],
        "steps": [
            {"name": "per_key", "input": "clicks", "window_aggregate": {
                "key": "key", "time": "event_time", "window": {"size": "2s"},
                "aggregates": {"n": "count(*)", "total": "sum(value)"}}},
            {"name": "first_seen", "input": "clicks", "dedup": {"key": "key", "time": "event_time", "ttl": "3s"}},
            {"name": "bids_in_auction", "join": {
                "left": "auction", "right": "bid", "left_key": "id", "right_key": "auction", "kind": "interval",
                "left_time": "date_time", "left_end": "expires", "right_time": "date_time"}},
            {"name": "pairs", "input": "bids_in_auction", "select": ["id", "bidder", "price", "date_time_right AS bid_time"]},
        ],
        "sinks": [
            {"name": "windows", "input": "per_key", "files": {"path": str(out / "windows")}},
            {"name": "firsts", "input": "first_seen", "files": {"path": str(out / "firsts")}},
            {"name": "pairs_out", "input": "pairs", "files": {"path": str(out / "pairs")}},
        ],
    }
    if control is not None:
        spec["control"] = control
    return spec


#: Relocate 3 random key groups of every step every epoch, rescale 2 → 3 → 1 lanes, split the
#: join's hottest key groups: on schedule at epoch 3, and by the hot-key detector afterwards.
CHURN = {
    "chaos": {"random_moves": 3, "seed": 11},
    "scale": {"schedule": {3: 3, 5: 1}, "auto": False, "max_lanes": 3},
    "spread": {"schedule": {2: [0, 5]}, "fanout": 3, "hot_share": 0.3},
}


def plans(ckpt: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((ckpt / "plans").glob("*.json"))]
