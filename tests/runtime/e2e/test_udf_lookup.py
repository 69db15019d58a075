"""The udf step (Arrow and pandas, with errors that name the step) and the lookup join."""

from __future__ import annotations

import os
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eddyline.api.validate import load_spec
from eddyline.errors import EngineError, SpecError
from eddyline.io.memory import MemorySink
from eddyline.runtime.engine import Engine


def bids_dir(path: Path, files: int, price_of=lambda f, i: f * 1000 + i) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        pq.write_table(pa.table({
            "auction": pa.array([i % 5 for i in range(20)], pa.int64()),
            "price": pa.array([price_of(f, i) for i in range(20)], pa.int64()),
        }), path / f"bids-{f:03d}.parquet")
    return path


def network(src: Path, step: dict, lanes: int = 2) -> object:
    return load_spec({
        "name": "n", "trigger": 0, "lanes": lanes,
        "sources": [{"name": "bids", "files": {"path": str(src), "max_files_per_epoch": 1}}],
        "steps": [{"name": "s", "input": "bids", **step}],
        "sinks": [{"name": "out", "input": "s", "memory": {}}],
    })


def run(spec, spark, ckpt: Path, **kw) -> tuple[pa.Table, object]:
    sinks = {"out": MemorySink(spec.sinks[0])}
    summary = Engine(spec, spark, str(ckpt), sinks=sinks).run(**kw)
    return sinks["out"].table(), summary


def test_udf_arrow_and_pandas(spark, tmp_path: Path) -> None:
    src = bids_dir(tmp_path / "in", 2)
    out, _ = run(network(src, {"udf": {"function": "eddyline.examples.udfs:to_euro", "schema": "auction long, price long"}}),
                 spark, tmp_path / "c1", until_idle=True)
    assert sorted(out.column("price").to_pylist()) == sorted(int((f * 1000 + i) * 0.908) for f in range(2) for i in range(20))
    out, _ = run(network(src, {"udf": {"function": "eddyline.examples.udfs:price_band", "batch": "pandas",
                                         "schema": "auction long, price long, band long"}}), spark, tmp_path / "c2", until_idle=True)
    assert sorted(out.column("band").to_pylist()) == sorted(int(p >= 1000) for p in [f * 1000 + i for f in range(2) for i in range(20)])


def test_udf_errors_name_step_and_function(spark, tmp_path: Path) -> None:
    src = bids_dir(tmp_path / "in", 1, price_of=lambda f, i: -i)
    spec = network(src, {"udf": {"function": "eddyline.examples.udfs:to_euro", "schema": "auction long, price long"}})
    with pytest.raises(EngineError, match=r"epoch 1: step 's': udf 'eddyline.examples.udfs:to_euro' failed on a batch of \d+ rows: ValueError: negative price"):
        run(spec, spark, tmp_path / "c", until_idle=True)
    bad = network(src, {"udf": {"function": "eddyline.examples.udfs:nothing", "schema": "a long"}})
    with pytest.raises(SpecError, match="step 's': udf.function: module 'eddyline.examples.udfs' has no function 'nothing'"):
        Engine(bad, spark, str(tmp_path / "c3")).run(until_idle=True)


def test_lookup_join_reloads_and_replays_the_version_it_saw(spark, tmp_path: Path) -> None:
    src = bids_dir(tmp_path / "in", 3)
    table = tmp_path / "auctions"
    table.mkdir()

    def write_table(category_offset: int) -> None:
        pq.write_table(pa.table({"id": pa.array(range(4), pa.int64()),
                                 "category": pa.array([category_offset + i for i in range(4)], pa.int64())}), table / "t.parquet")
        stamp = time.time() + category_offset  # make the change visible to the fingerprint
        os.utime(table / "t.parquet", (stamp, stamp))

    write_table(10)
    spec = network(src, {"lookup": {"table": {"path": str(table)}, "key": "auction", "table_key": "id", "how": "inner"}})
    first, _ = run(spec, spark, tmp_path / "ckpt", epochs=1)
    write_table(20)
    rest, _ = run(spec, spark, tmp_path / "ckpt", until_idle=True)
    con = duckdb.connect()
    con.register("first", first)
    con.register("rest", rest)
    assert con.execute("SELECT min(category), max(category), count(*) FROM first").fetchone() == (10, 13, 16)  # auction 4 has no row
    assert con.execute("SELECT min(category), max(category), count(*) FROM rest").fetchone() == (20, 23, 32)
    # replaying epoch 1 after the table changed joins against the version epoch 1 saw
    (tmp_path / "ckpt" / "commits").joinpath(f"{1:010d}.json").rename(tmp_path / "c1.json")
    for later in (tmp_path / "ckpt" / "commits").glob("*.json"):
        later.unlink()
    for plan in (tmp_path / "ckpt" / "plans").glob("*.json"):
        if plan.name != f"{1:010d}.json":
            plan.unlink()
    again, summary = run(spec, spark, tmp_path / "ckpt", epochs=1)
    assert summary.replayed == 1
    assert sorted(again.column("category").to_pylist()) == sorted(first.column("category").to_pylist())
