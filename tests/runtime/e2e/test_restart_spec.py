"""``eddyline run`` on a checkpoint with a spec edited since (issue #52, as a new user met it):
a tumbling window's size changed from 10 s to 5 s is refused before anything runs (exit 2,
naming the step and the field, nothing written), instead of reading the 10 s windows' state as
5 s ones; a compatible edit (a filter's predicate, an added sink) is applied at the next epoch
boundary and said so; a rerun that finds nothing new says where the checkpoint stands."""

from __future__ import annotations

import copy
import json
import signal
from pathlib import Path

import duckdb
import yaml
from typer.testing import CliRunner

from eddyline.cli import app
from eddyline.runtime.checkpoint import Checkpoint

from .helpers import BIDS_DDL, write_bid_files


def network(src: Path, out: Path, size: str) -> dict:
    return {
        "name": "per-auction", "trigger": 0, "lanes": 2, "key_groups": 8,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "json", "schema": BIDS_DDL,
                                                "max_files_per_epoch": 1}}],
        "steps": [
            {"name": "expensive", "input": "bids", "filter": "price >= 100"},
            {"name": "w", "input": "expensive", "window_aggregate": {
                "key": "auction", "time": "ts", "window": {"size": size}, "watermark_delay": "2s",
                "aggregates": {"n": "count(*)"}}},
        ],
        "sinks": [{"name": "windows", "input": "w", "files": {"path": str(out / "windows"), "format": "parquet"}}],
    }


def tree(path: Path) -> dict[str, int]:
    """Every file under ``path`` and when it last changed."""
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in sorted(path.rglob("*")) if p.is_file()}


def run(spec: dict, tmp: Path, ckpt: Path, *extra: str):  # noqa: ANN201
    path = tmp / f"net-{len(list(tmp.glob('net-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(spec))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return CliRunner().invoke(app, ["run", str(path), "--checkpoint", str(ckpt), "--no-live", "--master",
                                        "local[2]", *extra])
    finally:  # (run installs its own, for Ctrl-C: this process is the test session's)
        for s, h in handlers.items():
            signal.signal(s, h)


def test_an_edited_spec_is_refused_or_applied_never_read_into_the_old_state(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=6, rows=40, seed=9)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    r10 = network(tmp_path / "in", out, "10s")
    first = run(r10, tmp_path, ckpt, "--epochs", "2")
    assert first.exit_code == 0, first.output

    # the window's size changed: its state holds 10 s windows; refused, nothing written
    before = {"ckpt": tree(ckpt), "out": tree(out)}
    r5 = copy.deepcopy(r10)
    r5["steps"][1]["window_aggregate"]["window"]["size"] = "5s"
    refused = run(r5, tmp_path, ckpt, "--until-idle")
    assert refused.exit_code == 2, refused.output
    assert "run: step 'w': window_aggregate.window.size changed, and its state would not fit" in refused.output
    assert "apply with --reset w" in refused.output and f"--checkpoint {ckpt}" in refused.output
    assert {"ckpt": tree(ckpt), "out": tree(out)} == before  # not even a lease was taken

    # a compatible edit: applied at the next boundary, and said so
    edited = copy.deepcopy(r10)
    edited["steps"][0]["filter"] = "price >= 500"
    edited["sinks"].append({"name": "big", "input": "expensive", "files": {"path": str(out / "big"), "format": "parquet"}})
    applied = run(edited, tmp_path, ckpt, "--until-idle")
    assert applied.exit_code == 0, applied.output
    assert "applying the changed network at the next epoch boundary" in applied.output
    assert "+ sink 'big'" in applied.output and "~ step 'expensive': filter" in applied.output
    ck = Checkpoint(str(ckpt))
    change = next(e for e in range(3, 10) if any("network" in a for a in ck.read_plan(e).applied))
    assert change == 3  # the first epoch of this run
    prices = duckdb.connect().execute(f"SELECT min(price) FROM read_parquet('{out}/big/epoch=*/*.parquet')").fetchone()
    assert prices[0] >= 500

    # run again unchanged: nothing new, and it says where the checkpoint stands
    again = run(edited, tmp_path, ckpt, "--until-idle")
    assert again.exit_code == 0, again.output
    last = ck.latest_commit()
    assert "ran 0 epochs" in again.output
    assert (f"nothing new to read: checkpoint {ckpt} has run its input up to epoch {last.epoch} "
            f"(it reached the end of its input); sources: bids at offset 6") in again.output
    assert json.loads((ckpt / "metadata.json").read_text())["applied"]["epoch"] == 3

