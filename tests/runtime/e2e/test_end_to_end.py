"""End to end on local Spark: exact results, lane changes, dead letters, late rows, replay."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from eddyline.api.validate import load_spec
from eddyline.runtime.checkpoint import Checkpoint

from .drivers import run
from .helpers import bids_window_spec, duckdb_windows, read_windows, write_bid_files

#: the tests of exactly-once output run on both: a Spark job an epoch, and resident lanes
#: (docs/execution.md), which must give the same
BOTH = pytest.mark.parametrize("execution", ["job", "resident"])


@BOTH
def test_files_network_matches_duckdb(spark, tmp_path: Path, execution: str) -> None:
    write_bid_files(tmp_path / "in", files=6, rows=300)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out", execution=execution)
    summary = run(spec, spark, tmp_path / "ckpt", until_idle=True)
    assert summary.input_rows == 6 * 300
    got = read_windows(tmp_path / "out")
    want = duckdb_windows(tmp_path / "in")
    assert len(want) > 100
    assert got == want
    progress = [json.loads(x) for x in Path(str(tmp_path / "ckpt") + ".progress.jsonl").read_text().splitlines()]
    assert progress[-1]["endOfStream"] is True
    assert sum(p["sinks"][0]["numOutputRows"] for p in progress) == len(want)
    assert {"batchId", "numInputRows", "inputRowsPerSecond", "processedRowsPerSecond", "durationMs",
            "eventTime", "stateOperators", "sources"} <= set(progress[0])


def test_cumulative_windows_match_duckdb(spark, tmp_path: Path) -> None:
    """CUMULATE(step 2 s, size 10 s) on Spark (windows assigned in the JVM, fired by the lanes)."""
    write_bid_files(tmp_path / "in", files=4, rows=200)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    raw = spec.as_dict()
    raw["steps"][1]["window_aggregate"]["window"] = {"size": "10s", "step": "2s"}
    run(load_spec(raw), spark, tmp_path / "ckpt", until_idle=True)
    con = duckdb.connect()
    got = con.execute(f"SELECT auction, epoch_ms(window_start), epoch_ms(window_end), n, total, hi, revision "
                      f"FROM read_parquet('{tmp_path}/out/epoch=*/*.parquet') ORDER BY ALL").fetchall()
    want = con.execute(f"""
        WITH r AS (SELECT auction, price, epoch_ms(ts) AS t FROM read_json('{tmp_path}/in/*.json',
                     columns={{auction: 'BIGINT', price: 'BIGINT', ts: 'TIMESTAMP'}}) WHERE price >= 100),
        w AS (SELECT *, (t // 10000) * 10000 AS s, (t // 10000) * 10000 + i * 2000 AS e FROM r, range(1, 6) g(i)
              WHERE (t // 10000) * 10000 + i * 2000 > t)
        SELECT auction, s, e, count(*), sum(price), max(price), 0 FROM w GROUP BY auction, s, e ORDER BY ALL""").fetchall()
    assert len(want) > 100 and got == want


@BOTH
def test_restore_with_other_lane_count_gives_identical_output(spark, tmp_path: Path, execution: str) -> None:
    write_bid_files(tmp_path / "in", files=6, rows=200, seed=3)
    ref_spec = bids_window_spec(tmp_path / "in", tmp_path / "ref")
    run(ref_spec, spark, tmp_path / "ref-ckpt", until_idle=True)

    spec = bids_window_spec(tmp_path / "in", tmp_path / "out", execution=execution)
    counts = (2, 3, 1) if execution == "job" else (2, 1, 2)  # (a resident lane holds one of local[2]'s slots)
    run(spec, spark, tmp_path / "ckpt", epochs=3, lanes=counts[0])
    run(spec, spark, tmp_path / "ckpt", epochs=2, lanes=counts[1])
    run(spec, spark, tmp_path / "ckpt", until_idle=True, lanes=counts[2])
    routing = [c.steps["per_auction"].routing for c in Checkpoint(str(tmp_path / "ckpt")).commits()]
    assert {r["lanes"] for r in routing} == set(counts)
    assert read_windows(tmp_path / "out") == read_windows(tmp_path / "ref") == duckdb_windows(tmp_path / "in")


def test_dead_letters_carry_reason_and_offset_and_counts_add_up(spark, tmp_path: Path) -> None:
    bad = write_bid_files(tmp_path / "in", files=3, rows=100, bad_every=10)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    summary = run(spec, spark, tmp_path / "ckpt", until_idle=True)
    assert bad == 30
    assert summary.dead_letters == bad
    assert summary.input_rows + summary.dead_letters == 3 * 100 + bad
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT source, file, line, raw, reason FROM read_json('{tmp_path}/ckpt/dead-letters/epoch=*/*.json') ORDER BY file, line"
    ).fetchall()
    assert len(rows) == bad
    for source, file, line, raw, reason in rows:
        assert source == "bids" and file.startswith("bids-") and line > 0
        text = (tmp_path / "in" / file).read_text().splitlines()[line - 1]
        assert text == raw
        assert reason in ("not a valid JSON object", "field 'price': expected bigint, got cheap") or reason.startswith(
            "field 'auction': expected bigint"
        )
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")


def test_late_rows_are_counted_and_routed(spark, tmp_path: Path) -> None:
    """On resident lanes, which write their parts of the late target (the same as jobs write:
    tests/runtime/e2e/test_resident_mode.py; jobs' late rows against the lanes' count: below)."""
    write_bid_files(tmp_path / "in", files=5, rows=200, seed=5, disorder_ms=15_000)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out", late_dir=tmp_path / "late", execution="resident")
    summary = run(spec, spark, tmp_path / "ckpt", until_idle=True)
    assert summary.late_rows > 0
    con = duckdb.connect()
    late = con.execute(f"SELECT count(*), min(price) FROM read_parquet('{tmp_path}/late/epoch=*/*.parquet')").fetchone()
    assert late[0] == summary.late_rows and late[1] >= 100
    # Fully late rows lose both of their windows; partly late rows lose one. Nothing is invented.
    ref = {r[:2]: r[2] for r in duckdb_windows(tmp_path / "in")}
    got = read_windows(tmp_path / "out")
    assert all(r[:2] in ref and r[2] <= ref[r[:2]] for r in got)
    assert sum(ref.values()) - sum(r[2] for r in got) >= 2 * summary.late_rows


def test_without_a_late_target_the_lanes_drop_closed_windows_and_count_late_rows(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """Without a late target the window's plan holds no watermark, so it is built once for the
    run (once more when the epochs turn small); its lanes drop the windows closed before the epoch and count the late rows. Over the
    same disordered input that gives the windows and the count that splitting late rows off in
    the JVM (at the watermark in the plan, built every epoch) gives."""
    from eddyline.runtime.compile import EpochCompiler

    write_bid_files(tmp_path / "in", files=5, rows=200, seed=5, disorder_ms=15_000)
    built: list[str] = []
    step = EpochCompiler._step

    def counted(self, s, *args, **kwargs):
        built.append(f"{self.checkpoint.rsplit('/', 1)[-1]}:{s.name}")
        return step(self, s, *args, **kwargs)

    monkeypatch.setattr(EpochCompiler, "_step", counted)
    jvm = run(bids_window_spec(tmp_path / "in", tmp_path / "jvm", late_dir=tmp_path / "late"), spark,
              tmp_path / "jvm-ckpt", until_idle=True)
    lanes = run(bids_window_spec(tmp_path / "in", tmp_path / "lanes"), spark, tmp_path / "lanes-ckpt", until_idle=True)
    assert lanes.late_rows == jvm.late_rows > 0
    assert read_windows(tmp_path / "lanes") == read_windows(tmp_path / "jvm")
    epochs = len(Checkpoint(str(tmp_path / "jvm-ckpt")).commits())
    # built for the first epoch, and again for the second: the first that follows a small one
    assert built.count("lanes-ckpt:per_auction") == 2 and built.count("jvm-ckpt:per_auction") == epochs > 2


def test_allowed_lateness_revises_windows(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=5, rows=200, seed=5, disorder_ms=30_000)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out", lateness="60s")
    summary = run(spec, spark, tmp_path / "ckpt", until_idle=True)
    assert summary.late_rows == 0
    got = read_windows(tmp_path / "out")
    assert max(r[-1] for r in got) >= 1, "some windows must have been revised"
    latest = {}
    for r in got:
        if r[:2] not in latest or latest[r[:2]][-1] < r[-1]:
            latest[r[:2]] = r
    assert sorted(r[:-1] for r in latest.values()) == [r[:-1] for r in duckdb_windows(tmp_path / "in")]


@BOTH
def test_replaying_a_committed_epoch_plan_rewrites_identical_output(spark, tmp_path: Path, execution: str) -> None:
    """Delete the newest commit: the engine replays that plan and publishes the same files."""
    write_bid_files(tmp_path / "in", files=3, rows=200, seed=9)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out", execution=execution)
    run(spec, spark, tmp_path / "ckpt", epochs=2)
    before = read_windows(tmp_path / "out")
    (tmp_path / "ckpt" / "commits" / f"{2:010d}.json").unlink()
    summary = run(spec, spark, tmp_path / "ckpt", epochs=1)
    assert summary.replayed == 1 and summary.last_epoch == 2
    assert read_windows(tmp_path / "out") == before


def test_new_files_are_picked_up_in_order_and_out_of_order_names_refused(spark, tmp_path: Path) -> None:
    import shutil

    from eddyline.errors import SourceError

    write_bid_files(tmp_path / "all", files=4, rows=100, seed=13)
    (tmp_path / "in").mkdir()
    for name in ("bids-0000.json", "bids-0001.json"):
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    first = run(spec, spark, tmp_path / "ckpt", epochs=2)  # one file per epoch
    assert first.input_rows == 200
    for name in ("bids-0002.json", "bids-0003.json"):
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    run(spec, spark, tmp_path / "ckpt", until_idle=True)
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "all")

    spec2 = bids_window_spec(tmp_path / "in2", tmp_path / "out2")
    (tmp_path / "in2").mkdir()
    shutil.copy(tmp_path / "all" / "bids-0002.json", tmp_path / "in2" / "bids-0002.json")
    run(spec2, spark, tmp_path / "ckpt2", epochs=1)
    shutil.copy(tmp_path / "all" / "bids-0001.json", tmp_path / "in2" / "bids-0001.json")
    with pytest.raises(SourceError, match=r"1 file\(s\) in .* sort before 'bids-0002.json', which was already read"):
        run(spec2, spark, tmp_path / "ckpt2", epochs=1)
