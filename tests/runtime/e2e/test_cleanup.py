"""Checkpoint cleanup runs beside the next epochs, and is finished (or its error raised) when
``Engine.run`` returns."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eddyline.errors import CheckpointError
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.engine import Engine

from .helpers import bids_window_spec, duckdb_windows, read_windows, write_bid_files


def test_cleanup_runs_while_the_next_epoch_does(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=8, rows=30, seed=3)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    engine = Engine(spec, spark, str(tmp_path / "ckpt"), retain_epochs=3)
    commits = tmp_path / "ckpt" / "commits"
    waited: list[int] = []
    real = engine.cleanup

    def cleanup_after_the_next_commit(epoch: int) -> None:
        # an inline cleanup would wait here for an epoch that cannot start before it returns
        deadline = time.monotonic() + 60
        while epoch == 3 and not (commits / f"{epoch + 1:010d}.json").exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"epoch {epoch + 1} did not commit while epoch {epoch}'s cleanup ran")
            time.sleep(0.01)
        waited.append(epoch)
        real(epoch)

    engine.cleanup = cleanup_after_the_next_commit
    summary = engine.run(until_idle=True)
    assert summary.epochs >= 8
    assert waited == list(range(3, summary.last_epoch + 1, 3))
    kept = [c.epoch for c in Checkpoint(str(tmp_path / "ckpt")).commits()]
    # the last cleanup finished before run() returned
    assert kept[0] == waited[-1] - 2 and kept[-1] == summary.last_epoch
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")


def test_a_failed_cleanup_stops_the_run_with_its_epoch(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=4, rows=20, seed=4)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    engine = Engine(spec, spark, str(tmp_path / "ckpt"), retain_epochs=2)

    def broken(epoch: int) -> None:
        raise OSError("the disk is gone")

    engine.cleanup = broken
    with pytest.raises(CheckpointError, match="after epoch 2 failed: the disk is gone"):
        engine.run(epochs=4)
