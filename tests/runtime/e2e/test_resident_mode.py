"""``execution: resident`` (issue #55): the network's stateful steps on resident lanes give what
Spark jobs an epoch give, through changes of mode and of lane count between runs; networks it
cannot run are refused before anything is written. (SIGKILLs at every moment of a resident
epoch, each restart on another lane count: tests/runtime/e2e/test_recovery.py; the exactly-once
end-to-end tests run in both modes: test_end_to_end.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.errors import SpecError
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine

FILES, ROWS = 8, 600


def write_events(folder: Path, seed: int = 5) -> None:
    """JSON lines, one file an epoch, a malformed record in the third."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for f in range(FILES):
        lines = []
        for i in range(ROWS):
            s = f * ROWS + i
            lines.append(json.dumps({"seq": s, "uid": int(rng.integers(0, 700)), "kind": "ab"[s % 2],
                                     "produced_us": 1_700_000_000_000_000 + s * 2_137}))
        if f == 2:
            lines.insert(7, '{"seq": "not a number"}')
        (folder / f"{f:04d}.json").write_text("\n".join(lines) + "\n")


def raw_spec(data: Path, out: Path, execution: str) -> dict[str, Any]:
    """The first ``b`` event of each user within 0.5 s of event time (a user seen again later
    counts again): dedup behind a select and a filter, as the latency benchmark's."""
    return {
        "name": "resident", "trigger": 0, "lanes": 2, "execution": execution,
        "sources": [{"name": "events", "files": {"path": str(data), "format": "json", "max_files_per_epoch": 1,
                                                  "schema": "seq long, uid long, kind string, produced_us long"}}],
        "steps": [
            {"name": "timed", "input": "events", "select": ["seq", "uid", "kind", "timestamp_micros(produced_us) AS ts"]},
            {"name": "bs", "input": "timed", "filter": "kind = 'b'"},
            {"name": "first", "input": "bs", "dedup": {"key": "uid", "time": "ts", "ttl": "500ms"}},
            {"name": "kept", "input": "first", "select": ["seq", "uid", "ts"]},
        ],
        "sinks": [{"name": "out", "input": "kept", "files": {"path": str(out), "format": "parquet"}}],
    }


def rows(out: Path) -> list[tuple]:
    return duckdb.sql(f"SELECT seq, uid, epoch(ts) FROM read_parquet('{out}/epoch=*/*.parquet') ORDER BY seq").fetchall()


def letters(ckpt: Path) -> list[tuple]:
    return duckdb.sql(f"SELECT source, file, line, raw, reason FROM read_json_auto('{ckpt}/dead-letters/epoch=*/*.json')"
                      ).fetchall()


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple], int]:
    """The input and what a Spark job an epoch writes from it (and its dead letters)."""
    base = tmp_path_factory.mktemp("resident-ref")
    write_events(base / "in")
    summary = Engine(load_spec(raw_spec(base / "in", base / "out", "job")), spark, str(base / "ckpt")).run(until_idle=True)
    expected = rows(base / "out")
    assert len(expected) > 500 and summary.dead_letters == 1
    return base / "in", expected, summary.input_rows


def test_resident_epochs_write_what_per_epoch_jobs_write(spark, reference, tmp_path: Path) -> None:
    """... with each lane reading its own half of every epoch's file (no row read by the driver)."""
    from eddyline.observe.progress import ProgressReporter

    data, expected, read = reference
    with ProgressReporter(live=False, json_path=str(tmp_path / "progress.jsonl")) as reporter:
        engine = Engine(load_spec(raw_spec(data, tmp_path / "out", "resident")), spark, str(tmp_path / "ckpt"),
                        reporter=reporter)
        summary = engine.run(until_idle=True)
    assert rows(tmp_path / "out") == expected
    sources = [r["sources"][0] for r in map(json.loads, (tmp_path / "progress.jsonl").read_text().splitlines())]
    read_by_lane = [(s["rowsByLane"], s["numInputRows"]) for s in sources if s["numInputRows"]]
    assert len(read_by_lane) == FILES
    assert all(len(by) == 2 and min(by) > ROWS / 4 and sum(by) == n for by, n in read_by_lane), read_by_lane
    assert summary.input_rows == read and summary.dead_letters == 1
    assert letters(tmp_path / "ckpt") == letters(data.parent / "ckpt")  # file, line, raw text, reason
    assert engine.executor.stages_started == 1  # one stage served every epoch
    last = Checkpoint(str(tmp_path / "ckpt")).latest_commit()
    assert last is not None and last.epoch >= FILES
    assert not engine.executor.holds_workers  # the stage ended with the run


def test_auto_runs_resident_lanes_where_they_take_the_network_and_jobs_elsewhere_saying_why(
        spark, reference, tmp_path: Path) -> None:
    from eddyline.observe.progress import ProgressReporter

    data, expected, _ = reference
    for query, mode in (("dedup", "resident"), ("window-late", "job"), ("window-revised", "job")):
        raw = {**raw_spec(data, tmp_path / query, "auto"), "name": query}
        if query == "window-late":
            late = {**WINDOW["window_aggregate"], "late": {"path": str(tmp_path / "late")}}
            raw["steps"] = [TIMED, {**WINDOW, "window_aggregate": late}]
            raw["sinks"] = [{"name": "out", "input": "w", "memory": {}}]
        if query == "window-revised":  # a changelog into a window: Spark weighs its rows
            raw["steps"] = [
                {"name": "timed", "input": "events", "select": ["uid", "timestamp_micros(produced_us) AS ts"]},
                {"name": "latest", "input": "timed", "aggregate": {"key": "uid", "aggregates": {"t": "max(ts)"}}},
                {"name": "w", "input": "latest", "window_aggregate": {
                    "time": "t", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"}}}]
            raw["sinks"] = [{"name": "out", "input": "w", "memory": {}}]
        with ProgressReporter(live=False, json_path=str(tmp_path / f"{query}.jsonl")) as reporter:
            engine = Engine(load_spec(raw), spark, str(tmp_path / f"{query}-ckpt"), reporter=reporter)
            engine.run(epochs=2)
        records = [json.loads(x) for x in (tmp_path / f"{query}.jsonl").read_text().splitlines()]
        assert {r["execution"]["mode"] for r in records} == {mode}, query
        if query == "window-late":
            assert records[-1]["execution"]["why"] == "step 'w': late: late rows are split off in Spark"
        elif query == "window-revised":
            assert records[-1]["execution"]["why"] == "step 'w': revisions into a window aggregate are weighted in Spark"
        else:
            assert "why" not in records[-1]["execution"] and engine.executor.stages_started == 1


def test_a_checkpoint_changes_mode_and_lane_count_between_runs(spark, reference, tmp_path: Path) -> None:
    """Three epochs resident on two lanes, two as Spark jobs on one lane, the rest resident on
    two again: each run takes the state the one before committed."""
    data, expected, _ = reference
    ckpt, out = str(tmp_path / "ckpt"), tmp_path / "out"
    modes = []
    for execution, lanes, epochs in [("resident", None, 3), ("job", 1, 2), ("resident", None, None)]:
        engine = Engine(load_spec(raw_spec(data, out, execution)), spark, ckpt, lanes=lanes)
        engine.run(epochs=epochs, until_idle=epochs is None)
        modes.append(engine.executor.mode)
    assert modes == ["resident", "job", "resident"]  # (each run in the mode its spec asks for)
    assert rows(out) == expected
    routing = Checkpoint(ckpt).latest_commit().steps["first"].routing
    assert json.loads(routing)["lanes"] == 2 if isinstance(routing, str) else routing["lanes"] == 2


TIMED = {"name": "timed", "input": "events", "select": ["uid", "CAST(uid AS INT) AS small", "timestamp_micros(produced_us) AS ts"]}
def other_spec(query: str, data: Path, out: Path, execution: str) -> dict[str, Any]:
    """The latency benchmark's other two queries on the same events: a count per user and
    second, and an interval join of each ``a`` event with the ``b`` events of its user within a
    second after it."""
    ts = "timestamp_micros(produced_us) AS ts"
    if query == "window":
        steps = [{"name": "timed", "input": "events", "select": ["uid", ts]},
                 {"name": "result", "input": "timed", "window_aggregate": {
                     "key": "uid", "time": "ts", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"},
                     "watermark_delay": "200ms"}}]
    elif query == "revisions":  # a changelog (old row -1, new row +1) through a select that keeps its weight
        steps = [{"name": "timed", "input": "events", "select": ["uid", ts]},
                 {"name": "counts", "input": "timed", "aggregate": {"key": "uid", "aggregates": {"n": "count(*)",
                                                                                                "t": "max(ts)"}}},
                 {"name": "result", "input": "counts", "select": ["uid", "n * 10 AS tens"]}]
    elif query == "chain":  # Nexmark q8's shape: a window join, then one row per user and window
        steps = [{"name": "as", "input": "events", "filter": "kind = 'a'"},
                 {"name": "a", "input": "as", "select": ["uid AS id", "timestamp_micros(produced_us) AS a_ts"]},
                 {"name": "bs", "input": "events", "filter": "kind = 'b'"},
                 {"name": "b", "input": "bs", "select": ["seq", "uid", ts]},
                 {"name": "joined", "join": {"left": "a", "right": "b", "left_key": "id", "right_key": "uid",
                                             "kind": "window", "size": "1s", "left_time": "a_ts", "right_time": "ts"}},
                 {"name": "result", "input": "joined", "dedup": {"key": ["id", "window_start"], "time": "window_end",
                                                                 "ttl": "1s"}}]
    else:
        steps = [{"name": "as", "input": "events", "filter": "kind = 'a'"},
                 {"name": "a", "input": "as", "select": ["uid AS id", "seq AS opened", "timestamp_micros(produced_us) AS a_ts",
                                                         "timestamp_micros(produced_us) + INTERVAL 1 SECOND AS expires"]},
                 {"name": "bs", "input": "events", "filter": "kind = 'b'"},
                 {"name": "b", "input": "bs", "select": ["seq", "uid", ts]},
                 {"name": "result", "join": {"left": "a", "right": "b", "left_key": "id", "right_key": "uid",
                                             "kind": "interval", "left_time": "a_ts", "left_end": "expires",
                                             "right_time": "ts"}}]
    raw = raw_spec(data, out, execution)
    return {**raw, "steps": steps, "sinks": [{**raw["sinks"][0], "input": "result"}]}


@pytest.mark.parametrize("query", ["window", "join", "chain", "revisions"])
def test_a_window_a_join_and_a_chain_on_resident_lanes_write_what_per_epoch_jobs_write(
        spark, reference, tmp_path: Path, query: str) -> None:
    data = reference[0]
    got = {}
    for execution in ("job", "resident"):
        out = tmp_path / execution
        Engine(load_spec(other_spec(query, data, out, execution)), spark, str(tmp_path / f"{execution}-ckpt")).run(
            until_idle=True)
        got[execution] = duckdb.sql(f"SELECT * EXCLUDE (epoch) FROM read_parquet('{out}/epoch=*/*.parquet') "
                                    "ORDER BY ALL").fetchall()
    assert len(got["job"]) > 100 and got["resident"] == got["job"]


WINDOW = {"name": "w", "input": "timed", "window_aggregate": {
    "key": "uid", "time": "ts", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"}, "late": {"path": "/tmp/x"}}}


@pytest.mark.parametrize(("change", "why"), [
    ({"steps": [TIMED, WINDOW], "sinks": [{"name": "out", "input": "w", "memory": {}}]},
     "step 'w': late: late rows are split off in Spark"),
    ({"steps": [TIMED, {"name": "u", "union": ["timed", "timed"]},
                {"name": "first", "input": "u", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}}]},
     "step 'u': a union step runs in Spark"),
    ({"control": {"state_budget": "10MB"}}, "control.state_budget"),
    ({"steps": [{"name": "timed", "input": "events", "select": ["seq", "uid", "kind", "bround(produced_us, -3) AS ts"]},
                {"name": "first", "input": "timed", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}}]},
     "step 'timed': DuckDB cannot run"),
    ({"steps": [TIMED, {"name": "first", "input": "timed", "dedup": {"key": "small", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}}]},
     "step 'first': resident lanes key BIGINT, TIMESTAMP and STRING columns"),
    ({"steps": [{"name": "a", "input": "events", "select": ["uid", "CAST(seq AS DECIMAL(12, 2)) AS paid",
                                                            "timestamp_micros(produced_us) AS ts"]},
                {"name": "pairs", "join": {"left": "a", "right": "a", "left_key": "uid", "right_key": "uid",
                                           "kind": "unbounded"}}],
      "sinks": [{"name": "out", "input": "pairs", "memory": {}}], "control": {"spread": {"fanout": 2}}},
     "step 'pairs': control.spread: resident lanes split rows of BIGINT, INT, DOUBLE"),
])
def test_a_network_resident_lanes_cannot_run_is_refused_before_anything_is_written(
        spark, tmp_path: Path, change: dict[str, Any], why: str) -> None:
    (tmp_path / "in").mkdir()
    raw = {**raw_spec(tmp_path / "in", tmp_path / "out", "resident"), **change}
    with pytest.raises(SpecError, match="execution: resident") as refused:
        Engine(load_spec(raw), spark, str(tmp_path / "ckpt"))
    assert why in str(refused.value)
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "out").exists()


def test_a_step_failing_on_an_epochs_rows_in_a_lane_stops_the_run_naming_it(spark, reference, tmp_path: Path) -> None:
    """An overflow (as Spark's ANSI mode, DuckDB refuses it) passes the check over no rows at the
    start; the lane that meets one reports the step's error, which stops the run as it is (not once more on a new
    stage: the same rows would fail the same way), with nothing committed."""
    raw = {**raw_spec(reference[0], tmp_path / "out", "resident"),
           "steps": [{"name": "timed", "input": "events",
                      "select": ["seq", "uid", "produced_us * 1000000 AS k", "timestamp_micros(produced_us) AS ts"]},
                     {"name": "first", "input": "timed", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
           "sinks": [{"name": "out", "input": "first", "memory": {}}]}
    engine = Engine(load_spec(raw), spark, str(tmp_path / "ckpt"))
    with pytest.raises(SpecError, match=r"resident lane \d, epoch 1: step 'timed': DuckDB cannot run"):
        engine.run(until_idle=True)
    assert Checkpoint(str(tmp_path / "ckpt")).latest_commit() is None
    assert engine.executor.stages_started == 1 and not engine.executor.holds_workers


def test_explain_says_whether_resident_lanes_take_the_network(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from eddyline.cli import app

    raw = raw_spec(tmp_path / "in", tmp_path / "out", "job")
    late = {**WINDOW["window_aggregate"], "late": {"path": str(tmp_path / "late")}}
    refused = {**raw, "steps": [TIMED, {**WINDOW, "window_aggregate": late}],
               "sinks": [{"name": "out", "input": "w", "memory": {}}]}
    for name, spec, said in (("takes", raw, "resident lanes take this network"),
                             ("refuses", refused, "resident lanes do not take it: step 'w': late: late rows")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        shown = CliRunner().invoke(app, ["explain", str(path), "--no-spark-plan"])
        assert shown.exit_code == 0, shown.output
        assert f"execution: job ({said}" in shown.output, shown.output


def test_auto_with_hot_key_splits_runs_them_on_resident_lanes_as_jobs_do(spark, reference, tmp_path: Path) -> None:
    """``control.spread`` splits the interval join's key groups (all 16 of them, three fragments
    each, at epoch 3): under ``auto`` the lanes split the new rows of a split group as the
    per-epoch job does (each stored in one fragment, probed in the others), so the output and
    every fragment's state after five epochs equal a Spark job's."""
    from eddyline.state.store import KeyGroupStore

    data = reference[0]
    got, state = {}, {}
    for execution in ("job", "auto"):
        raw = {**other_spec("join", data, tmp_path / execution, execution), "key_groups": 16,
               "control": {"spread": {"schedule": {3: list(range(16))}, "fanout": 3, "auto": False}}}
        ckpt = str(tmp_path / f"{execution}-ckpt")
        engine = Engine(load_spec(raw), spark, ckpt)
        engine.run(epochs=5)
        assert engine.executor.mode == ("job" if execution == "job" else "resident")
        last = Checkpoint(ckpt).latest_commit()
        routing = last.steps["result"].routing
        assert len((json.loads(routing) if isinstance(routing, str) else routing)["spread"]) == 16
        state[execution] = {int(k): v for k, v in last.steps["result"].index.items()}
        if execution == "auto":
            kernel = engine.executor._kernels_for[1]["result"]
        got[execution] = duckdb.sql(f"SELECT * EXCLUDE (epoch) FROM read_parquet('{tmp_path / execution}/epoch=*/*.parquet') "
                                    "ORDER BY ALL").fetchall()
    assert len(got["job"]) > 100 and got["auto"] == got["job"]
    assert set(state["auto"]) == set(state["job"]) and max(state["job"]) >= 16  # rows stored in the new fragments
    held = {}
    for execution, index in state.items():
        store = KeyGroupStore(str(tmp_path / f"{execution}-ckpt"), "result", kernel.state_schema, kernel.primary_key)
        held[execution] = store.load(index, sorted(index)).sort_by([("_kg", "ascending"), ("_seq", "ascending")])
    assert held["auto"].num_rows > 0 and held["auto"].equals(held["job"])
