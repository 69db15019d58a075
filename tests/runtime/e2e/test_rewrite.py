"""Graph rewriting while running, on local Spark (eddyline.kinds.rewrite, eddyline.control.hotspot):
a pattern step whose hot key saturates its lane gets AnduIN's pipeline split at an epoch boundary,
the two stages start from the step's state, and the matches are exactly those of the step
unsplit — also when the driver dies as the rewrite takes effect. The decision says why, what it
expected and what was measured; ``explain --checkpoint`` shows the rewritten plan."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from eddyline.api.validate import load_spec
from eddyline.cli import app
from eddyline.eventtime import END_OF_STREAM
from eddyline.io.generator import Generator, generator_frame
from eddyline.operators.pattern import PatternKernel, tick_pattern
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.faults import FaultPoint
from eddyline.runtime.inbox import Inbox

from .helpers import MEASURES, Crash, CrashAt, normal, read

TICKS = 3_000
TICKS_SOURCE = {"rate": 200, "unpaced": True, "keys": 6, "skew": 2.0, "seed": 5}


def network(out: Path, rewrite: dict) -> dict:
    return {
        "name": "rewriting", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "ticks", "generator": TICKS_SOURCE, "limit": TICKS, "max_rows_per_epoch": 500}],
        "steps": [{"name": "found", "input": "ticks", "pattern": {
            "key": "key", "time": "event_time", "within": "20s",
            "factory": "eddyline.operators.pattern:tick_pattern",
            "args": {"value_col": "value", "contiguity": "skip_till_next_match"}, "measures": MEASURES}}],
        "sinks": [{"name": "matches", "input": "found", "files": {"path": str(out / "matches")}}],
        "control": {"load": "rows", "rewrite": rewrite},
    }


@pytest.fixture(scope="module")
def reference(spark) -> list[tuple]:
    """The pure kernel over every tick at once (itself checked against a brute-force matcher)."""
    ticks = generator_frame(spark, Generator(**TICKS_SOURCE), 0, TICKS, 2).toArrow()
    kernel = PatternKernel(ticks.schema, ("key",), "event_time", tick_pattern("value", "skip_till_next_match"), 20_000,
                           {k: tuple(v) for k, v in MEASURES.items()})
    batch = ticks.append_column("_kg", pa.array([0] * ticks.num_rows, pa.int32()))
    con = duckdb.connect()
    con.register("want", kernel.process(batch, None, END_OF_STREAM).output)
    want = normal(con.execute("SELECT * FROM want").fetchall())
    assert len(want) > 100
    return want


def rewrites(ckpt: str) -> list[tuple[int, dict]]:
    ck = Checkpoint(ckpt)
    return [(e, a) for e in range(1, ck.latest_commit().epoch + 1) for a in ck.read_plan(e).applied if "rewrite" in a]


def test_a_planned_split_across_a_crash_keeps_every_match(spark, tmp_path: Path, reference: list[tuple]) -> None:
    spec, ckpt = load_spec(network(tmp_path / "out", {"auto": False, "schedule": {3: ["found"]}})), str(tmp_path / "ckpt")
    with pytest.raises(Crash):  # the rewritten epoch ran (the stages wrote state), nothing published
        Engine(spec, spark, ckpt, faults=CrashAt(3, FaultPoint.AFTER_STAGE)).run(until_idle=True)
    Engine(spec, spark, ckpt).run(until_idle=True)  # restarted as first started: goes on split

    assert read(tmp_path / "out", "matches") == reference
    ck = Checkpoint(ckpt)
    assert [(e, a["rewrite"]) for e, a in rewrites(ckpt)] == [(3, "pattern-pipeline-split")]
    assert set(ck.latest_commit().steps) == {"found", "found_stage1"}
    assert ck.metadata()["rewrites"][0]["step"] == "found" and ck.metadata()["applied"]["inherit"] == {"found_stage1": "found"}
    made = [d for d in ck.latest_commit().control["manager"]["decisions"] if d["kind"] == "rewrite"]
    assert made and made[0]["epoch"] == 3 and made[0]["why"]["reason"] == "schedule"
    assert set(made[0]["measured"]["steps"]) == {"found", "found_stage1"}
    # its new step took its state over at that boundary: a replay may not go back before it
    refused = Inbox(ckpt).submit_command({"replay": 3})
    Engine(spec, spark, ckpt).run(until_idle=True)
    (done,) = [d for d in Inbox(ckpt).done() if d["id"] == refused]
    assert done["outcome"] == "refused"
    assert done["reason"] == "replay: rule pattern-pipeline-split rewrote step 'found' at epoch 3; a replay can go back to epoch 4 at the earliest"
    # the rewritten plan, from the checkpoint
    shown = CliRunner().invoke(app, ["explain", str(tmp_path / "net.json"), "--checkpoint", ckpt, "--no-spark-plan"])
    assert shown.exit_code == 2  # no such file: the spec is read first
    (tmp_path / "net.json").write_text(json.dumps(network(tmp_path / "out", {"auto": False})))
    shown = CliRunner().invoke(app, ["explain", str(tmp_path / "net.json"), "--checkpoint", ckpt, "--no-spark-plan"])
    assert shown.exit_code == 0, shown.output
    assert "found_stage1 ← ticks: pattern" in shown.output and "rewritten at epoch 3 by pattern-pipeline-split" in shown.output


def test_the_hot_spot_detector_splits_a_saturated_pattern_step(spark, tmp_path: Path, reference: list[tuple]) -> None:
    ckpt = str(tmp_path / "ckpt")
    # saturation 0: any busy time counts (how busy an epoch is depends on the machine; the unit
    # tests of the detector check the threshold), the rows decide the hot key group
    spec = load_spec(network(tmp_path / "out", {"saturation": 0.0, "patience": 2}))
    Engine(spec, spark, ckpt).run(until_idle=True)

    assert read(tmp_path / "out", "matches") == reference
    (epoch, applied), = rewrites(ckpt)
    assert epoch == 4 and applied["from"] == "rewrite"  # after two epochs (the first has no time base)
    made = next(d for d in Checkpoint(ckpt).latest_commit().control["manager"]["decisions"] if d["kind"] == "rewrite")
    seen = made["why"]["epochs"]
    assert made["why"]["reason"] == "hot spot" and [s["epoch"] for s in seen] == [2, 3]
    assert all(s["hotShareOfFairLane"] > 1.2 and s["makespanMs"] > 0 for s in seen)
    assert made["expected"]["makespanMs"] > 0 and made["measured"]["makespanMs"] > 0
    assert [d["outcome"] for d in Inbox(ckpt).done()] == ["applied"]


def aggregate_network(out: Path, rewrite: dict, revised: bool = False) -> dict:
    aggregates = {"n": "count(*)", "total": "sum(value)", "mean": "avg(value)", "low": "min(value)", "high": "max(value)"}
    if not revised:
        aggregates["latest"] = "last(value)"
    return {
        "name": "rewriting-aggregate", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "ticks", "generator": TICKS_SOURCE, "limit": TICKS, "max_rows_per_epoch": 500}],
        "steps": [
            {"name": "shown", "input": "ticks", "select": ["key", "value", "event_time"]
             + (["CASE WHEN value % 7 = 0 THEN -1 ELSE 1 END AS _diff"] if revised else [])},
            {"name": "per_key", "input": "shown", "aggregate": {"key": "key", "time": "event_time", "aggregates": aggregates}},
        ],
        "sinks": [{"name": "changes", "input": "per_key", "files": {"path": str(out / "changes")}}],
        "control": {"load": "rows", "rewrite": rewrite},
    }


def applied_changelog(out: Path, columns: str) -> list[tuple]:
    """The sink's changelog applied: each distinct row with its summed weight, if positive."""
    return normal(duckdb.connect().execute(
        f"SELECT {columns} FROM read_parquet('{out}/changes/epoch=*/*.parquet', hive_partitioning = false) "
        f"GROUP BY ALL HAVING sum(_diff) > 0").fetchall())


def test_a_hot_aggregate_is_split_into_local_and_global_steps_that_keep_its_state(spark, tmp_path: Path) -> None:
    """The detector fires the local/global split; the driver dies in the first epoch that runs
    it and a restart goes on split. The aggregate keeps its state (no reset) and the changelog
    applied equals the query over all ticks, last() included."""
    ckpt = str(tmp_path / "ckpt")
    spec = load_spec(aggregate_network(tmp_path / "out", {"saturation": 0.0, "patience": 2}))
    with pytest.raises(Crash):
        Engine(spec, spark, ckpt, faults=CrashAt(4, FaultPoint.AFTER_STAGE)).run(until_idle=True)
    Engine(spec, spark, ckpt).run(until_idle=True)

    ticks = duckdb.connect()
    ticks.register("ticks", generator_frame(spark, Generator(**TICKS_SOURCE), 0, TICKS, 2).toArrow())
    want = normal(ticks.execute(
        "SELECT key, count(*), sum(value), avg(value), min(value), max(value), "
        "arg_max(value, (event_time, value)) FROM ticks GROUP BY key").fetchall())
    assert len(want) == 6
    assert applied_changelog(tmp_path / "out", "key, n, total, mean, low, high, latest") == want

    ((epoch, applied),) = rewrites(ckpt)
    assert epoch == 4 and applied["rewrite"] == "aggregate-local-global-split"
    ck = Checkpoint(ckpt)
    assert ck.metadata()["applied"]["reset"] == [] and ck.metadata()["applied"]["inherit"] == {}
    made = next(d for d in ck.latest_commit().control["manager"]["decisions"] if d["kind"] == "rewrite")
    assert made["why"]["reason"] == "hot spot" and made["action"]["steps"] == ["per_key"]
    share = min(e["hotShareOfFairLane"] for e in made["why"]["epochs"])
    assert made["expected"]["makespanMs"] == pytest.approx(made["why"]["makespanMs"] / share, abs=0.2)
    assert made["measured"]["makespanMs"] > 0
    # the aggregate's lanes got every tick of a key before the split, one partial per key and
    # task (two tasks) after it
    rows = {h["epoch"]: max(h["kg_rows"].values()) for h in ck.latest_commit().control["manager"]["history"]["per_key"]
            if h["kg_rows"]}
    assert all(rows[e] > 300 for e in (1, 2, 3)) and 4 in rows and all(rows[e] <= 2 for e in rows if e >= 4), rows
    shown = CliRunner().invoke(app, ["explain", str(tmp_path / "net.json"), "--checkpoint", ckpt, "--no-spark-plan"])
    assert shown.exit_code == 2
    (tmp_path / "net.json").write_text(json.dumps(aggregate_network(tmp_path / "out", {"auto": False})))
    shown = CliRunner().invoke(app, ["explain", str(tmp_path / "net.json"), "--checkpoint", ckpt, "--no-spark-plan"])
    assert shown.exit_code == 0, shown.output
    assert "per_key_local ← shown: combine" in shown.output
    assert "rewritten at epoch 4 by aggregate-local-global-split" in shown.output


def test_a_rewrite_that_would_not_compile_is_refused_and_the_run_goes_on(spark, tmp_path: Path) -> None:
    """min and max over a revised input cannot be combined: the rule fits the spec, but the
    rewritten network does not compile, so the command is refused before anything changes."""
    ckpt = str(tmp_path / "ckpt")
    spec = load_spec({**aggregate_network(tmp_path / "out", {"auto": False, "schedule": {2: ["per_key"]}}, revised=True),
                      "sources": [{"name": "ticks", "generator": TICKS_SOURCE, "limit": 1_000, "max_rows_per_epoch": 500}]})
    Engine(spec, spark, ckpt).run(until_idle=True)

    (done,) = Inbox(ckpt).done()
    assert done["outcome"] == "refused" and done["from"] == "rewrite"
    assert "step 'per_key_local': combine cannot take the revisions of input 'shown'" in done["reason"]
    assert "low, high: only count, sum and avg partials can take a row back" in done["reason"]
    assert rewrites(ckpt) == [] and "applied" not in (Checkpoint(ckpt).metadata() or {})
    ticks = duckdb.connect()
    ticks.register("ticks", generator_frame(spark, Generator(**TICKS_SOURCE), 0, 1_000, 2).toArrow())
    weighted = "(CASE WHEN value % 7 = 0 THEN -1 ELSE 1 END)"
    want = normal(ticks.execute(
        f"SELECT key, sum({weighted}), sum(value * {weighted}), sum(value * {weighted}) / sum({weighted}) "
        "FROM ticks GROUP BY key").fetchall())
    assert applied_changelog(tmp_path / "out", "key, n, total, mean") == want
