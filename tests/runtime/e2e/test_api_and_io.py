"""The Python API end to end, other file formats, URI checkpoints, retention, explain."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

import eddyline
from eddyline.plan.explain import explain
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.compile import physical_plans
from eddyline.runtime.engine import Engine

from .helpers import bids_window_spec, duckdb_windows, read_windows, write_bid_files


def test_python_api_memory_and_console_sinks_with_union(spark, tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, offset in ((a, 0), (b, 1000)):
        d.mkdir()
        pq.write_table(
            pa.table({"k": [offset + i % 3 for i in range(30)], "v": list(range(30)),
                      "ts": pa.array([i * 1_000_000 for i in range(30)], pa.timestamp("us", tz="UTC"))}),
            d / "part-0.parquet",
        )
    net = eddyline.Network("api", trigger=0, lanes=2, key_groups=8)
    left = net.source("left", eddyline.Files(str(a)))
    right = net.source("right", eddyline.Files(str(b)))
    both = left.union(right).select("k", "v * 2 AS v2", "ts")
    both.filter("v2 >= 10").to(eddyline.Console(rows=5))
    (both.window_aggregate(time="ts", window=eddyline.tumbling("10s"), aggregates={"n": "count(*)", "s": "sum(v2)"})
         .to(eddyline.Memory(), name="totals"))
    summary = net.run(str(tmp_path / "ckpt"), until_idle=True, spark=spark)
    assert summary.input_rows == 60
    got = net.collected("totals").sort_by("window_start").to_pydict()
    assert got["n"] == [20, 20, 20]  # three global 10 s windows, both sources
    assert got["s"] == [2 * 2 * sum(range(10)), 2 * 2 * sum(range(10, 20)), 2 * 2 * sum(range(20, 30))]
    printed = capsys.readouterr().out
    assert "· epoch 1" in printed and "v2" in printed  # the console sink's table
    assert summary.output_rows["totals"] == 3


def test_csv_source_and_dead_letters(spark, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.csv").write_text("1,100,2026-01-01T00:00:01Z\n2,x,2026-01-01T00:00:02Z\n3,300\n4,400,2026-01-01T00:00:04Z\n")
    net = eddyline.Network("csv", trigger=0, lanes=1)
    rows = net.source("rows", eddyline.Files(str(src), format="csv", schema="id long, v long, ts timestamp"))
    rows.to(eddyline.Memory(), name="out")
    summary = net.run(str(tmp_path / "ckpt"), until_idle=True, spark=spark)
    assert sorted(net.collected("out").column("id").to_pylist()) == [1, 4]
    assert summary.dead_letters == 2
    dead = duckdb.connect().execute(
        f"SELECT line, reason FROM read_json('{tmp_path}/ckpt/dead-letters/*/*.json') ORDER BY line"
    ).fetchall()
    assert dead == [(2, "field 'v': expected bigint, got x"),
                    (3, "expected 3 CSV fields, got 2")]


def test_csv_written_by_a_files_sink_reads_back_unchanged(spark, tmp_path: Path) -> None:
    """RFC 4180 both ways: quotes, commas, backslashes, the empty string and null survive a
    files sink's CSV (with its header line) read by a files source with ``header: true``."""
    texts = ['say "hi"', "a,b", "back\\slash", "", None, "plain"]
    pq.write_table(pa.table({"id": list(range(len(texts))), "s": texts}), tmp_path / "in.parquet")
    (tmp_path / "src").mkdir()
    (tmp_path / "in.parquet").rename(tmp_path / "src" / "in.parquet")
    write = eddyline.Network("csv-out", trigger=0, lanes=1)
    write.source("rows", eddyline.Files(str(tmp_path / "src"))).to(
        eddyline.Files(str(tmp_path / "csv"), format="csv"), name="out")
    write.run(str(tmp_path / "ck1"), until_idle=True, spark=spark)
    written = next((tmp_path / "csv").glob("epoch=*/*.csv")).read_text()
    assert written.startswith("id,s\n") and '"say ""hi"""' in written
    read = eddyline.Network("csv-in", trigger=0, lanes=1)
    read.source("rows", eddyline.Files(str(next((tmp_path / "csv").glob("epoch=*"))), format="csv",
                                       schema="id long, s string", header=True)).to(eddyline.Memory(), name="got")
    summary = read.run(str(tmp_path / "ck2"), until_idle=True, spark=spark)
    assert summary.dead_letters == 0
    assert sorted(read.collected("got").to_pylist(), key=lambda r: r["id"]) == [
        {"id": i, "s": t} for i, t in enumerate(texts)]


def test_uri_checkpoint_and_retention(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=24, rows=40, seed=2)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    engine = Engine(spec, spark, f"file://{tmp_path}/ckpt", retain_epochs=5)
    summary = engine.run(until_idle=True)
    assert summary.epochs >= 24
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")
    ckpt = Checkpoint(f"file://{tmp_path}/ckpt")
    kept = [c.epoch for c in ckpt.commits()]
    assert len(kept) <= 5 + 4 and kept[-1] == summary.last_epoch
    live = {(seg[0], seg[1]) for c in ckpt.commits() for chain in c.steps["per_auction"].index.values() for seg in chain}
    files = list((tmp_path / "ckpt" / "state" / "per_auction").glob("*.arrow"))
    # only files some retained commit still uses, plus those of epochs since the last cleanup
    assert all((int(f.stem.split("-")[0]), int(f.stem.split("-")[1])) in live or int(f.stem.split("-")[0]) > kept[0] for f in files)
    assert len(files) < 2 * summary.epochs


def test_a_history_duration_keeps_every_epoch_committed_within_it(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=8, rows=20, seed=3)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out").model_copy(update={"history_duration": 3_600_000})
    summary = Engine(spec, spark, str(tmp_path / "ckpt"), retain_epochs=2).run(until_idle=True)
    assert summary.last_epoch >= 8
    assert [c.epoch for c in Checkpoint(str(tmp_path / "ckpt")).commits()] == list(range(1, summary.last_epoch + 1))
    short = spec.model_copy(update={"history_duration": 1})  # 1 ms: only the last 2 epochs' worth
    Engine(short, spark, str(tmp_path / "ckpt2"), retain_epochs=2).run(until_idle=True)
    assert len(Checkpoint(str(tmp_path / "ckpt2")).commits()) <= 3
    # a byte cap wins over both: with none to spare only the newest two commits (and their state) stay
    capped = spec.model_copy(update={"history_bytes": 0})
    last = Engine(capped, spark, str(tmp_path / "ckpt3")).run(until_idle=True).last_epoch
    assert [c.epoch for c in Checkpoint(str(tmp_path / "ckpt3")).commits()] == [last - 1, last]
    kept = {int(p.name[:10]) for p in (tmp_path / "ckpt3" / "state" / "per_auction").glob("*.arrow")}
    read = {seg[0] for c in Checkpoint(str(tmp_path / "ckpt3")).commits()
            for chain in c.steps["per_auction"].index.values() for seg in chain}
    assert kept == read
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")


def test_explain_shows_jvm_steps_kernels_and_lanes(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=1, rows=5)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out", lanes=3)
    text = explain(spec, 3, physical_plans(spec, spark, 3))
    assert "filter  price >= 100   [Spark SQL, JVM]" in text
    assert "lane 0 ← key groups 0–10" in text and "lane 2 ← key groups 22–31" in text
    assert "MapInArrow" in text and "Exchange hashpartitioning(CASE WHEN (_kg" in text  # the routing value
    assert "HashAggregate" in text  # partial aggregation before the lane shuffle


def test_a_discard_sink_counts_its_rows_and_keeps_none(spark, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"k": list(range(50))}), src / "part-0.parquet")
    net = eddyline.Network("discard", trigger=0, lanes=1)
    net.source("rows", eddyline.Files(str(src))).filter("k % 5 = 0").to(eddyline.Discard(), name="gone")
    summary = net.run(str(tmp_path / "ckpt"), until_idle=True, spark=spark)
    assert summary.input_rows == 50
    assert summary.output_rows["gone"] == 10
