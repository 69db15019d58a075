"""While it waits for input, the engine keeps Spark's Python workers alive.

PySpark stops a Python worker idle for a minute, and the next epoch starts new ones (imports
again, and the lanes' state cache is gone). The real interval is 40 s; these runs shorten it so
the keep-alive happens within a test.
"""

from __future__ import annotations

import json
from pathlib import Path

from eddyline.runtime.engine import Engine
from tests.runtime.e2e.helpers import bids_window_spec, write_bid_files


def _lane_pids(checkpoint: Path) -> set[int]:
    return {json.loads(p.read_text())["pid"] for p in checkpoint.glob("epochs/*/per_auction/lane-*.json")}


def test_an_idle_engine_runs_its_keep_alive_in_the_lanes_python_workers(spark, tmp_path):
    write_bid_files(tmp_path / "in", files=2, rows=200)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out", files_per_epoch=2)
    first = Engine(spec, spark, str(tmp_path / "ckpt"), worker_keepalive_s=0.5).run(until_idle=True)
    assert first.epochs >= 1 and first.input_rows > 0 and first.worker_keepalives == 0
    # the same query again: its input is all read, so it waits (a first epoch in a cold process
    # can take seconds, which is why the input is read in a run of its own)
    engine = Engine(spec, spark, str(tmp_path / "ckpt"), worker_keepalive_s=0.5)
    summary = engine.run(duration_s=2.5)

    assert summary.epochs == 0
    assert summary.worker_keepalives >= 2, summary
    lanes = _lane_pids(tmp_path / "ckpt")
    assert lanes, "the lanes wrote no manifests"
    # the keep-alive reached the processes that ran the lanes, whose state cache it keeps
    assert set(engine.kept_warm_pids) & lanes, (engine.kept_warm_pids, lanes)
