"""A standby's rehearsal (eddyline.runtime.warmup) changes nothing a real epoch can see: the
checkpoint, the sinks' output, the dead letters, the late rows and the sink objects stay as they
were, byte for byte, and the standby then continues with the uninterrupted run's output."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import uuid
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


def test_a_standby_that_rehearsed_an_empty_epoch_rehearses_the_first_commit_beside_its_wait(
    spark, tmp_path: Path
) -> None:
    """Started before the leader committed anything, a standby can only rehearse an empty epoch;
    once there is a commit, :meth:`Standby.catch_up` rehearses it in a thread (the caller, which
    polls the lease, goes on at once), once; a takeover's :meth:`Standby.stop` cancels one still
    running, which then reports nothing."""
    write_bid_files(tmp_path / "in", files=4, rows=150, seed=11)
    ckpt = str(tmp_path / "run" / "ckpt")
    said: list[str] = []
    standby = Standby(Engine(network(tmp_path, "run"), spark, ckpt), say=said.append)
    standby.LOOK_S = 0.0
    assert standby.rehearse().epoch is None  # nothing committed yet: an empty epoch
    assert not standby.catch_up()  # still nothing to rehearse
    Engine(network(tmp_path, "run"), spark, ckpt).run(epochs=2)
    before = snapshot(tmp_path / "run")
    assert standby.catch_up()
    assert not standby.catch_up()  # one at a time
    standby._behind.join(120)
    assert standby.last.epoch == 2 and standby.last.ran, standby.last
    assert said == [f"standby ready: {standby.last.describe()}"]
    assert not standby.catch_up()  # a committed epoch was rehearsed: no more
    assert snapshot(tmp_path / "run") == before

    # a takeover while a rehearsal runs: its jobs are cancelled and it says nothing
    other = Standby(Engine(network(tmp_path, "run"), spark, ckpt), say=said.append)
    other.LOOK_S = 0.0
    assert other.catch_up()
    sc = spark.sparkContext
    tagged = sc._jsc.sc().statusTracker()

    def running() -> list[int]:
        ids = list(tagged.getJobIdsForTag(Standby.JOB_TAG))
        return [i for i in ids if (info := sc.statusTracker().getJobInfo(i)) and info.status == "RUNNING"]

    deadline = time.monotonic() + 60
    while not running():  # inside one of its Spark jobs
        assert time.monotonic() < deadline and other._behind.is_alive()
        time.sleep(0.02)
    cut = running()
    other.stop(wait_s=30)
    assert not other._behind.is_alive() and other.last is None
    assert {sc.statusTracker().getJobInfo(i).status for i in cut} == {"FAILED"}  # cancelled
    assert len(said) == 1 and snapshot(tmp_path / "run") == before


def test_on_an_object_store_the_rehearsal_writes_beside_the_checkpoint_and_drops_it(
    s3, spark, tmp_path: Path, monkeypatch
) -> None:
    """A checkpoint on the store: the rehearsal's scratch is on the store too (on a cluster the
    driver and the executors see it; a local directory would be the driver's only), and nothing of
    it is left; the checkpoint's objects are as they were."""
    from eddyline import objectstore

    write_bid_files(tmp_path / "in", files=3, rows=150, seed=5)
    ckpt = f"{s3.bucket(f'warm-{uuid.uuid4().hex[:8]}')}/net"
    Engine(network(tmp_path, "run"), spark, ckpt).run(epochs=2)
    store, key = objectstore.at(ckpt)

    def objects() -> dict[str, bytes]:
        return {k: store.get(k)[0] for k in store.list(f"{key}/")}

    before = objects()
    dropped: list[str] = []  # what the rehearsal deleted when it ended
    real_delete = objectstore.ObjectStore.delete

    def delete(self, keys):  # noqa: ANN001, ANN202
        dropped.extend([keys] if isinstance(keys, str) else keys)
        return real_delete(self, keys)

    monkeypatch.setattr(objectstore.ObjectStore, "delete", delete)
    done = Standby(Engine(network(tmp_path, "run"), spark, ckpt)).rehearse()
    assert (done.epoch, done.error, done.ran) == (2, None, True), done
    # the lanes (in Spark's workers) wrote their state and manifests, and the sink its files, in
    # the scratch on the store; the rehearsal deleted them there
    assert any(k.startswith(f"{key}/_rehearsal/") and "/state/" in k for k in dropped), dropped
    assert any(k.startswith(f"{key}/_rehearsal/") and "/lane-" in k for k in dropped), dropped
    assert any(k.startswith(f"{key}/_rehearsal/") and "/sinks/" in k for k in dropped), dropped
    assert objects() == before  # the checkpoint as it was, and no scratch left
