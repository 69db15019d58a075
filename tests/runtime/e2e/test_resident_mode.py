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
from eddyline.errors import EngineError, SpecError
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine
from eddyline.runtime.inbox import Inbox

from .helpers import MEASURES, Crash, CrashAfterPublish, read

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

    # time travel: epochs 5 on run again, on a stage loaded from the commit of epoch 4
    Inbox(str(tmp_path / "ckpt")).submit_command({"replay": 5, "network": raw_spec(data, tmp_path / "out", "job"),
                                                   "reset": []})
    again = Engine(load_spec(raw_spec(data, tmp_path / "out", "resident")), spark, str(tmp_path / "ckpt"))
    again.run(until_idle=True)
    replay = Checkpoint(str(tmp_path / "ckpt")).read_plan(last.epoch + 1)
    assert (replay.base, replay.retracts) == (4, list(range(5, last.epoch + 1)))
    assert rows(tmp_path / "out") == expected and again.executor.stages_started == 1


def test_auto_runs_resident_lanes_where_they_take_the_network_and_jobs_elsewhere_saying_why(
        spark, reference, tmp_path: Path) -> None:
    from eddyline.observe.progress import ProgressReporter

    data, expected, _ = reference
    for query, mode in (("dedup", "resident"), ("window-late", "resident"), ("window-revised", "job")):
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
        if query == "window-revised":
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
    elif query == "union":  # two branches off the events (one read of them in Spark), then the first of each user
        steps = [{"name": "as", "input": "events", "filter": "kind = 'a' AND seq % 3 = 0"},
                 {"name": "a", "input": "as", "select": ["seq", "uid", ts]},
                 {"name": "b", "input": "events", "select": ["seq", "uid + 1 AS uid", ts]},
                 {"name": "both", "union": ["a", "b"]},
                 {"name": "result", "input": "both", "dedup": {"key": "uid", "time": "ts", "ttl": "300ms"}}]
    elif query == "union-revised":  # a changelog and insert-only rows (weighed +1) in one union
        steps = [{"name": "timed", "input": "events", "select": ["uid", ts]},
                 {"name": "counts", "input": "timed", "aggregate": {"key": "uid", "aggregates": {"n": "count(*)"}}},
                 {"name": "firsts", "input": "events", "filter": "seq % 50 = 0"},
                 {"name": "plain", "input": "firsts", "select": ["uid", "seq AS n"]},
                 {"name": "result", "union": ["counts", "plain"]}]
    elif query == "udf-arrow":  # a union of two branches, a user's function on each lane's batches, a count per user
        steps = [{"name": "as", "input": "events", "filter": "kind = 'a' AND seq % 3 = 0"},
                 {"name": "a", "input": "as", "select": ["seq", "uid", "seq * 7 AS price", ts]},
                 {"name": "b", "input": "events", "select": ["seq", "uid + 1 AS uid", "seq * 5 AS price", ts]},
                 {"name": "both", "union": ["a", "b"]},
                 {"name": "priced", "input": "both", "udf": {
                     "function": "eddyline.examples.udfs:to_euro", "batch": "arrow",
                     "schema": "seq long, uid long, price long, ts timestamp"}},
                 {"name": "result", "input": "priced", "aggregate": {
                     "key": "uid", "aggregates": {"n": "count(*)", "top": "max(price)"}}}]
    elif query == "udf-pandas":  # a function on pandas batches, then the local/global split of an aggregate
        aggregates = {"n": "count(*)", "total": "sum(seq)", "t": "max(ts)", "mean": "avg(seq)", "bands": "sum(band)"}
        steps = [{"name": "timed", "input": "events", "select": ["seq", "uid", "seq * 7 AS price", ts]},
                 {"name": "priced", "input": "timed", "udf": {
                     "function": "eddyline.examples.udfs:price_band", "batch": "pandas",
                     "schema": "seq long, uid long, price long, ts timestamp, band long"}},
                 {"name": "partials", "input": "priced", "combine": {"key": "uid", "aggregates": aggregates}},
                 {"name": "result", "input": "partials", "aggregate": {"key": "uid", "aggregates": aggregates,
                                                                      "combined": True}}]
    elif query == "lookup":  # the first event of each user, enriched from a table (lookup_table)
        steps = [{"name": "timed", "input": "events",
                  "select": ["seq", "uid", "CASE WHEN seq % 11 = 0 THEN NULL ELSE uid END AS user", ts]},
                 {"name": "first", "input": "timed", "dedup": {"key": "uid", "time": "ts", "ttl": "300ms"}},
                 {"name": "result", "input": "first", "lookup": {
                     "table": {"path": str(out.parent / "table")}, "key": "user", "table_key": "id"}}]
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


@pytest.mark.parametrize("query", ["window", "join", "chain", "revisions", "union-revised", "udf-arrow", "udf-pandas"])
def test_a_window_a_join_and_a_chain_on_resident_lanes_write_what_per_epoch_jobs_write(
        spark, reference, tmp_path: Path, query: str) -> None:
    data = reference[0]
    got = {}
    for execution in ("job", "resident"):
        out = tmp_path / execution
        engine = Engine(load_spec(other_spec(query, data, out, execution)), spark, str(tmp_path / f"{execution}-ckpt"))
        engine.run(until_idle=True)
        assert engine.executor.mode == execution
        got[execution] = duckdb.sql(f"SELECT * EXCLUDE (epoch) FROM read_parquet('{out}/epoch=*/*.parquet') "
                                    "ORDER BY ALL").fetchall()
    assert len(got["job"]) > 100 and got["resident"] == got["job"]


def lookup_table(folder: Path, version: int) -> None:
    """A lookup table of users (INT ids, which Spark widens to the events' BIGINT to compare):
    some twice, one id null, some bands null; version 2 has other users and other bands."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    ids = [*range(0, 400, 3), *range(0, 400, 50), None] if version == 1 else [*range(200, 700, 2), *range(201, 700, 25)]
    pq.write_table(pa.table({
        "band": pa.array([None if i is None or i % 7 == 0 else f"v{version}-{i % 5}" for i in ids], pa.string()),
        "id": pa.array(ids, pa.int32()),
        "weight": pa.array([None if i is None else i * version for i in ids], pa.int64())}), folder / "users.parquet")
    stamp = 1_700_000_000 + version  # (a new version to the fingerprint, whatever the clock)
    os.utime(folder / "users.parquet", (stamp, stamp))


def test_a_lookup_on_resident_lanes_joins_the_version_each_epoch_pins_as_per_epoch_jobs_do(
        spark, reference, tmp_path: Path) -> None:
    """An inner and a left lookup; the table changes after the second epoch: the later epochs join
    the new version (and the last, replayed after it changed again, the version it pinned), on
    resident lanes as in Spark (rows, their columns in order and their types:
    the table's INT key compared with the stream's BIGINT and left out, a row matched twice
    written twice, a null key on either side matching nothing)."""
    import pyarrow.parquet as pq

    got, schemas = {}, {}
    for execution in ("job", "resident"):
        out = tmp_path / execution / "out"
        lookup_table(out.parent / "table", 1)
        raw = other_spec("lookup", reference[0], out, execution)
        raw["steps"].append({"name": "kept", "input": "first", "lookup": {**raw["steps"][-1]["lookup"], "how": "left"}})
        raw["sinks"].append({"name": "left", "input": "kept", "files": {"path": str(out.parent / "left")}})
        raw["sources"][0]["files"]["max_files_per_epoch"] = 2
        for epochs, version in ((2, 1), (None, 2)):  # (a run of 2 epochs, then the rest with the table changed)
            lookup_table(out.parent / "table", version)
            engine = Engine(load_spec(raw), spark, str(tmp_path / f"{execution}-ckpt"))
            engine.run(epochs=epochs, until_idle=epochs is None)
            assert engine.executor.mode == execution
        if execution == "resident":  # the last epoch with rows, replayed after the table changed again,
            lookup_table(out.parent / "table", 3)  # joins the version it pinned (then the last, without rows)
            ckpt = tmp_path / "resident-ckpt"
            for done in [*sorted((ckpt / "commits").glob("*.json"))[-2:], sorted((ckpt / "plans").glob("*.json"))[-1]]:
                done.unlink()
            summary = Engine(load_spec(raw), spark, str(ckpt)).run(until_idle=True)
            assert summary.replayed == 1
        for how in ("out", "left"):
            written = out.parent / how
            got[execution, how] = duckdb.sql(f"SELECT * FROM read_parquet('{written}/epoch=*/*.parquet') "
                                             "ORDER BY ALL").fetchall()
            schemas[execution, how] = pq.read_schema(next(written.glob("epoch=*/*.parquet")))
    for how in ("out", "left"):
        assert [c for c in schemas["job", how].names if c != "epoch"] == ["seq", "uid", "user", "ts", "band", "weight"]
        assert schemas["resident", how] == schemas["job", how]
        bands = {band.split("-")[0] for *_, band, _, _ in got["job", how] if band is not None}
        assert bands == {"v1", "v2"} and len(got["job", how]) > 100 and got["resident", how] == got["job", how]
    assert len(got["job", "left"]) > len(got["job", "out"]) and any(r[2] is None for r in got["job", "left"])


def late_spec(data: Path, out: Path, late: Path, execution: str) -> dict[str, Any]:
    """Sliding windows over events of which every 7th is 4 s behind and every 97th has no time:
    rows too late for the watermark (and the lateness) go to a JSON late target."""
    ts = ("CASE WHEN seq % 97 = 5 THEN NULL ELSE timestamp_micros(produced_us - CASE WHEN seq % 7 = 0 THEN 4000000 "
          "ELSE 0 END) END AS ts")
    raw = raw_spec(data, out, execution)
    raw["sources"][0]["files"]["max_files_per_epoch"] = 2
    return {**raw, "steps": [
        {"name": "timed", "input": "events", "select": ["seq", "uid", "kind", ts]},
        {"name": "w", "input": "timed", "window_aggregate": {
            "key": "uid", "time": "ts", "window": {"size": "2s", "slide": "1s"}, "aggregates": {"n": "count(*)"},
            "watermark_delay": "200ms", "allowed_lateness": "300ms", "late": {"path": str(late), "format": "json"}}}],
        "sinks": [{"name": "out", "input": "w", "files": {"path": str(out), "format": "parquet"}}]}


class Reports:
    """The progress records of the runs, by epoch (a replayed epoch's last)."""

    console = None

    def __init__(self) -> None:
        self.by_epoch: dict[int, dict[str, Any]] = {}

    def report(self, record: dict[str, Any]) -> None:
        self.by_epoch[record["batchId"]] = record


def test_late_rows_reach_the_late_target_from_resident_lanes_as_from_jobs_replaying_a_jobs_epoch(
        spark, reference, tmp_path: Path) -> None:
    """The lanes write their parts of the late target, staged until the epoch publishes. A job's
    epoch 2, crashed after publishing, is replayed by resident lanes, which write the same rows
    again in its place, then go on."""
    data = reference[0]

    def written(run: str) -> tuple[list[tuple], list[tuple], list[str]]:
        out, late = tmp_path / run / "out", tmp_path / run / "late"
        return (duckdb.sql(f"SELECT * FROM read_parquet('{out}/epoch=*/*.parquet') ORDER BY ALL").fetchall(),
                duckdb.sql(f"SELECT epoch, seq, uid, kind, ts FROM read_json('{late}/epoch=*/*.json', "
                           "hive_partitioning=true, columns={seq: 'BIGINT', uid: 'BIGINT', kind: 'VARCHAR', "
                           "ts: 'VARCHAR'}) ORDER BY ALL").fetchall(),
                sorted(p.name for p in late.iterdir()))

    def engine(run: str, execution: str, reports: Reports, crash_after: int | None = None) -> Engine:
        spec = load_spec(late_spec(data, tmp_path / run / "out", tmp_path / run / "late", execution))
        return Engine(spec, spark, str(tmp_path / run / "ckpt"), reporter=reports,  # type: ignore[arg-type]
                      faults=CrashAfterPublish(crash_after) if crash_after is not None else None)

    jobs, mixed = Reports(), Reports()
    engine("job", "job", jobs).run(until_idle=True)
    with pytest.raises(Crash):
        engine("mixed", "job", mixed, crash_after=2).run(until_idle=True)
    resident = engine("mixed", "resident", mixed)
    resident.run(until_idle=True)
    assert resident.executor.mode == "resident" and resident.executor.stages_started == 1
    want, got = written("job"), written("mixed")
    late = {e: r["lateRows"] for e, r in jobs.by_epoch.items()}
    assert len(want[1]) > 100 and any(ts is None for *_, ts in want[1])  # (a row without a time is late)
    assert got == want
    # the late rows counted, epoch by epoch (from epoch 2 on as the resident lanes counted them)
    assert [r["execution"]["mode"] for _, r in sorted(mixed.by_epoch.items())] == ["job"] + ["resident"] * (len(late) - 1)
    assert {e: r["lateRows"] for e, r in mixed.by_epoch.items()} == late
    assert late[2] + late[3] > 0 and sum(late.values()) == len(want[1])


WINDOW = {"name": "w", "input": "timed", "window_aggregate": {
    "key": "uid", "time": "ts", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"}, "late": {"path": "/tmp/x"}}}


@pytest.mark.parametrize(("change", "why"), [
    ({"sources": [{"name": "events", "files": {"path": "/tmp/x", "format": "parquet", "schema": "uid long"}}]},
     "source 'events': a parquet source with a declared schema is cast by Spark"),
    ({"steps": [{"name": "timed", "input": "events", "select": ["uid", "array(seq) AS seqs", "timestamp_micros(produced_us) AS ts"]},
                {"name": "first", "input": "timed", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}, "qos": {"latency": "1s"}}],
      "control": {"overload": {"shedding": "uniform"}}},
     "step 'first': shedding hashes every column of a row; column 'seqs' is list<"),
    ({"steps": [TIMED, {"name": "l", "input": "timed", "lookup": {"table": {"path": "/tmp/x", "format": "json"},
                                                                  "key": "uid", "table_key": "id"}},
                {"name": "first", "input": "l", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}}]},
     "step 'l': lookup.table: a json table's schema is inferred by Spark's reader, which resident lanes do not run"),
    ({"steps": [TIMED, {"name": "narrow", "input": "timed", "select": ["small AS uid", "ts"]},
                {"name": "wide", "input": "timed", "select": ["uid", "ts"]},
                {"name": "u", "union": ["wide", "narrow"]},
                {"name": "first", "input": "u", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}}]},
     "step 'u': union: resident lanes take inputs of the same column types; 'uid' is int64 in 'wide' and int32 in "
     "'narrow' (Spark widens it)"),
    ({"steps": [{"name": "timed", "input": "events", "select": ["seq", "uid", "kind", "bround(produced_us, -3) AS ts"]},
                {"name": "first", "input": "timed", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}}]},
     "step 'timed': DuckDB cannot run"),
    ({"steps": [TIMED, {"name": "first", "input": "timed", "dedup": {"key": "small", "time": "ts", "ttl": "1s"}}],
      "sinks": [{"name": "out", "input": "first", "memory": {}}]},
     "step 'first': resident lanes key BIGINT, TIMESTAMP and STRING columns"),
    ({"steps": [{"name": "a", "input": "events", "select": ["uid", "array(seq) AS paid",
                                                            "timestamp_micros(produced_us) AS ts"]},
                {"name": "pairs", "join": {"left": "a", "right": "a", "left_key": "uid", "right_key": "uid",
                                           "kind": "unbounded"}}],
      "sinks": [{"name": "out", "input": "pairs", "memory": {}}], "control": {"spread": {"fanout": 2}}},
     "step 'pairs': control.spread: resident lanes split rows of scalar columns (they hash a row as Spark does); "
     "'l__paid' is list<"),
    ({"control": {"scale": {"max_lanes": 4}}}, "up to 4 lanes (lanes, control.scale) need as many task slots; Spark has 2"),
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
    refused = {**raw, "sources": [{"name": "events", "files": {"path": str(tmp_path / "in"), "format": "parquet",
                                                               "schema": "seq long, uid long, kind string, produced_us long"}}]}
    ported = {**other_spec("udf-pandas", tmp_path / "in", tmp_path / "out", "job"), "steps": [
        *other_spec("union", tmp_path / "in", tmp_path / "out", "job")["steps"][:-1],
        {"name": "priced", "input": "both", "udf": {"function": "eddyline.examples.udfs:price_band", "batch": "pandas",
                                                    "schema": "seq long, uid long, ts timestamp, band long"}},
        {"name": "result", "input": "priced", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}]}
    lookup = {**ported, "steps": [*ported["steps"][:-1], {"name": "l", "input": "priced", "lookup": {
        "table": {"path": str(tmp_path / "t")}, "key": "uid", "table_key": "id"}},
        {"name": "result", "input": "l", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}]}
    csv = {**lookup, "steps": [*lookup["steps"][:-2], {"name": "l", "input": "priced", "lookup": {
        "table": {"path": str(tmp_path / "t"), "format": "csv", "schema": "id long, band string"}, "key": "uid",
        "table_key": "id"}}, lookup["steps"][-1]]}
    pattern = pattern_spec(tmp_path / "out", "job", "B")
    for name, spec, said in (("takes", raw, "resident lanes take this network"),
                             ("refuses", refused, "resident lanes do not take it: source 'events': a parquet source"),
                             ("ported", ported, "resident lanes take this network"),
                             ("pattern", pattern, "resident lanes take this network"),
                             ("lookup", lookup, "resident lanes take this network"),
                             ("csv", csv, "resident lanes do not take it: step 'l': lookup.table: a csv table is "
                                          "parsed by Spark's reader")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        shown = CliRunner().invoke(app, ["explain", str(path), "--no-spark-plan"])
        assert shown.exit_code == 0, shown.output
        assert f"execution: job ({said}" in shown.output, shown.output


def test_a_udf_failing_on_a_lanes_rows_stops_the_run_as_a_failed_task_does(spark, reference, tmp_path: Path) -> None:
    """The function raises on the rows of the second epoch: the run stops with the message a
    per-epoch job's failed task gives (tests/runtime/e2e/test_udf_lookup.py), not once more on
    a new stage, with only the first epoch committed."""
    raw = {**raw_spec(reference[0], tmp_path / "out", "resident"),
           "steps": [{"name": "timed", "input": "events",
                      "select": ["seq", "uid", "900 - seq AS price", "timestamp_micros(produced_us) AS ts"]},
                     {"name": "s", "input": "timed", "udf": {"function": "eddyline.examples.udfs:to_euro",
                                                             "schema": "seq long, uid long, price long, ts timestamp"}},
                     {"name": "first", "input": "s", "dedup": {"key": "uid", "time": "ts", "ttl": "1s"}}],
           "sinks": [{"name": "out", "input": "first", "memory": {}}]}
    engine = Engine(load_spec(raw), spark, str(tmp_path / "ckpt"))
    with pytest.raises(EngineError, match=r"^epoch 2: step 's': udf 'eddyline.examples.udfs:to_euro' failed on a batch "
                                          r"of \d+ rows: ValueError: negative price$"):
        engine.run(until_idle=True)
    assert Checkpoint(str(tmp_path / "ckpt")).latest_commit().epoch == 1
    assert engine.executor.stages_started == 1 and not engine.executor.holds_workers


def pattern_spec(out: Path, execution: str, split: str | None) -> dict[str, Any]:
    """The tick pattern over generated ticks of 25 keys (tests/runtime/e2e/test_stateful_recovery.py),
    in one step or split into two stages at ``split``."""
    pattern = {"key": "key", "time": "event_time", "within": "30s", "factory": "eddyline.operators.pattern:tick_pattern",
               "args": {"value_col": "value"}, "measures": MEASURES}
    steps = [{"name": "found", "input": "ticks", "pattern": pattern}]
    if split is not None:
        steps = [{"name": "stage1", "input": "ticks", "pattern": {**pattern, "split": {"stage": 1, "at": split}}},
                 {"name": "found", "input": "ticks",
                  "pattern": {**pattern, "split": {"stage": 2, "at": split}, "seeds": "stage1"}}]
    return {"name": "ticks", "trigger": 0, "lanes": 2, "key_groups": 32, "execution": execution,
            "sources": [{"name": "ticks", "generator": {"rate": 400, "unpaced": True, "keys": 25, "seed": 3},
                         "limit": 2400, "max_rows_per_epoch": 600}],
            "steps": steps, "sinks": [{"name": "matches", "input": "found", "files": {"path": str(out / "matches")}}]}


@pytest.mark.parametrize("split", [None, "B"])
def test_a_pattern_in_one_step_or_two_stages_on_resident_lanes_writes_what_per_epoch_jobs_write(
        spark, tmp_path: Path, split: str | None) -> None:
    got = {}
    for execution in ("job", "resident"):
        engine = Engine(load_spec(pattern_spec(tmp_path / execution, execution, split)), spark,
                        str(tmp_path / f"{execution}-ckpt"))
        engine.run(until_idle=True)
        assert engine.executor.mode == execution
        got[execution] = read(tmp_path / execution, "matches")
    assert len(got["job"]) > 20 and got["resident"] == got["job"]


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
