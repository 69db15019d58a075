"""Epochs sized by the backlog (issue #55): a directory of files waiting is read in epochs that
grow as they are measured, every file once; caught up, an epoch takes what arrives whole."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eddyline.api.validate import load_spec
from eddyline.control.catchup import ROWS_PER_BYTE_PRIOR
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine

FIRST_ROWS, FILES = 300, 20


def write_files(folder: Path, first: int, count: int, rows: int = 1_000) -> None:
    for i in range(first, first + count):
        rng = np.random.default_rng(i)
        pq.write_table(pa.table({"key": rng.integers(0, 500, rows), "value": rng.integers(0, 100, rows)}),
                       folder / f"{i:04d}.parquet")


def spec(data: Path, out: Path):
    return load_spec({
        "name": "catching-up", "trigger": 0, "lanes": 2,
        "sources": [{"name": "in", "files": {"path": str(data), "format": "parquet"}}],
        "steps": [{"name": "kept", "input": "in", "filter": "value >= 0"}],
        "sinks": [{"name": "out", "input": "kept", "files": {"path": str(out), "format": "parquet"}}],
        # a small first epoch that doubles: the growth is seen in a few small files
        "control": {"catch_up": {"first_rows": FIRST_ROWS, "growth": 2, "target": "60s"}},
    })


def totals(pattern: str) -> tuple[int, int]:
    return duckdb.connect().execute(f"SELECT count(*), sum(value) FROM read_parquet('{pattern}')").fetchone()


def test_a_backlog_of_files_is_read_in_growing_epochs_each_file_once_and_then_small_ones(spark, tmp_path: Path):
    data, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    data.mkdir()
    write_files(data, 0, FILES)
    engine = Engine(spec(data, out), spark, str(ckpt))
    engine.run(until_idle=True)
    c = Checkpoint(str(ckpt))
    last = c.latest_commit()
    assert last is not None
    plans = [c.read_plan(e) for e in range(1, last.epoch + 1)]
    taken = [len(p.sources["in"].get("files", [])) for p in plans if p.sources["in"]["end"] > p.sources["in"]["start"]]
    # The first epoch takes the files whose bytes, at the prior's rows per byte, add up to
    # first_rows; then each may read twice the rows of the one before (1,000 a file), as many
    # whole files as the rows per byte measured so far say fit, until the rest fits one epoch.
    sizes = np.cumsum([f.stat().st_size for f in sorted(data.iterdir())]) * ROWS_PER_BYTE_PRIOR["parquet"]
    first = max(1, int(np.searchsorted(sizes, FIRST_ROWS, side="right")))
    rows = [1_000 * n for n in taken]
    decided = [d for p in plans for d in p.decisions if d["kind"] == "catch_up"]
    assert [d["epoch"] for d in decided] == list(range(1, len(taken)))  # all but the last, which fit
    assert taken[0] == first and len(taken) >= 4, taken
    for i in range(1, len(decided)):
        allowed = decided[i]["action"]["takeRows"]
        assert decided[i]["why"]["boundedBy"] == "growth" and allowed == 2 * max(rows[i - 1], FIRST_ROWS)
        assert rows[i - 1] < rows[i] <= allowed and decided[i]["action"]["caps"] == {"in": taken[i]}
    assert sum(taken) == FILES
    assert totals(str(out / "epoch=*" / "*.parquet")) == totals(str(data / "*.parquet"))

    write_files(data, FILES, 2)  # caught up: what arrives fits one epoch, taken whole, no decision
    engine.run(until_idle=True)
    after = c.latest_commit()
    assert after is not None
    plans = [c.read_plan(e) for e in range(last.epoch + 1, after.epoch + 1)]
    reads = [p for p in plans if p.sources["in"]["end"] > p.sources["in"]["start"]]
    assert len(reads) == 1 and len(reads[0].sources["in"]["files"]) == 2
    assert not [d for p in plans for d in p.decisions if d["kind"] == "catch_up"]
    assert totals(str(out / "epoch=*" / "*.parquet")) == totals(str(data / "*.parquet"))


def test_a_source_with_a_cap_of_its_own_keeps_it(spark, tmp_path: Path):
    data, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    data.mkdir()
    write_files(data, 0, 6)
    raw = spec(data, out).as_dict()
    raw["sources"][0]["files"]["max_files_per_epoch"] = 3
    engine = Engine(load_spec(raw), spark, str(ckpt))
    engine.run(until_idle=True)
    c = Checkpoint(str(ckpt))
    plans = [c.read_plan(e) for e in range(1, c.latest_commit().epoch + 1)]
    assert [len(p.sources["in"].get("files", [])) for p in plans if p.sources["in"].get("files")] == [3, 3]
    assert not [d for p in plans for d in p.decisions if d["kind"] == "catch_up"]


def test_with_overload_control_its_admission_sizes_the_epochs_instead(spark, tmp_path: Path):
    data, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    data.mkdir()
    write_files(data, 0, 6)
    raw = spec(data, out).as_dict()
    raw["control"]["overload"] = {"shedding": "off"}
    raw["sinks"][0]["qos"] = {"latency": "60s"}
    Engine(load_spec(raw), spark, str(ckpt)).run(until_idle=True)
    c = Checkpoint(str(ckpt))
    plans = [c.read_plan(e) for e in range(1, c.latest_commit().epoch + 1)]
    assert [len(p.sources["in"].get("files", [])) for p in plans if p.sources["in"].get("files")] == [6]
    assert not [d for p in plans for d in p.decisions if d["kind"] == "catch_up"]
    assert totals(str(out / "epoch=*" / "*.parquet")) == totals(str(data / "*.parquet"))
