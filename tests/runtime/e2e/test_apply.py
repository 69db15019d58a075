"""Live network changes on local Spark (``eddyline apply``, eddyline.api.change): a query added
to a running network and later one removed, with the driver crashing as the change takes effect
and restarted by its original command line; the unchanged query's output is that of a run
without the changes, the added query's equals its reference from the epoch it started."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from eddyline.api.validate import load_spec
from eddyline.cli import app
from eddyline.errors import SpecError
from eddyline.runtime.checkpoint import Checkpoint, network_hash
from eddyline.runtime.engine import Engine
from eddyline.runtime.faults import FaultPoint
from eddyline.runtime.inbox import Inbox

from .helpers import BIDS_DDL, Crash, CrashAt, write_bid_files
from .switched import expected, per_epoch

COUNTS = {"name": "counts", "input": "bids", "window_aggregate": {
    "key": "auction", "time": "ts", "window": {"size": "10s"}, "watermark_delay": "5s", "aggregates": {"n": "count(*)"}}}


def network(src: Path, out: Path) -> dict:
    return {
        "name": "changing", "trigger": 0, "lanes": 2, "key_groups": 8,
        "sources": [{"name": "bids", "files": {"path": str(src), "format": "json", "schema": BIDS_DDL, "max_files_per_epoch": 1}}],
        "steps": [{"name": "expensive", "input": "bids", "filter": "price >= 100"}],
        "sinks": [{"name": "rows", "input": "expensive", "files": {"path": str(out / "rows"), "format": "parquet"}}],
    }


def windows_from_third_file(src: Path, aggregates: str, first: int = 2) -> list[tuple]:
    """DuckDB: the 10 s windows per auction over the files from the third (``first``) on:
    epoch 3's (``first + 1``)."""
    files = sorted(str(f) for f in src.glob("*.json"))[first:]
    return duckdb.connect().execute(
        f"SELECT auction, epoch_ms(time_bucket(INTERVAL 10 SECOND, ts)), {aggregates} FROM read_json({files}, "
        "columns={auction: 'BIGINT', price: 'BIGINT', ts: 'TIMESTAMP'}) GROUP BY ALL ORDER BY ALL"
    ).fetchall()


def test_a_query_added_then_one_removed_while_running_across_a_crash(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=6, rows=60)
    a = network(tmp_path / "in", tmp_path / "out")
    b = copy.deepcopy(a)
    b["steps"].append(COUNTS)
    b["sinks"].append({"name": "windows", "input": "counts", "files": {"path": str(tmp_path / "out" / "counts"), "format": "parquet"}})
    c = copy.deepcopy(b)
    c["steps"] = [COUNTS]
    c["sinks"] = c["sinks"][1:]
    original, ckpt = load_spec(a), str(tmp_path / "ckpt")

    Engine(original, spark, ckpt).run(epochs=2)
    added = Inbox(ckpt).submit_network(b, [])
    with pytest.raises(Crash):  # the plan that adds the query is logged, nothing ran
        Engine(original, spark, ckpt, faults=CrashAt(3, FaultPoint.AFTER_PLAN)).run(until_idle=True)
    Engine(original, spark, ckpt).run(epochs=2)  # restarted as it was first started: goes on with b
    removed = Inbox(ckpt).submit_network(c, [])
    Engine(original, spark, ckpt).run(until_idle=True)

    # the unchanged query: as without the changes, until it was removed with epoch 5
    want = expected(tmp_path / "in", switch_at=99)
    assert per_epoch(tmp_path / "out") == {e: rows for e, rows in want.items() if e <= 4}
    # the added query: every window over the files read from epoch 3 on
    con = duckdb.connect()
    reference = windows_from_third_file(tmp_path / "in", "count(*)")
    got = con.execute(
        f"SELECT auction, epoch_ms(window_start), n FROM read_parquet('{tmp_path}/out/counts/epoch=*/*.parquet') ORDER BY ALL"
    ).fetchall()
    assert got == reference and len(got) > 20
    ck = Checkpoint(ckpt)
    assert [a["id"] for a in ck.read_plan(3).applied] == [added] and [a["id"] for a in ck.read_plan(5).applied] == [removed]
    assert [(d["id"], d["outcome"], d["epoch"]) for d in Inbox(ckpt).done()] == [(added, "applied", 3), (removed, "applied", 5)]
    assert set(ck.latest_commit().steps) == {"counts"}
    # started with the network it now runs, it simply goes on; with a third, the third is a
    # change of the network in force, refused where the state cannot follow, else applied
    assert Engine(load_spec(c), spark, ckpt).run(until_idle=True).epochs == 0
    third = copy.deepcopy(c)
    third["steps"][0]["window_aggregate"]["key"] = "price"
    with pytest.raises(SpecError, match=r"run: step 'counts': window_aggregate.key changed, and its state would not fit"):
        Engine(load_spec(third), spark, ckpt).run(epochs=1)
    assert Inbox(ckpt).pending() == [] and ck.in_force() == network_hash(load_spec(c).as_dict())
    third = copy.deepcopy(c)
    third["sinks"].append({"name": "seen", "input": "counts", "console": {}})
    assert Engine(load_spec(third), spark, ckpt).run(until_idle=True).epochs == 0  # nothing new to read
    assert ck.in_force() == network_hash(load_spec(third).as_dict())  # the change was applied all the same
    # queued as `eddyline apply` queues it (closed with the first epoch that runs)
    assert [c["from"] for c in Inbox(ckpt).pending()] == ["restart"]


def test_apply_shows_the_change_and_refuses_what_the_state_cannot_follow(tmp_path: Path) -> None:
    a = network(tmp_path / "in", tmp_path / "out")
    a["steps"].append(COUNTS)
    a["sinks"].append({"name": "windows", "input": "counts", "console": {}})
    b = copy.deepcopy(a)
    b["steps"][0]["filter"] = "price >= 200"
    b["steps"][1]["window_aggregate"]["aggregates"] = {"n": "count(*)", "hi": "max(price)"}
    paths = []
    for name, net in (("a", a), ("b", b)):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(json.dumps(net))
    ckpt = str(tmp_path / "ckpt")
    runner = CliRunner()
    refused = runner.invoke(app, ["apply", str(paths[0]), str(paths[1]), "--checkpoint", ckpt])
    assert refused.exit_code == 2
    assert "apply: step 'counts': window_aggregate.aggregates." in refused.output
    assert "changed, and its state would not fit the changed step; give --reset counts" in refused.output
    ok = runner.invoke(app, ["apply", str(paths[0]), str(paths[1]), "--checkpoint", ckpt, "--reset", "counts"])
    assert ok.exit_code == 0, ok.output
    assert "~ step 'counts': window_aggregate.aggregates" in ok.output and "~ step 'expensive': filter" in ok.output
    assert [c["reset"] for c in Inbox(ckpt).pending()] == [["counts"]]
    live_only = copy.deepcopy(a)
    live_only["steps"][1]["window_aggregate"]["watermark_delay"] = "9s"
    paths[1].write_text(json.dumps(live_only))
    dry = runner.invoke(app, ["apply", str(paths[0]), str(paths[1]), "--checkpoint", ckpt, "--dry-run"])
    assert dry.exit_code == 0 and "~ step 'counts': window_aggregate.watermark_delay" in dry.output and "nothing queued" in dry.output


def test_a_reset_stateful_step_starts_empty_at_the_change(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=4, rows=60)
    a = network(tmp_path / "in", tmp_path / "out")
    a["steps"], a["sinks"] = [COUNTS], [{"name": "windows", "input": "counts", "files": {"path": str(tmp_path / "out" / "w"), "format": "parquet"}}]
    b = copy.deepcopy(a)
    b["steps"][0]["window_aggregate"]["aggregates"] = {"n": "count(*)", "total": "sum(price)"}
    ckpt = str(tmp_path / "ckpt")
    Engine(load_spec(a), spark, ckpt).run(epochs=2)
    Inbox(ckpt).submit_network(b, ["counts"])
    Engine(load_spec(a), spark, ckpt).run(until_idle=True)
    con = duckdb.connect()
    reference = windows_from_third_file(tmp_path / "in", "count(*), sum(price)")
    got = con.execute(
        f"SELECT auction, epoch_ms(window_start), n, total FROM read_parquet('{tmp_path}/out/w/epoch=*/*.parquet', "
        "filename=true, union_by_name=true) WHERE CAST(regexp_extract(filename, 'epoch=(\\d+)', 1) AS INT) >= 3 ORDER BY ALL"
    ).fetchall()
    assert got == reference and len(got) > 10


def test_a_removed_stateful_step_leaves_no_state_once_no_kept_epoch_has_it(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=6, rows=20)
    a = network(tmp_path / "in", tmp_path / "out")
    a["history"] = 2
    b = copy.deepcopy(a)
    a["steps"].append(COUNTS)
    a["sinks"].append({"name": "windows", "input": "counts", "files": {"path": str(tmp_path / "out" / "w"), "format": "parquet"}})
    ckpt = str(tmp_path / "ckpt")
    Engine(load_spec(a), spark, ckpt).run(epochs=2)
    assert (tmp_path / "ckpt" / "state" / "counts").is_dir()
    Inbox(ckpt).submit_network(b, [])
    Engine(load_spec(a), spark, ckpt).run(epochs=1)  # epoch 3 without it; epoch 2's commit is kept
    assert (tmp_path / "ckpt" / "state" / "counts").is_dir()
    Engine(load_spec(a), spark, ckpt).run(until_idle=True)
    assert not (tmp_path / "ckpt" / "state" / "counts").exists()


def counts_added_after_three_epochs(spark, tmp_path: Path, *, own_copy: bool) -> tuple[dict, dict, list[Path], str]:  # noqa: ANN001
    """Six bid files; network A (``a.json``) run for three epochs, and B (``b.json``): A plus
    windowed counts that read 'bids' itself or, ``own_copy``, a source 'bids_again' with its
    parameters. Returns A, B, their files and the checkpoint."""
    write_bid_files(tmp_path / "in", files=6, rows=40)
    a = network(tmp_path / "in", tmp_path / "out")
    b = copy.deepcopy(a)
    if own_copy:
        b["sources"].append({**copy.deepcopy(b["sources"][0]), "name": "bids_again"})
    b["steps"].append({**COUNTS, "input": "bids_again" if own_copy else "bids"})
    b["sinks"].append({"name": "windows", "input": "counts", "files": {"path": str(tmp_path / "out" / "counts"), "format": "parquet"}})
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, net in zip(paths, (a, b), strict=True):
        path.write_text(json.dumps(net))
    ckpt = str(tmp_path / "ckpt")
    Engine(load_spec(a), spark, ckpt).run(epochs=3)
    return a, b, paths, ckpt


def test_an_added_query_starts_from_a_kept_epoch(spark, tmp_path: Path) -> None:
    """``apply --from-epoch 2``: the added query reads its own copy of the running source, which
    starts where that source was at epoch 2, so it sees the input from epoch 2 on although it
    is added at epoch 4; the running query goes on as without the change."""
    a, b, paths, ckpt = counts_added_after_three_epochs(spark, tmp_path, own_copy=True)
    runner = CliRunner()
    no_copy = copy.deepcopy(b)
    no_copy["sources"][1]["files"]["max_files_per_epoch"] = 2  # not what 'bids' reads
    (tmp_path / "c.json").write_text(json.dumps(no_copy))
    refused = runner.invoke(app, ["apply", str(paths[0]), str(tmp_path / "c.json"), "--checkpoint", ckpt, "--from-epoch", "2"])
    assert refused.exit_code == 2 and "no added source reads what a running one reads" in refused.output
    ok = runner.invoke(app, ["apply", str(paths[0]), str(paths[1]), "--checkpoint", ckpt, "--from-epoch", "2"])
    assert ok.exit_code == 0 and "source 'bids_again' starts where 'bids' was at epoch 2" in ok.output, ok.output
    Engine(load_spec(a), spark, ckpt).run(until_idle=True)

    assert per_epoch(tmp_path / "out") == expected(tmp_path / "in", switch_at=99)
    got = duckdb.connect().execute(
        f"SELECT auction, epoch_ms(window_start), n FROM read_parquet('{tmp_path}/out/counts/epoch=*/*.parquet') ORDER BY ALL"
    ).fetchall()
    assert got == windows_from_third_file(tmp_path / "in", "count(*)", first=1) and len(got) > 20
    assert Checkpoint(ckpt).metadata()["applied"]["sources"] == {"bids_again": ["bids", 2]}


def test_an_added_query_on_a_running_source_catches_up_and_then_reads_it(spark, tmp_path: Path) -> None:
    """``apply --from-epoch 2`` of a query that reads the running source itself: it reads a copy
    that starts where the source was at epoch 2 and follows one file an epoch behind it; once
    the copy has read as far as the source, the query reads the source (the driver dies in that
    epoch, a restart goes on). Its windows are those of the input from epoch 2 on, every file
    counted once; the running query's output is as without the change; the network in force is
    the one applied, without the copy."""
    a, b, paths, ckpt = counts_added_after_three_epochs(spark, tmp_path, own_copy=False)  # reads 'bids', which runs
    runner = CliRunner()
    ok = runner.invoke(app, ["apply", str(paths[0]), str(paths[1]), "--checkpoint", ckpt, "--from-epoch", "2"])
    assert ok.exit_code == 0, ok.output
    assert "step(s) counts read a copy of 'bids' that starts where it was at epoch 2" in ok.output
    Engine(load_spec(a), spark, ckpt).run(epochs=5)  # epochs 4-8: 'bids' reads files 3-5, the copy 1-5
    meta, last = Checkpoint(ckpt).metadata(), Checkpoint(ckpt).latest_commit()
    assert last.epoch == 8 and last.source_ends["bids__from_2"] == last.source_ends["bids"] == 6
    assert meta["applied"]["catch_up"] == {"bids__from_2": ["bids", ["counts"]]}

    write_bid_files(tmp_path / "more", files=7, rows=40, seed=11)  # one more file, read by epoch 9
    (tmp_path / "more" / "bids-0006.json").rename(tmp_path / "in" / "bids-0006.json")
    with pytest.raises(Crash):  # caught up at epoch 8: from epoch 9 on 'counts' reads 'bids'
        Engine(load_spec(a), spark, ckpt, faults=CrashAt(9, FaultPoint.AFTER_STAGE)).run(until_idle=True)
    assert Checkpoint(ckpt).metadata()["applied"]["catch_up"] == {}  # decided before epoch 9 was planned
    Engine(load_spec(a), spark, ckpt).run(until_idle=True)

    meta = Checkpoint(ckpt).metadata()
    assert meta["caught_up"] == [{"copy": "bids__from_2", "epoch": 9}]
    assert set(Checkpoint(ckpt).read_plan(9).sources) == {"bids"}
    got = duckdb.connect().execute(
        f"SELECT auction, epoch_ms(window_start), n FROM read_parquet('{tmp_path}/out/counts/epoch=*/*.parquet') ORDER BY ALL"
    ).fetchall()
    assert got == windows_from_third_file(tmp_path / "in", "count(*)", first=1) and len(got) > 20
    want = expected(tmp_path / "in", switch_at=99)
    rows = per_epoch(tmp_path / "out")
    assert {e: rows[e] for e in range(1, 7)} == {e: want[e] for e in range(1, 7)} and rows[9] == want[7]
    assert sorted(rows) == [1, 2, 3, 4, 5, 6, 9]
    assert meta["applied"]["hash"] == network_hash(load_spec(b).as_dict())  # what runs is what was applied
    refused = Inbox(ckpt).submit_command({"replay": 8})
    Engine(load_spec(a), spark, ckpt).run(until_idle=True)
    (done,) = [d for d in Inbox(ckpt).done() if d["id"] == refused]
    assert done["outcome"] == "refused"
    assert "added steps went over from a copy to its source at epoch 9; replay can go back to epoch 10" in done["reason"]
