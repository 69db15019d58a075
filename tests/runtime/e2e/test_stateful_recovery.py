"""A pattern query and a join query end to end; then crashes with restarts at other lane counts,
alternating between per-epoch jobs and resident lanes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.eventtime import END_OF_STREAM
from eddyline.io.generator import Generator, generator_frame
from eddyline.operators.pattern import PatternKernel, tick_pattern
from eddyline.runtime.engine import Engine

from .helpers import MEASURES, normal, read

TICKS = 4_000


def network(out: Path) -> dict:
    """Ticks of 25 symbols through the tick pattern, and Nexmark auctions joined with their bids."""
    bounded = {"rate": 400, "unpaced": True}
    return {
        "name": "stateful", "trigger": 0, "lanes": 2, "key_groups": 32,
        "sources": [
            {"name": "ticks", "generator": {**bounded, "keys": 25, "seed": 3}, "limit": TICKS, "max_rows_per_epoch": 800},
            {"name": "auction", "nexmark": {"stream": "auction", **bounded}, "limit": TICKS, "max_rows_per_epoch": 800},
            {"name": "bid", "nexmark": {"stream": "bid", **bounded}, "limit": TICKS, "max_rows_per_epoch": 800},
        ],
        "steps": [
            {"name": "ticks_found", "input": "ticks", "pattern": {
                "key": "key", "time": "event_time", "within": "30s",
                "factory": "eddyline.operators.pattern:tick_pattern", "args": {"value_col": "value"},
                "measures": MEASURES}},
            {"name": "bids_in_auction", "join": {
                "left": "auction", "right": "bid", "left_key": "id", "right_key": "auction", "kind": "interval",
                "left_time": "date_time", "left_end": "expires", "right_time": "date_time"}},
            {"name": "pairs", "input": "bids_in_auction", "select": ["id", "bidder", "price", "date_time_right AS bid_time"]},
        ],
        "sinks": [
            {"name": "matches", "input": "ticks_found", "files": {"path": str(out / "matches")}},
            {"name": "pairs_out", "input": "pairs", "files": {"path": str(out / "pairs")}},
        ],
    }






def test_pattern_and_join_queries_are_exact(spark, tmp_path: Path) -> None:
    spec = load_spec(network(tmp_path / "out"))
    Engine(spec, spark, str(tmp_path / "ckpt")).run(until_idle=True)

    # the pattern: the pure kernel on all ticks at once (itself checked against a brute-force matcher)
    ticks = generator_frame(spark, Generator(rate=400, unpaced=True, keys=25, seed=3), 0, TICKS, 2).toArrow()
    kernel = PatternKernel(ticks.schema, ("key",), "event_time", tick_pattern("value"), 30_000,
                           {k: tuple(v) for k, v in MEASURES.items()})
    batch = ticks.append_column("_kg", pa.array([0] * ticks.num_rows, pa.int32()))
    want = kernel.process(batch, None, END_OF_STREAM).output
    con = duckdb.connect()
    con.register("want", want)
    assert len(want) > 50
    assert read(tmp_path / "out", "matches") == normal(con.execute("SELECT * FROM want").fetchall())

    # the join: DuckDB over the same events
    from eddyline.io.nexmark import Nexmark, nexmark_frame

    for s in ("auction", "bid"):
        con.register(s, nexmark_frame(spark, Nexmark(stream=s, rate=400, unpaced=True), 0, TICKS, 2).toArrow())
    pairs = normal(con.execute(
        "SELECT A.id, B.bidder, B.price, B.date_time FROM auction A JOIN bid B ON A.id = B.auction "
        "AND B.date_time BETWEEN A.date_time AND A.expires"
    ).fetchall())
    assert len(pairs) > 100
    assert read(tmp_path / "out", "pairs") == pairs


@pytest.mark.slow
def test_crash_and_restore_at_other_lane_counts(spark, tmp_path: Path) -> None:
    ref = load_spec(network(tmp_path / "ref"))
    Engine(ref, spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)

    specs = {}
    for mode in ("job", "resident"):
        specs[mode] = tmp_path / f"net-{mode}.yaml"
        specs[mode].write_text(yaml.safe_dump({**network(tmp_path / "out"), "execution": mode}))
    ckpt = tmp_path / "ckpt"

    def run(mode: str, *extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "eddyline.cli", "run", str(specs[mode]), "--checkpoint", str(ckpt), "--until-idle",
               "--no-live", "--master", "local[2]", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=400)

    # each run in the other mode: the pattern's and the join's state pass from per-epoch jobs to
    # resident lanes and back, and each run replays what a run of the other mode left (three
    # resident lanes would need three task slots: the 3-lane run is a job run)
    first = run("job", "--lanes", "2", "--crash-at", "2:in_task")  # dies inside a lane, state half written
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    second = run("resident", "--lanes", "1", "--crash-at", "4:mid_commit")  # replays epoch 2 on its 2 lanes, dies committing 4
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert len(list((ckpt / "resident").iterdir())) >= 2  # (a stage for the replay on 2 lanes, one on 1)
    last = run("job", "--lanes", "3")
    assert last.returncode == 0, last.stderr[-2000:]
    assert "replayed" in last.stdout
    for what in ("matches", "pairs"):
        assert read(tmp_path / "out", what) == read(tmp_path / "ref", what), what


def test_pattern_pipeline_split_across_two_stages_equals_one_step(spark, tmp_path: Path) -> None:
    """AnduIN's P+ = P v (P P+) as two engine steps (stage 1 emits seeds, stage 2 extends them):
    the same matches as the single pattern step, at each split point."""
    raw = network(tmp_path / "single")
    raw["steps"] = raw["steps"][:1]
    raw["sinks"] = raw["sinks"][:1]
    raw["sources"] = raw["sources"][:1]
    Engine(load_spec(raw), spark, str(tmp_path / "ck-single")).run(until_idle=True)
    single = read(tmp_path / "single", "matches")
    assert len(single) > 50
    for at in ("B", "D"):
        split = network(tmp_path / f"split-{at}")
        pattern = split["steps"][0]["pattern"]
        split["sources"] = split["sources"][:1]
        split["steps"] = [
            {"name": "stage1", "input": "ticks", "pattern": {**pattern, "split": {"stage": 1, "at": at}}},
            {"name": "ticks_found", "input": "ticks",
             "pattern": {**pattern, "split": {"stage": 2, "at": at}, "seeds": "stage1"}},
        ]
        split["sinks"] = split["sinks"][:1]
        Engine(load_spec(split), spark, str(tmp_path / f"ck-{at}"), lanes=3).run(until_idle=True)
        assert read(tmp_path / f"split-{at}", "matches") == single, at
