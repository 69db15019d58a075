"""A standby's rehearsal (eddyline.runtime.warmup) changes nothing a real epoch can see: the
checkpoint, the sinks' output, the dead letters, the late rows and the sink objects stay as they
were, byte for byte, and the standby then continues with the uninterrupted run's output."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from eddyline.api.validate import load_spec
from eddyline.ha.lease import Lease
from eddyline.runtime.engine import Engine
from eddyline.runtime.warmup import Standby

from .e2e.helpers import bids_window_spec, read_windows, write_bid_files

pytestmark = pytest.mark.spark


def network(tmp_path: Path, name: str):  # noqa: ANN201
    """Bid windows with dead letters (bad lines), late rows and a second, in-memory sink."""
    spec = bids_window_spec(tmp_path / "in", tmp_path / name / "out", late_dir=tmp_path / name / "late")
    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["sinks"].append({"name": "mem", "input": "per_auction", "memory": {}})
    return load_spec(raw)


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every directory and file under ``roots``: a file's bytes (hashed) and modification time."""
    out: dict[str, tuple] = {}
    for root in roots:
        for d, dirs, files in os.walk(root):
            out[d] = ("dir", sorted(dirs), sorted(files))
            for f in files:
                p = Path(d) / f
                out[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def rows(directory: Path, fmt: str) -> list[tuple]:
    """Every row published under ``directory`` (dead letters: JSON, late rows: Parquet)."""
    import duckdb

    read = "read_json_auto" if fmt == "json" else "read_parquet"
    return duckdb.connect().execute(f"SELECT * FROM {read}('{directory}/epoch=*/*.{fmt}') ORDER BY ALL").fetchall()


def test_a_rehearsal_changes_nothing_and_the_standby_continues_exactly(spark, tmp_path: Path, monkeypatch) -> None:
    bad = write_bid_files(tmp_path / "in", files=8, rows=150, seed=11, bad_every=40, disorder_ms=15_000)
    assert bad
    Engine(network(tmp_path, "ref"), spark, str(tmp_path / "ref" / "ckpt")).run(until_idle=True)
    expected = read_windows(tmp_path / "ref" / "out")
    assert len(expected) > 50

    run = tmp_path / "run"
    ckpt = str(run / "ckpt")
    first = Lease(ckpt, timeout_s=30)
    assert first.try_acquire()
    leader = Engine(network(tmp_path, "run"), spark, ckpt, lease=first)
    assert leader.run(epochs=3).epochs == 3
    assert (run / "ckpt" / "dead-letters").is_dir() and (run / "late").is_dir()  # the test covers them
    before = snapshot(run)

    # a standby: its engine built before it has the lease, rehearsing into a scratch directory
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    lease = Lease(ckpt, timeout_s=30)
    standby = Engine(network(tmp_path, "run"), spark, ckpt, lease=lease)
    done = Standby(standby).rehearse()
    assert (done.epoch, done.error, done.ran) == (3, None, True), done
    assert "epoch 3 rehearsed in" in done.describe()
    assert snapshot(run) == before  # checkpoint, lease, sink output, dead letters, late rows
    assert standby.sinks["mem"].collected == {}  # no sink object staged anything
    assert list(scratch.iterdir()) == []  # the scratch directory is gone
    assert Standby(standby).keep_warm(force=True)

    assert lease.try_acquire() and lease.generation == 2  # the leader released its lease at the end
    summary = standby.run(until_idle=True)
    assert summary.replayed == 0 and summary.epochs >= 6
    assert read_windows(run / "out") == expected
    letters = rows(run / "ckpt" / "dead-letters", "json")
    assert len(letters) == bad and letters == rows(tmp_path / "ref" / "ckpt" / "dead-letters", "json")
    late = rows(run / "late", "parquet")
    assert late and late == rows(tmp_path / "ref" / "late", "parquet")


def test_a_plan_whose_input_is_gone_is_rehearsed_as_an_empty_epoch(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=3, rows=50, seed=3)
    ckpt = str(tmp_path / "ckpt")
    Engine(network(tmp_path, "run"), spark, ckpt).run(epochs=2)
    (tmp_path / "in" / "bids-0001.json").unlink()  # epoch 2's file
    before = snapshot(tmp_path / "run", tmp_path / "ckpt")
    done = Standby(Engine(network(tmp_path, "run"), spark, ckpt)).rehearse()
    assert done.epoch is None and done.ran and done.error, done
    assert "an empty epoch rehearsed in" in done.describe()
    assert snapshot(tmp_path / "run", tmp_path / "ckpt") == before
