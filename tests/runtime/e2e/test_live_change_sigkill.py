"""Changes to a running network through the CLI, with the driver process SIGKILLed around each:
a control line changes a filter at epoch 3 (killed after that epoch published, before it
committed), then ``eddyline apply`` puts a new version of the udf in force at epoch 4 (killed
once the plan that applies it is logged); the driver is each time restarted with its original
command line. Every epoch's output is what the parameters and the function in force at that
epoch make of its input: the filter stays changed across the new network, the new function runs
from epoch 4 exactly. The runs alternate between per-epoch jobs and resident lanes (a count per
auction of the function's rows keeps lanes resident; its changelog adds up to the rows kept), so
each replays what a run of the other mode left."""

from __future__ import annotations

import copy
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml
from typer.testing import CliRunner

from eddyline.api.validate import load_spec
from eddyline.cli import app
from eddyline.examples.udfs import EUR_PER_USD
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine

from .helpers import BIDS_DDL, write_bid_files

pytestmark = pytest.mark.slow

FILES = 6


def network(src: Path, out: Path) -> dict:
    return {
        "name": "changed-live", "trigger": 0, "lanes": 2, "key_groups": 8,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "json", "schema": BIDS_DDL, "max_files_per_epoch": 1}}],
        "steps": [
            {"name": "expensive", "input": "bids", "filter": "price >= 100"},
            {"name": "priced", "input": "expensive", "udf": {
                "function": "eddyline.examples.udfs:to_euro", "schema": BIDS_DDL}},
            {"name": "per_auction", "input": "priced", "aggregate": {"key": "auction", "aggregates": {"n": "count(*)"}}},
        ],
        "sinks": [{"name": "rows", "input": "priced", "files": {"path": str(out / "rows"), "format": "parquet"}},
                  {"name": "counts", "input": "per_auction", "files": {"path": str(out / "counts"), "format": "parquet"}}],
    }


def test_a_control_line_and_a_new_udf_version_under_sigkills(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=FILES, rows=40)
    first = network(tmp_path / "in", tmp_path / "out")
    second = copy.deepcopy(first)
    second["steps"][1]["udf"] = {"function": "eddyline.examples.udfs:price_band", "batch": "pandas",
                                 "schema": f"{BIDS_DDL}, band long"}
    spec, resident, new = tmp_path / "net.yaml", tmp_path / "net-resident.yaml", tmp_path / "new.yaml"
    spec.write_text(yaml.safe_dump(first))
    resident.write_text(yaml.safe_dump({**first, "execution": "resident"}))  # (the same network, run resident)
    new.write_text(yaml.safe_dump(second))
    ckpt = str(tmp_path / "ckpt")

    def run(*extra: str, mode: str = "job") -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "eddyline.cli", "run", str(resident if mode == "resident" else spec),
               "--checkpoint", ckpt, "--no-live", "--master", "local[2]", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=400)

    def cli(*args: str) -> None:
        done = CliRunner().invoke(app, [*args, "--checkpoint", ckpt])
        assert done.exit_code == 0, done.output

    Engine(load_spec(first), spark, ckpt).run(epochs=2)  # (in this process: one JVM start less)
    cli("control", "set", str(spec), "expensive.filter=price >= 500")
    killed = run("--until-idle", "--crash-at", "3:after_publish", mode="resident")  # the changed filter on resident lanes
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    cli("apply", str(spec), str(new))
    killed = run("--until-idle", "--crash-at", "4:after_plan")  # replays epoch 3 in a Spark job
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    last = run("--until-idle", mode="resident")  # the new function from epoch 4 on resident lanes
    assert last.returncode == 0, last.stderr[-2000:]
    assert len(list((tmp_path / "ckpt" / "resident").iterdir())) >= 2  # (a stage in each resident run)

    counts = duckdb.connect().execute(
        f"SELECT auction, sum(n * _diff) FROM read_parquet('{tmp_path}/out/counts/epoch=*/*.parquet') GROUP BY ALL "
        "HAVING sum(n * _diff) <> 0 ORDER BY ALL").fetchall()
    kept_rows: dict[int, int] = {}
    for i, f in enumerate(sorted((tmp_path / "in").glob("*.json"))):
        for row in map(json.loads, f.read_text().splitlines()):
            if row["price"] >= (500 if i + 1 >= 3 else 100):
                kept_rows[row["auction"]] = kept_rows.get(row["auction"], 0) + 1
    assert counts == sorted(kept_rows.items())

    got: dict[int, list[tuple]] = {}
    for e, price, band in duckdb.connect().execute(
        f"SELECT CAST(regexp_extract(filename, 'epoch=(\\d+)', 1) AS INT), price, band "
        f"FROM read_parquet('{tmp_path}/out/rows/epoch=*/*.parquet', filename=true, union_by_name=true) ORDER BY ALL"
    ).fetchall():
        got.setdefault(e, []).append((price, band))
    want: dict[int, list[tuple]] = {}
    for i, f in enumerate(sorted((tmp_path / "in").glob("*.json"))):
        epoch = i + 1
        prices = [json.loads(line)["price"] for line in f.read_text().splitlines()]
        kept = [p for p in prices if p >= (500 if epoch >= 3 else 100)]
        if epoch < 4:  # to_euro
            want[epoch] = sorted((math.floor(p * EUR_PER_USD), None) for p in kept)
        else:  # price_band
            want[epoch] = sorted((p, int(p >= 1_000) + int(p >= 100_000)) for p in kept)
    assert got == {e: rows for e, rows in want.items() if rows}
    ck = Checkpoint(ckpt)
    assert ck.read_plan(3).settings == ck.read_plan(4).settings == ck.read_plan(6).settings == {"expensive.filter": "price >= 500"}
    assert ["network" in a for a in ck.read_plan(4).applied] == [True]
