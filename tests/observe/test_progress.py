"""The progress reporter on hand-made records (no Spark): JSON lines as given, and a table that
flags replays and epochs over their trigger and explains the routing and the latest decisions."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from eddyline.observe.progress import ProgressReporter


def record(epoch: int, *, ms: float, replayed: bool = False) -> dict:
    return {
        "batchId": epoch, "replayed": replayed, "numInputRows": 12_500, "inputRowsPerSecond": 25_000.0,
        "processedRowsPerSecond": 50_000.0, "durationMs": {"triggerExecution": ms}, "triggerMs": 1000,
        "eventTime": {"watermark": "2026-01-01T00:00:05.000Z"},
        "stateOperators": [{"numRowsTotal": 2_000_000, "memoryUsedBytes": 3_500_000}],
        "lateRows": 3, "deadLetters": 1, "sinks": [{"description": "out", "numOutputRows": 42}],
        "routing": {"agg": {"version": 4, "lanes": 2, "keyGroupsPerLane": [10, 6], "spread": {}}},
        "load": {"agg": {"laneShareOfMakespan": [1.0, 0.5]}},
        "recentDecisions": [{"epoch": epoch, "step": "agg", "kind": "balance", "action": {"moves": [[3, 0, 1]]},
                             "why": {"policy": "one_way"}, "expected": {"makespanMs": 80.0}, "measured": None}],
    }


def test_json_lines_and_the_table(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    console = Console(record=True, width=220)
    with ProgressReporter(console=console, live=True, json_path=str(path)) as reporter:
        reporter.report(record(1, ms=400.0))
        reporter.report(record(2, ms=1500.0, replayed=True))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["batchId"] for x in lines] == [1, 2] and lines[1]["replayed"] is True
    text = console.export_text()
    assert "2 (replay)" in text
    assert "1.50s / 1.0s !" in text and "0.40s / 1.0s !" not in text  # only the epoch over its trigger
    assert "12.5K" in text and "2.0M" in text and "3.5" in text
    assert "00:00:05.000" in text
    assert "output rows this epoch: out=42" in text
    assert "agg: routing v4, 2 lanes, key groups per lane [10, 6], lane busy / makespan 1.00 0.50" in text
    assert "epoch 2 agg: balance moves=[[3, 0, 1]] · why: policy=one_way" in text and "measured pending" in text



def test_the_table_shows_control_commands_applied_and_refused() -> None:
    console = Console(record=True, width=220)
    with ProgressReporter(console=console, live=True) as reporter:
        reporter.report(record(1, ms=400.0) | {"refused": [{"id": "c1", "reason": "control top.k=0: too small"}]})
        reporter.report(record(2, ms=400.0) | {"applied": [{"id": "c2", "set": {"cheap.filter": "price > 5"}}]})
        reporter.report(record(3, ms=400.0) | {"applied": [
            {"id": "c3", "from": "rewrite", "reset": [], "network": "ab12", "rewrite": "pattern-pipeline-split"}]})
        reporter.report(record(4, ms=400.0) | {"applied": [{"id": "c4", "from": "cli", "replay": 2}]})
    text = console.export_text()
    assert "epoch 1: control c1 refused: control top.k=0: too small" in text
    assert "epoch 2: control c2 applied: cheap.filter = 'price > 5'" in text
    assert "epoch 3: control c3 applied: network rewritten by pattern-pipeline-split (ab12)" in text
    assert "epoch 4: control c4 applied: replayed from epoch 2" in text


def test_the_table_says_what_an_operators_routing_request_did() -> None:
    console = Console(record=True, width=220)
    rebalance = {"id": "c5", "from": "cli", "route": {"step": "agg", "rebalance": True}}
    with ProgressReporter(console=console, live=True) as reporter:
        reporter.report(record(5, ms=400.0) | {"applied": [rebalance], "recentDecisions": [], "decisions": []})
    assert "epoch 5: control c5 applied: rebalance of agg — nothing moved: no move of a key group" in console.export_text()
