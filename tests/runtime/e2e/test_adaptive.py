"""The control plane during a run: moves, rescales and hot-key splits must not change the output.

One network with three kinds of state (a window aggregate over skewed keys, an interval join of
Nexmark auctions and bids, a dedup) runs once with static routing and once while the control plane
relocates random key groups every epoch, rescales 2 → 3 → 1 lanes, and splits hot join key groups
(SPREADFIRE). Both runs must write exactly the same rows; the adaptive run must really have moved,
rescaled and split (read back from its logged epoch plans).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.runtime.engine import Engine

from .adaptive_net import CHURN, network, plans
from .helpers import read


def test_moves_rescales_and_splits_leave_the_output_unchanged(spark, tmp_path: Path) -> None:
    """(The static run on resident lanes, the adaptive one as Spark jobs: the same output.)"""
    ref = Engine(load_spec({**network(tmp_path / "ref"), "execution": "resident"}), spark, str(tmp_path / "ref-ckpt"))
    ref.run(until_idle=True)
    assert ref.executor.mode == "resident"
    Engine(load_spec(network(tmp_path / "out", CHURN)), spark, str(tmp_path / "ckpt")).run(until_idle=True)

    for what in ("windows", "firsts", "pairs"):
        want = read(tmp_path / "ref", what)
        assert len(want) > 100, what
        assert read(tmp_path / "out", what) == want, what

    logged = plans(tmp_path / "ckpt")
    kinds = [d["kind"] for p in logged for d in p["decisions"]]
    assert kinds.count("chaos") >= 3 * 4, kinds  # every epoch while there are 2 or 3 lanes
    lanes = [p["routing"]["per_key"]["lanes"] for p in logged]
    assert lanes[:2] == [2, 2] and lanes[2:4] == [3, 3] and lanes[-1] == 1, lanes
    spread = [p["routing"]["bids_in_auction"].get("spread", {}) for p in logged]
    assert {"0", "5"} <= set(spread[1]), spread[:4]
    assert any(d["kind"] == "spread" and d["why"]["reason"] == "schedule" for p in logged for d in p["decisions"])


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_move_replays_it(spark, tmp_path: Path) -> None:
    """Crash inside a lane in an epoch that relocates, rescales and splits; the restart replays
    the logged plan (the same moves) and the output equals a static run's. The restarts change
    mode: the epoch cut in a Spark job is replayed on resident lanes (three task slots, for the
    three lanes), which split the join's hot key groups, move and rescale as the jobs did, and
    the epoch cut in their commit is replayed by a job."""
    Engine(load_spec(network(tmp_path / "ref")), spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)
    spec_file = tmp_path / "net.yaml"
    ckpt = tmp_path / "ckpt"

    def run(execution: str, *extra: str, slots: int = 2) -> subprocess.CompletedProcess:
        spec_file.write_text(yaml.safe_dump({**network(tmp_path / "out", CHURN), "execution": execution}))
        cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec_file), "--checkpoint", str(ckpt), "--until-idle",
               "--no-live", "--master", f"local[{slots}]", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=400)

    first = run("job", "--crash-at", "3:in_task")  # the rescale 2 → 3 epoch, state half written
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    moving = json.loads((ckpt / "plans" / f"{3:010d}.json").read_text())
    assert {d["kind"] for d in moving["decisions"]} >= {"rescale", "chaos"}
    assert moving["routing"]["bids_in_auction"].get("spread")  # split at epoch 2
    second = run("resident", "--crash-at", "5:mid_commit", slots=3)  # the rescale 3 → 1 epoch, dies while committing
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert list((ckpt / "resident").glob("attempt-*")), second.stderr[-2000:]  # (its stage claimed an attempt)
    last = run("job")
    assert last.returncode == 0, last.stderr[-2000:]
    assert json.loads((ckpt / "plans" / f"{3:010d}.json").read_text())["routing"] == moving["routing"]
    for what in ("windows", "firsts", "pairs"):
        assert read(tmp_path / "out", what) == read(tmp_path / "ref", what), what


def test_the_adaptive_example_runs_and_explains_itself(spark, tmp_path: Path) -> None:
    """examples/adaptive-join.yaml for a few epochs (paced sources, so only a few seconds)."""
    from rich.console import Console

    from eddyline.observe.progress import ProgressReporter

    raw = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples" / "adaptive-join.yaml").read_text())
    raw["sinks"][0]["files"]["path"] = str(tmp_path / "out")
    raw["control"]["overload"]["shed_sink"]["path"] = str(tmp_path / "shed")
    raw["control"]["chaos"] = {"random_moves": 1, "every": 2}  # make sure there are decisions to show
    progress = tmp_path / "progress.jsonl"
    console = Console(record=True, width=200)
    with ProgressReporter(live=False, json_path=str(progress), console=console) as reporter:
        Engine(load_spec(raw), spark, str(tmp_path / "ckpt"), reporter=reporter).run(epochs=5)
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    assert len(records) == 5
    last = records[-1]
    assert set(last["routing"]) == {"bids_while_open", "per_auction"}
    assert len(last["load"]["bids_while_open"]["laneShareOfMakespan"]) == last["routing"]["bids_while_open"]["lanes"]
    assert last["overload"]["boundMs"] == 3000 and "quality" in last["overload"]
    moves = [d for r in records for d in r["decisions"] if d["kind"] == "chaos"]
    assert moves and all(d["why"]["reason"] == "relocation drill" for d in moves)
    measured = [d for d in last["recentDecisions"] if d.get("measured")]
    assert measured and "makespanMs" in measured[0]["measured"]
    # the terminal shows the routing and the latest decisions
    console.print(reporter._render())
    text = console.export_text()
    assert "bids_while_open: routing v" in text and "chaos" in text


@pytest.mark.parametrize("query", ["dedup", "pattern"])
def test_lookahead_moves_key_groups_before_the_epoch_that_works_on_the_hot_keys(spark, tmp_path: Path, query: str) -> None:
    """Parquet files, one per epoch: three with uniform keys, then three whose keys all lie in
    lane 0's key groups. With ``balance.lookahead`` the balancer reads epoch 4's keys before it
    runs. A dedup works on its rows as they arrive: the moves to lane 1 come in epoch 4 itself.
    A pattern holds each epoch's rows until the next epoch's watermark (the last epoch's largest
    time) passes them: epoch 4 still works on epoch 3's uniform rows, so nothing moves then; the
    moves come in epoch 5, for the hot rows the lanes hold. The output equals a run with static
    routing."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eddyline.operators.shed import spark_xxhash64

    groups, rows = 16, 2_000
    candidates = np.arange(1, 400, dtype=np.int64)
    lane0 = candidates[np.mod(spark_xxhash64(candidates), groups) < groups // 2]  # uniform table: lane 0
    rng = np.random.default_rng(3)
    data = tmp_path / "in"
    data.mkdir()
    for f in range(6):
        keys = rng.choice(candidates if f < 3 else lane0, rows)
        ms = 1_767_225_600_000 + f * 2_000 + np.sort(rng.integers(0, 2_000, rows))
        pq.write_table(pa.table({"key": pa.array(keys, pa.int64()),
                                 "t": pa.array(ms.astype("datetime64[ms]"), pa.timestamp("ms")),
                                 "value": pa.array(rng.integers(0, 10, rows), pa.int64())}),
                       str(data / f"{f:03d}.parquet"))
    step = ({"dedup": {"key": "key", "time": "t", "ttl": "1s"}} if query == "dedup" else
            {"pattern": {"key": "key", "time": "t", "within": "3s", "factory": "eddyline.operators.pattern:tick_pattern",
                         "args": {"value_col": "value"}}})

    def run(name: str, control: dict | None) -> list[dict]:
        spec = {
            "name": name, "trigger": 0, "lanes": 2, "key_groups": groups,
            "sources": [{"name": "events", "files": {"path": str(data), "format": "parquet", "max_files_per_epoch": 1}}],
            "steps": [{"name": "some", "input": "events", "filter": "key <> 1"},  # the look-ahead sees through it
                      {"name": "firsts", "input": "some", **step}],
            "sinks": [{"name": "out", "input": "firsts", "files": {"path": str(tmp_path / name / "firsts")}}],
            **({"control": control} if control else {}),
        }
        Engine(load_spec(spec), spark, str(tmp_path / name / "ckpt")).run(epochs=6)
        return plans(tmp_path / name / "ckpt")

    control = {"placement": "uniform", "balance": {"threshold": 0.2, "period": 1, "patience": 1, "max_moves": 8,
                                                   "cooldown": 0, "lookahead": True}}
    logged = run("ahead", control)
    run("static", None)
    balance = [d for p in logged for d in p["decisions"] if d["kind"] == "balance"]
    first = 4 if query == "dedup" else 5
    assert balance and balance[0]["epoch"] == first and "lookahead" in balance[0]["why"], balance
    ahead = balance[0]["why"]["lookahead"]
    assert ahead["rows"] == rows  # what the source holds, before the filter
    if query == "pattern":  # the work foreseen: epoch 4's hot rows, held by the lanes (key 1 filtered out)
        # (a row at exactly the watermark is held one more epoch, so the work is a little less)
        assert 0.9 * rows < ahead["heldRows"] <= rows and 0.98 * ahead["heldRows"] <= ahead["workRows"] <= ahead["heldRows"]
    owners = logged[first - 1]["routing"]["firsts"]["assignment"]  # the epoch runs with the moves
    hot = np.bincount(np.mod(spark_xxhash64(lane0), groups), minlength=groups)
    assert sum(hot[g] for g in range(groups) if owners[g] == 1) > 0  # some of the hot groups moved away
    assert read(tmp_path / "ahead", "firsts") == read(tmp_path / "static", "firsts")
    if query == "pattern":
        assert read(tmp_path / "ahead", "firsts")  # the pattern matched something to compare
        # the lanes hand the kernel's own count of its work per key group to the statistics
        import json

        manifests = sorted((tmp_path / "ahead" / "ckpt" / "epochs").glob("*/firsts/lane-*.json"))
        costs = [json.loads(m.read_text()).get("kg_cost", {}) for m in manifests]
        assert manifests and sum(sum(c.values()) for c in costs) > 0, manifests


def test_a_hot_key_reaches_its_window_lane_as_one_partial_row_per_window(spark, tmp_path: Path, monkeypatch) -> None:
    """SPREADFIRE's window case without a split: the JVM aggregates every (key group, key, window)
    before the lane shuffle, so a key with 90 % of the rows sends its lane one row per window and
    epoch, however hot it is. Each epoch's lanes together receive exactly the epoch's distinct
    (key, window) pairs, and the windows equal DuckDB's. (Epochs of a few thousand rows, as here,
    skip the combining stage once the one before was small: every epoch is taken as large.)"""
    import duckdb

    from eddyline.runtime.epoch import execute

    monkeypatch.setattr(execute, "SMALL_EPOCH_ROWS", -1)
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    data, files, rows = tmp_path / "in", 3, 3_000
    data.mkdir()
    for f in range(files):
        keys = np.where(rng.random(rows) < 0.9, 7, rng.integers(100, 150, rows))
        ms = 1_767_225_600_000 + f * 3_000 + np.sort(rng.integers(0, 3_000, rows))
        pq.write_table(pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array(rng.integers(0, 100, rows)),
                                 "t": pa.array(ms.astype("datetime64[ms]"), pa.timestamp("ms"))}),
                       str(data / f"{f:03d}.parquet"))
    spec = {
        "name": "hot-windows", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "events", "files": {"path": str(data), "format": "parquet", "max_files_per_epoch": 1}}],
        "steps": [{"name": "per_key", "input": "events", "window_aggregate": {
            "key": "key", "time": "t", "window": {"size": "1s"}, "aggregates": {"n": "count(*)", "total": "sum(value)"}}}],
        "sinks": [{"name": "out", "input": "per_key", "files": {"path": str(tmp_path / "out")}}],
    }
    Engine(load_spec(spec), spark, str(tmp_path / "ckpt")).run(until_idle=True)

    con = duckdb.connect()
    for f in range(files):
        lanes = [json.loads(p.read_text()) for p in sorted((tmp_path / "ckpt" / "epochs" / f"{f + 1:010d}" / "per_key").glob("lane-*.json"))]
        pairs = con.execute(f"SELECT count(DISTINCT (key, epoch_ms(t) // 1000)) FROM read_parquet('{data}/{f:03d}.parquet')").fetchone()[0]
        assert sum(m["input_rows"] for m in lanes) == pairs < 200  # of 3,000 rows, 2,700 of them key 7's
    got = con.execute(f"SELECT key, epoch_ms(window_start), n, total FROM read_parquet('{tmp_path}/out/epoch=*/*.parquet') ORDER BY ALL").fetchall()
    want = con.execute(f"SELECT key, epoch_ms(t) // 1000 * 1000 AS ws, count(*), sum(value) FROM read_parquet('{data}/*.parquet') GROUP BY ALL ORDER BY ALL").fetchall()
    assert got == want and len(want) > 100
