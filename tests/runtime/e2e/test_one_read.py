"""A join whose two inputs are filters and selects of one source reads that source once an epoch
(:mod:`eddyline.plan.branches`), and gives what it gives when each input reads a source of its
own: the same pairs, the same watermarks, the same dead letters."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import duckdb

from eddyline.api.validate import load_spec
from eddyline.observe.progress import ProgressReporter
from eddyline.runtime.compile import physical_plans
from eddyline.runtime.engine import Engine
from tests.runtime.e2e.helpers import T0

DDL = "kind string, auction long, price long, ts timestamp"
FILES = 4


def _write(directory: Path) -> int:
    """Auctions and bids, one file an epoch, time moving on file by file; returns bad lines."""
    directory.mkdir(parents=True)
    bad = 0
    for f in range(FILES):
        lines = []
        for i in range(120):
            t = T0 + timedelta(seconds=f * 6 + i * 0.05 - (i % 7) * 0.3)
            stamp = t.isoformat().replace("+00:00", "Z")
            if i % 10 == 0:  # auctions run ahead of bids: the bids hold the join's watermark back
                ahead = (t + timedelta(seconds=2)).isoformat().replace("+00:00", "Z")
                lines.append({"kind": "a", "auction": f * 100 + i // 10, "price": None, "ts": ahead})
            else:
                lines.append({"kind": "b", "auction": f * 100 + (i * 7) % 12 - 2 * (i % 3), "price": (i * 13) % 50, "ts": stamp})
        text = [json.dumps(x) for x in lines]
        text.insert(33, '{"kind": "b", "auction": "seven", "price": 1, "ts": "2026-01-01T00:00:00Z"}')
        bad += 1
        (directory / f"ev-{f}.json").write_text("\n".join(text) + "\n")
    return bad


def _spec(src: Path, out: Path, *, second_source: Path | None) -> dict:
    sources = [{"name": "events", "files": {"path": str(src), "format": "json", "schema": DDL, "max_files_per_epoch": 1}}]
    if second_source is not None:
        sources.append({"name": "events2", "files": {"path": str(second_source), "format": "json", "schema": DDL,
                                                     "max_files_per_epoch": 1}})
    return {
        "name": "one-read", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": sources,
        "steps": [
            {"name": "auctions", "input": "events", "filter": "kind = 'a'"},
            {"name": "a", "input": "auctions", "select": ["auction AS id", "ts AS a_ts", "ts + INTERVAL 10 SECONDS AS expires"]},
            {"name": "bids", "input": "events2" if second_source else "events", "filter": "Kind = 'b' AND price > 10"},
            {"name": "b", "input": "bids", "select": ["AUCTION AS auction", "price * 2 AS doubled", "ts"]},
            {"name": "pairs", "join": {"left": "a", "right": "b", "left_key": "id", "right_key": "auction",
                                       "kind": "interval", "left_time": "a_ts", "left_end": "expires",
                                       "right_time": "ts", "watermark_delay": "3s"}},
        ],
        "sinks": [{"name": "out", "input": "pairs", "files": {"path": str(out / "pairs"), "format": "parquet"}}],
    }


def _run(spark, tmp: Path, name: str, second_source: Path | None) -> tuple[list[tuple], list, int, str]:
    out = tmp / name
    raw = _spec(tmp / "in", out, second_source=second_source)
    spec = load_spec(raw)
    plan = physical_plans(spec, spark, 2)["out"]
    out.mkdir()
    with ProgressReporter(live=False, json_path=str(out / "progress.jsonl")) as rep:
        Engine(spec, spark, str(out / "ckpt"), reporter=rep).run(until_idle=True)
    pairs = duckdb.connect().execute(
        f"SELECT id, epoch_us(a_ts), epoch_us(expires), auction, doubled, epoch_us(ts) FROM read_parquet('{out}/pairs/**/*.parquet') ORDER BY ALL").fetchall()
    marks = [json.loads(x)["eventTime"]["watermark"] for x in (out / "progress.jsonl").read_text().splitlines()]
    bad = duckdb.connect().execute(f"SELECT count(*) FROM read_json_auto('{out}/ckpt/dead-letters/*/*.json')").fetchone()[0]
    return pairs, marks, bad, plan


def test_a_join_of_two_branches_of_one_source_reads_it_once_and_gives_what_two_reads_give(spark, tmp_path: Path) -> None:
    bad = _write(tmp_path / "in")
    shutil.copytree(tmp_path / "in", tmp_path / "in2")
    one, one_marks, one_bad, one_plan = _run(spark, tmp_path, "one", None)
    two, two_marks, two_bad, two_plan = _run(spark, tmp_path, "two", tmp_path / "in2")

    # one read of the source, its rows made into the join's two inputs in one pass
    assert "Generate explode" in one_plan and one_plan.count("MapInArrow") == 2, one_plan
    assert "Generate" not in two_plan and two_plan.count("MapInArrow") == 3, two_plan

    expected = duckdb.connect().execute(f"""
        WITH ev AS (SELECT * FROM read_json('{tmp_path}/in/*.json', columns={{kind: 'VARCHAR', auction: 'VARCHAR',
                      price: 'BIGINT', ts: 'TIMESTAMP'}}) WHERE TRY_CAST(auction AS BIGINT) IS NOT NULL)
        SELECT CAST(a.auction AS BIGINT), epoch_us(a.ts), epoch_us(a.ts + INTERVAL 10 SECONDS), CAST(b.auction AS BIGINT),
               b.price * 2, epoch_us(b.ts)
        FROM ev a JOIN ev b ON a.auction = b.auction AND b.ts BETWEEN a.ts AND a.ts + INTERVAL 10 SECONDS
        WHERE a.kind = 'a' AND b.kind = 'b' AND b.price > 10 ORDER BY ALL""").fetchall()
    assert len(expected) > 50
    assert one == two == expected
    # the join's watermark moved epoch by epoch as it does when each input is read on its own
    assert one_marks == two_marks and len({m for m in one_marks if m}) >= 3, one_marks
    assert one_bad == bad and two_bad == 2 * bad  # the second copy's bad lines are its own


def test_a_union_of_two_branches_of_one_source_reads_it_once(spark, tmp_path: Path) -> None:
    _write(tmp_path / "in")
    raw = {
        "name": "one-read-union", "trigger": 0, "lanes": 2,
        "sources": [{"name": "events", "files": {"path": str(tmp_path / "in"), "format": "json", "schema": DDL,
                                                 "max_files_per_epoch": 1}}],
        "steps": [
            {"name": "cheap", "input": "events", "filter": "kind = 'b' AND price < 10"},
            {"name": "c", "input": "cheap", "select": ["auction", "price", "'cheap' AS why"]},
            {"name": "dear", "input": "events", "filter": "kind = 'b' AND price >= 40"},
            {"name": "d", "input": "dear", "select": ["auction", "price", "'dear' AS why"]},
            {"name": "both", "union": ["c", "d"]},
        ],
        "sinks": [{"name": "out", "input": "both", "files": {"path": str(tmp_path / "out"), "format": "parquet"}}],
    }
    spec = load_spec(raw)
    plan = physical_plans(spec, spark, 2)["out"]
    assert "Generate explode" in plan and plan.count("MapInArrow") == 1, plan
    Engine(spec, spark, str(tmp_path / "ckpt")).run(until_idle=True)
    got = duckdb.connect().execute(
        f"SELECT auction, price, why FROM read_parquet('{tmp_path}/out/**/*.parquet') ORDER BY ALL").fetchall()
    expected = duckdb.connect().execute(f"""
        SELECT CAST(auction AS BIGINT), price, CASE WHEN price < 10 THEN 'cheap' ELSE 'dear' END
        FROM read_json('{tmp_path}/in/*.json', columns={{kind: 'VARCHAR', auction: 'VARCHAR', price: 'BIGINT', ts: 'VARCHAR'}})
        WHERE TRY_CAST(auction AS BIGINT) IS NOT NULL AND kind = 'b' AND (price < 10 OR price >= 40) ORDER BY ALL""").fetchall()
    assert len(expected) > 50 and got == expected
