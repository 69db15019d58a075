"""Revisions end to end on local Spark (docs/revisions.md): a files source of Flink-style
changes (``_op``) through filter, select, union, a window aggregate and an unbounded aggregate;
the sinks' changelogs, summed, equal DuckDB's query over the final input. Steps that cannot take
rows back are refused before anything runs, and a change of unknown kind is a dead letter."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from eddyline.api.validate import load_spec
from eddyline.errors import SpecError
from eddyline.runtime.compile import analyze
from eddyline.runtime.engine import Engine

from .helpers import T0

DDL = "auction long, price long, ts timestamp, _op string"


def write_changes(directory: Path, files: int = 5, rows: int = 80, seed: int = 11) -> None:
    """Bids, then corrections of earlier bids in later files: a price change (-U old, +U new) or
    a deletion (-D); each file ends with one line whose _op is not a change kind."""
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    live: list[dict] = []
    for f in range(files):
        lines = []
        for i in range(rows):
            t = T0 + timedelta(milliseconds=f * 8_000 + i * 100)
            bid = {"auction": rng.randint(0, 12), "price": rng.randint(1, 500), "ts": t.isoformat().replace("+00:00", "Z")}
            live.append(bid)
            lines.append({**bid, "_op": "+I"})
        for _ in range(rows // 4 if f else 0):
            old = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.6:
                new = {**old, "price": rng.randint(1, 500)}
                live.append(new)
                lines += [{**old, "_op": "-U"}, {**new, "_op": "+U"}]
            else:
                lines.append({**old, "_op": "-D"})
        lines.append({**live[0], "_op": "upsert"})
        (directory / f"changes-{f:03d}.json").write_text("".join(json.dumps(x) + "\n" for x in lines))


def spec(src: Path, out: Path, extra_steps: list | None = None) -> dict:
    return {
        "name": "revised", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "changes", "files": {"path": str(src), "format": "json", "schema": DDL,
                                                   "max_files_per_epoch": 1}}],
        "steps": [
            {"name": "priced", "input": "changes", "filter": "price > 20"},
            {"name": "slim", "input": "priced", "select": ["auction", "price", "ts"]},
            {"name": "windows", "input": "slim", "window_aggregate": {
                "key": "auction", "time": "ts", "window": {"size": "10s"}, "watermark_delay": "1s",
                "allowed_lateness": "1h", "aggregates": {"n": "count(*)", "total": "sum(price)", "mean": "avg(price)",
                                                           "hi": "max(price)", "lo": "min(price)"}}},
            {"name": "per_auction", "input": "slim", "aggregate": {
                "key": "auction", "aggregates": {"n": "count(*)", "total": "sum(price)", "hi": "max(price)", "lo": "min(price)"}}},
            *(extra_steps or []),
        ],
        "sinks": [
            {"name": "w", "input": "windows", "files": {"path": str(out / "windows"), "format": "parquet"}},
            {"name": "a", "input": "per_auction", "files": {"path": str(out / "auctions"), "format": "parquet"}},
        ],
    }


FINAL = """(SELECT auction, price, ts FROM (
             SELECT auction, price, ts, CAST(sum(CASE WHEN _op IN ('+I', '+U') THEN 1 ELSE -1 END) AS BIGINT) AS w
             FROM read_json('{src}/*.json', columns={{auction: 'BIGINT', price: 'BIGINT', ts: 'TIMESTAMP', _op: 'VARCHAR'}})
             WHERE _op IN ('+I', '+U', '-U', '-D') GROUP BY ALL HAVING sum(CASE WHEN _op IN ('+I', '+U') THEN 1 ELSE -1 END) > 0),
           range(w) WHERE price > 20)"""


def summed(path: Path, columns: str) -> list[tuple]:
    """A changelog sink's rows summed by their _diff: each must end with weight 1."""
    rows = duckdb.connect().execute(
        f"SELECT {columns}, CAST(sum(_diff) AS BIGINT) AS w FROM read_parquet('{path}/epoch=*/*.parquet') "
        f"GROUP BY ALL HAVING sum(_diff) <> 0 ORDER BY ALL"
    ).fetchall()
    assert {r[-1] for r in rows} == {1}, "every row of a summed changelog weighs 1"
    return [r[:-1] for r in rows]


def test_revisions_flow_through_the_network_and_end_exact(spark, tmp_path: Path) -> None:
    write_changes(tmp_path / "in")
    net = load_spec(spec(tmp_path / "in", tmp_path / "out"))
    summary = Engine(net, spark, str(tmp_path / "ckpt")).run(until_idle=True)
    assert summary.dead_letters == 5  # one '_op: upsert' line per file

    con = duckdb.connect()
    final = FINAL.format(src=tmp_path / "in")
    want_windows = con.execute(
        f"SELECT auction, epoch_ms(time_bucket(INTERVAL 10 SECOND, ts)), count(*), sum(price), round(avg(price), 6), "
        f"max(price), min(price) FROM {final} GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    got_windows = summed(tmp_path / "out" / "windows",
                         "auction, epoch_ms(window_start), n, total, round(mean, 6), hi, lo, revision")
    assert [r[:-1] for r in got_windows] == want_windows
    assert max(r[-1] for r in got_windows) >= 1, "some window was revised after it fired"

    want_auctions = con.execute(
        f"SELECT auction, count(*), sum(price), max(price), min(price) FROM {final} GROUP BY ALL ORDER BY ALL").fetchall()
    assert summed(tmp_path / "out" / "auctions", "auction, n, total, hi, lo") == want_auctions

    letters = con.execute(
        f"SELECT source, raw, reason FROM read_json('{tmp_path}/ckpt/dead-letters/epoch=*/*.json')"
    ).fetchall()
    assert len(letters) == 5
    for source, raw, reason in letters:
        assert source == "changes" and json.loads(raw)["_op"] == "upsert"
        assert reason == "field '_op': expected one of +I, +U, -U, -D, INSERT, DELETE, got upsert"


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "first", "input": "slim", "dedup": {"key": "auction", "time": "ts", "ttl": "1m"}},
         "step 'first': dedup cannot take the revisions of input 'slim' (its rows carry _diff): its kernel does not take rows back"),
        ({"name": "hi", "input": "slim", "aggregate": {"key": "auction", "aggregates": {"hi": "max_by(price, ts)"}}},
         "step 'hi': aggregate cannot take the revisions of input 'slim' (its rows carry _diff): "
         "hi=max_by(): only count, sum, avg, min and max can take a value back"),
        ({"name": "enrich", "input": "slim", "udf": {"function": "eddyline.examples.udfs:to_euro", "schema": "auction long"}},
         "step 'enrich': udf cannot take the revisions of input 'slim' (its rows carry _diff): declare '_diff bigint'"),
    ],
)
def test_a_step_that_cannot_take_rows_back_is_refused_before_anything_runs(spark, tmp_path: Path, step: dict, message: str) -> None:
    write_changes(tmp_path / "in", files=1)
    raw = spec(tmp_path / "in", tmp_path / "out", [step])
    raw["sinks"].append({"name": "extra", "input": step["name"], "files": {"path": str(tmp_path / "x")}})
    net = load_spec(raw)
    with pytest.raises(SpecError) as e:
        analyze(net, spark)
    assert str(e.value).startswith(message)


def test_a_revised_and_an_insert_only_input_union(spark, tmp_path: Path) -> None:
    """An insert-only input's rows weigh +1 next to a revised one's."""
    write_changes(tmp_path / "in", files=2)
    extra = tmp_path / "plain"
    extra.mkdir()
    (extra / "p.json").write_text(json.dumps({"auction": 99, "price": 50, "ts": "2026-01-01T00:00:01Z"}) + "\n")
    net = spec(tmp_path / "in", tmp_path / "out", [
        {"name": "both", "union": ["slim", "plain_rows"]},
        {"name": "count_all", "input": "both", "aggregate": {"key": "auction", "aggregates": {"n": "count(*)"}}},
    ])
    net["sources"].append({"name": "plain", "files": {"path": str(extra), "format": "json", "schema": "auction long, price long, ts timestamp"}})
    net["steps"].insert(0, {"name": "plain_rows", "input": "plain", "select": ["auction", "price", "ts"]})
    net["sinks"].append({"name": "c", "input": "count_all", "files": {"path": str(tmp_path / "out" / "c"), "format": "parquet"}})
    Engine(load_spec(net), spark, str(tmp_path / "ckpt")).run(until_idle=True)
    con = duckdb.connect()
    want = con.execute(
        f"SELECT auction, count(*) FROM (SELECT auction FROM {FINAL.format(src=tmp_path / 'in')} UNION ALL SELECT 99) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert summed(tmp_path / "out" / "c", "auction, n") == want


def test_resident_lanes_weigh_revisions_and_word_their_dead_letters_as_jobs_do(spark, tmp_path: Path) -> None:
    """A source of Flink-style changes (``_op``) and one of ``_diff`` weights given as doubles
    (2.5, 0 and a null are no weights) through filters, selects and aggregates: ``auto`` runs the
    network on resident lanes, which weigh the rows as a Spark job does (an INT weight from
    ``_op``, a BIGINT from ``_diff``), and the sinks' rows and the dead letters equal a job's."""
    write_changes(tmp_path / "in", files=2)
    (tmp_path / "weights").mkdir()
    lines = [{"auction": a, "price": 10 * a, "ts": f"2026-01-01T00:00:0{a % 10}Z", "_diff": d}
             for a, d in enumerate([1.0, -1.0, 2.5, 0.0, None, 3.0, 1e10, -2.0])]
    (tmp_path / "weights" / "w.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = {}
    for execution in ("job", "auto"):
        out = tmp_path / execution
        raw = spec(tmp_path / "in", out, [
            {"name": "weighed", "input": "weights", "filter": "price < 70"},
            {"name": "per_price", "input": "weighed", "aggregate": {"key": "price", "aggregates": {"n": "count(*)"}}}])
        raw["execution"] = execution
        raw["steps"] = [s for s in raw["steps"] if s["name"] != "windows"]  # (windows weigh revisions in Spark)
        raw["sources"].append({"name": "weights", "files": {"path": str(tmp_path / "weights"), "format": "json",
                                                            "schema": "auction long, price long, ts timestamp, _diff double"}})
        raw["sinks"] = [raw["sinks"][1],
                        {"name": "s", "input": "slim", "files": {"path": str(out / "slim"), "format": "parquet"}},
                        {"name": "p", "input": "per_price", "files": {"path": str(out / "prices"), "format": "parquet"}}]
        engine = Engine(load_spec(raw), spark, str(tmp_path / f"{execution}-ckpt"))
        summary = engine.run(until_idle=True)
        assert engine.executor.mode == ("job" if execution == "job" else "resident"), engine.executor.why
        con = duckdb.connect()
        got[execution] = (
            [con.execute(f"SELECT * EXCLUDE (epoch) FROM read_parquet('{out / what}/epoch=*/*.parquet') ORDER BY ALL").fetchall()
             for what in ("auctions", "slim", "prices")],
            [con.execute(f"DESCRIBE SELECT * FROM read_parquet('{out / what}/epoch=*/*.parquet')").fetchall()
             for what in ("slim", "prices")],
            sorted(con.execute(f"SELECT * EXCLUDE (epoch) FROM read_json('{tmp_path}/{execution}-ckpt/dead-letters/epoch=*/*.json', "
                               "columns={source: 'VARCHAR', file: 'VARCHAR', line: 'BIGINT', raw: 'VARCHAR', "
                               "reason: 'VARCHAR'})").fetchall(), key=str),
            summary.dead_letters)
    (rows, types, letters, dead) = got["job"]
    assert all(len(r) > 2 for r in rows) and len(letters) == dead == 2 + 3  # 2 "_op: upsert", 2.5, 0 and null
    assert [letter[3:5] for letter in letters if letter[0] == "weights"] == [  # (the columns the steps read)
        ('{"price":20,"_diff":2.5}', "field '_diff': expected a non-zero integer weight, got 2.5"),
        ('{"price":30,"_diff":0.0}', "field '_diff': expected a non-zero integer weight, got 0.0"),
        ('{"price":40}', "field '_diff': expected a non-zero integer weight, got null")], letters
    assert got["auto"] == got["job"]
