"""``eddyline demo`` (the README's first command) runs the demo network and starts afresh each
time: resuming an old demo's checkpoint would make the paced generator catch up on every event
since then in one epoch."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest


def _batches(out: Path) -> list[int]:
    return [json.loads(line)["batchId"] for line in (out / "progress.jsonl").read_text().splitlines()]


@pytest.fixture
def own_signal_handlers():
    """The CLI turns SIGINT / SIGTERM into "stop after this epoch"; give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_second_demo_starts_afresh(spark, tmp_path: Path, own_signal_handlers, capsys) -> None:
    from eddyline.cli.demos import demo

    demo(duration=3, out=str(tmp_path), files=True, master=None)
    first = _batches(tmp_path)
    assert first and first[0] == 1, first
    assert list((tmp_path / "hot-auctions").glob("epoch=*")), "no output"
    stale = tmp_path / "hot-auctions" / "epoch=9999999999"
    stale.mkdir()
    (tmp_path / "notes.txt").write_text("the user's own file")

    demo(duration=3, out=str(tmp_path), files=True, ui=True, ui_port=0, master=None)  # with its dashboard
    said = capsys.readouterr()
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/\?token=[\w-]+ · metrics", said.err), said.err[-2000:]
    assert f"eddyline ui {tmp_path}/checkpoint" in said.out
    second = _batches(tmp_path)
    assert second and second[0] == 1, second  # not last + 1: nothing was resumed
    assert not stale.exists()
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"  # only the demo's paths go


def test_the_broker_demo_carries_bids_through_nats_into_postgres_and_parquet(
    spark, tmp_path: Path, own_signal_handlers, capsys
) -> None:
    import pyarrow.parquet as pq

    from eddyline.cli.demos import demo

    demo(duration=15, out=str(tmp_path), master=None)
    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert records and records[0]["sources"][0]["status"] == "ok"
    assert sum(r["numInputRows"] for r in records) > 0
    # the same windows reached the table (the upsert sink counts what it wrote) and the files
    to_db = sum(s["numOutputRows"] for r in records for s in r["sinks"] if s["description"] == "hot_db")
    files = sum(pq.read_table(p).num_rows for p in (tmp_path / "hot-auctions").glob("epoch=*/*.parquet"))
    assert to_db == files > 0
    assert "psql 'postgresql://" in " ".join(capsys.readouterr().err.split())


def test_the_demo_keeps_its_checkpoint_on_a_local_s3_server_with_store_s3(
    spark, tmp_path: Path, own_signal_handlers, capsys
) -> None:
    """``eddyline demo --files --store s3``: moto's server, started and stopped by the demo, holds
    the checkpoint (this session's Spark workers were started before its variables were set, so
    the lanes reach it only through the settings the driver hands them)."""
    import os

    from eddyline.cli.demos import demo

    before = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    demo(duration=4, out=str(tmp_path), files=True, master=None, store="s3")
    said = capsys.readouterr()
    assert re.search(r"the checkpoint is on an S3-compatible server at http://127\.0\.0\.1:\d+: "
                     r"s3://eddyline-demo/checkpoint", said.err), said.err[-2000:]
    batches = _batches(tmp_path)
    assert batches and batches[0] == 1, batches
    assert list((tmp_path / "hot-auctions").glob("epoch=*/*.parquet")), "no output"
    assert not (tmp_path / "checkpoint").exists()  # it was on the store
    assert "eddyline status" not in said.out  # (the store went with the demo)
    assert {k: v for k, v in os.environ.items() if k.startswith("AWS_")} == before  # as it was
