"""State larger than the lane's memory budget: processed in slices, memory stays bounded.

Each run is its own ``eddyline run`` process (fresh Python workers), so the workers' memory
readings are not shaped by earlier tests. An unbounded join keeps every row; with a budget a
quarter of one lane's state, the lanes work through their key groups slice by slice and spill the
rest to disk. Memory is the workers' anonymous resident memory (``RssAnon``: the heap; state files
are memory-mapped, so their pages are file cache the OS can drop), as each lane samples it after
receiving its input and after every slice.

The run without a budget is on resident lanes (``execution: resident``); the bounded run is
its first epochs as Spark jobs, the rest on resident lanes, which keep to the same budget: the
output is the same whatever ran each epoch. A resident lane serves every epoch from one process
and says what its heap held after each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import read

BUDGET = 2 << 20  # bytes per lane


JOB_EPOCHS = 5  # of the bounded run's ten; the rest resident


def network(out: Path, budget: int | None) -> dict:
    g = {"rate": 1000, "keys": 2_000_000, "unpaced": True}
    spec: dict = {
        "name": "spill", "trigger": 0, "lanes": 2, "key_groups": 64,
        "sources": [
            {"name": "a", "generator": {**g, "seed": 1}, "limit": 100_000, "max_rows_per_epoch": 10_000},
            {"name": "b", "generator": {**g, "seed": 2}, "limit": 100_000, "max_rows_per_epoch": 10_000},
        ],
        "steps": [{"name": "j", "join": {"left": "a", "right": "b", "left_key": "key", "right_key": "key"}}],
        "sinks": [{"name": "pairs", "input": "j", "files": {"path": str(out / "pairs")}}],
    }
    if budget is not None:
        spec["control"] = {"state_budget": budget}
    return spec


def run(tmp: Path, name: str, budget: int | None, execution: str = "job", epochs: int | None = None,
        ) -> tuple[list[dict], list[dict]]:
    """The run's per-epoch lanes' manifests (resident lanes leave none) and its progress records."""
    spec_file = tmp / f"{name}-{execution}.yaml"
    spec_file.write_text(yaml.safe_dump({**network(tmp / name, budget), "execution": execution}))
    progress = tmp / f"{name}-{execution}.jsonl"
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec_file), "--checkpoint", str(tmp / f"{name}-ckpt"),
           *(["--epochs", str(epochs)] if epochs else ["--until-idle"]),
           "--no-live", "--master", "local[2]", "--progress-json", str(progress)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    manifests = [json.loads(p.read_text()) for p in sorted((tmp / f"{name}-ckpt" / "epochs").glob("*/j/lane-*.json"))]
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    assert {r["execution"]["mode"] for r in records} == {execution}
    return manifests, records


@pytest.mark.slow
def test_state_four_times_the_budget_stays_within_it(tmp_path: Path) -> None:
    _, free_records = run(tmp_path, "free", None, "resident")
    bounded, first = run(tmp_path, "bounded", BUDGET, "job", JOB_EPOCHS)
    _, records = run(tmp_path, "bounded", BUDGET, "resident")
    assert len(first) == JOB_EPOCHS and len(records) >= 4

    assert read(tmp_path / "bounded", "pairs") == read(tmp_path / "free", "pairs")
    assert len(read(tmp_path / "free", "pairs")) > 100

    # the premise: a lane's state is 4x its budget at the end, 2x when the Spark jobs hand over
    lane_state = free_records[-1]["stateOperators"][0]["memoryUsedBytes"] // 2
    assert lane_state >= 4 * BUDGET, lane_state
    assert max(m["state_bytes"] for m in bounded) >= 2 * BUDGET

    def growth(ms: list[dict]) -> int:
        """How far the workers' heap grew beyond what they needed while a lane's state still fit
        the budget (the first epochs): that part is the state's, not the interpreter's or the
        kernel's working memory for an epoch's input."""
        early = [m["memory"]["peak"]["anon"] for m in ms if m["state_bytes"] <= BUDGET]
        assert early, "the first epochs should hold less state than the budget"
        return max(m["memory"]["peak"]["anon"] for m in ms) - max(early)

    def lanes(rs: list[dict]) -> list[dict]:  # (a resident run's manifests are in its progress)
        return [{"state_bytes": r["stateOperators"][0]["memoryUsedBytes"] // 2, "memory": m}
                for r in rs for m in r["stateOperators"][0]["customMetrics"]["laneMemory"]]

    # Without a budget a lane holds all its state at once, and the reading shows it ...
    assert growth(lanes(free_records)) >= lane_state, (growth(lanes(free_records)), lane_state)
    # ... with one, the lanes worked in slices, and the heap grew by less than the budget.
    assert max(m["slices"] for m in bounded) >= 4
    assert growth(bounded) <= BUDGET, (growth(bounded), BUDGET)
    # So did the resident lanes, which took the state from there to four times the budget: a lane
    # without a budget held a lane's state more than one with.
    def peaks(rs: list[dict]) -> list[int]:
        memory = [r["stateOperators"][0]["customMetrics"]["laneMemory"] for r in rs]
        return [max(m[lane]["peak"]["anon"] for m in memory) for lane in range(2)]

    for lane, (held, sliced) in enumerate(zip(peaks(free_records), peaks(records), strict=True)):
        assert held - sliced >= lane_state, (lane, held, sliced, lane_state)
    # Spilled state and slices are reported in the progress output.
    last = records[-1]["stateOperators"][0]["customMetrics"]
    assert last["spilledBytes"] >= lane_state
    assert max(r["stateOperators"][0]["customMetrics"]["stateSlices"] for r in records) >= 8
    # Each lane also reports the time its worker's garbage collector took.
    assert sum(m["gc"]["collections"] for m in bounded) > 0
    last = first[-1]["stateOperators"][0]["customMetrics"]
    assert last["laneGc"] and all(g["ms"] >= 0 for g in last["laneGc"])
    # ... and its task thread's CPU time, which one thread cannot spend faster than the clock.
    assert sum(m["cpu_ms"]["kernel"] for m in bounded) > 0
    for m in bounded:
        assert m["cpu_ms"]["kernel"] <= m["ms"]["kernel"] + 1.0, m
        assert m["cpu_ms"]["kernel"] <= m["cpu_ms"]["lane"], m
        assert m["warming_at_start"] in (True, False)
    assert len(last["laneCpuMs"]) == len(last["laneGc"]) == 2
