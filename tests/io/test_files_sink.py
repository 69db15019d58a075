"""A files sink's staged write: an epoch staged again replaces the earlier attempt's rows."""

from __future__ import annotations

import os

import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pytest

from eddyline.api.units import Files
from eddyline.errors import Fenced
from eddyline.io.files import FilesTarget, write_frame


def _rows(path: str, fmt: str) -> list[int]:
    if fmt == "csv":
        files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".csv")]
        return sorted(v for f in files for v in pcsv.read_csv(f).column("id").to_pylist())
    return sorted(ds.dataset(path, format=fmt).to_table().column("id").to_pylist())


@pytest.mark.parametrize("fmt", ["parquet", "json", "csv"])
def test_staging_an_epoch_again_replaces_it(spark, tmp_path, fmt) -> None:
    target = FilesTarget(Files(str(tmp_path / "out"), format=fmt))
    write_frame(spark.range(0, 10, 1, 2), target, 3)
    # the retry of the same epoch (say after a crash) produces other rows: only they remain
    write_frame(spark.range(100, 104, 1, 2), target, 3)
    staged = target.staging(3)
    assert _rows(staged, fmt) == [100, 101, 102, 103]
    left = sorted(os.listdir(staged))
    # the commit protocol's scratch directory is gone and Spark wrote no checksum files
    assert "_temporary" not in left
    assert not [f for f in left if f.endswith(".crc")]
    target.publish(3)
    assert _rows(target.final(3), fmt) == [100, 101, 102, 103]
    assert not os.path.exists(staged)


def _stage(target: FilesTarget, epoch: int, rows: int = 1) -> None:
    """A staged epoch as a sink's job leaves it (one file), without Spark."""
    os.makedirs(target.staging(epoch))
    with open(f"{target.staging(epoch)}/part-0.json", "w") as f:
        f.writelines(f'{{"id": {i}}}\n' for i in range(rows))


def test_tentative_epochs_publish_apart_and_a_retraction_moves_them_to_the_corrections(tmp_path) -> None:
    target = FilesTarget(Files(str(tmp_path / "out"), format="json"))
    _stage(target, 1)
    target.publish(1)
    for epoch in (2, 3):
        _stage(target, epoch)
        target.publish(epoch, tentative=True)
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["_staging", "_tentative", "epoch=0000000001"]
    assert sorted(os.listdir(out / "_tentative")) == ["epoch=0000000002", "epoch=0000000003"]
    # readers of the directory see the stable epoch only
    assert ds.dataset(str(out), format="json").to_table().num_rows == 1
    target.retract([2, 3], 4)
    target.retract([2, 3], 4)  # a replay of epoch 4 retracts again: nothing more happens
    assert os.listdir(out / "_tentative") == []
    retracted = out / "_corrections" / "epoch=0000000004" / "retracted"
    assert sorted(os.listdir(retracted)) == ["epoch=0000000002", "epoch=0000000003"]
    assert os.listdir(retracted / "epoch=0000000002") == ["part-0.json"]


def test_a_driver_of_an_older_lease_generation_cannot_publish_after_a_newer_one_opened_its_gate(tmp_path) -> None:
    old = FilesTarget(Files(str(tmp_path / "out"), format="json"), generation=1)
    old.fence(1)
    _stage(old, 1)
    old.publish(1)
    _stage(old, 2)  # staged, then frozen past its lease
    new = FilesTarget(Files(str(tmp_path / "out"), format="json"))
    new.fence(2)  # the driver that took over, before it writes anything
    with pytest.raises(Fenced, match="lease generation 1 was taken over by generation 2: .* refuses its writes"):
        old.publish(2)  # refused by the file system: the path it moves from no longer resolves
    with pytest.raises(Fenced):
        old.retract([1], 3)
    with pytest.raises(OSError):
        _stage(old, 3)  # its staging cannot be made again either
    _stage(new, 2)
    new.publish(2)
    out = tmp_path / "out"
    assert sorted(p for p in os.listdir(out) if p.startswith("epoch=")) == ["epoch=0000000001", "epoch=0000000002"]
    # each published epoch says which generation published it
    assert [(out / e / "_generation").read_text() for e in ("epoch=0000000001", "epoch=0000000002")] == ["1", "2"]
    # what the older generation had staged went with its gate: a tombstone is left, and the newer gate
    assert sorted(os.listdir(out / "_staging")) == ["g=1", "g=2"] and (out / "_staging" / "g=1").is_file()
    assert os.listdir(out / "_staging" / "g=2") == []


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_text_written_here_is_the_text_spark_writes(spark, tmp_path, fmt) -> None:
    """A resident lane (or a small epoch) writes a JSON or CSV sink's file itself: line for line
    what Spark's writer gives for the same rows (nulls, empty and non-ASCII text, quotes, instants,
    dates, booleans, doubles)."""
    from datetime import UTC, date, datetime

    import pyarrow as pa

    from eddyline.io.files.target import write_table

    table = pa.table({
        "id": pa.array([1, 2, None], pa.int64()), "name": ["a,b", None, 'é "q"'],
        "at": pa.array([datetime(2023, 11, 14, 22, 13, 20, 767183, tzinfo=UTC), None,
                        datetime(2024, 2, 29, 0, 0, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
        "day": pa.array([date(2024, 1, 2), date(1999, 12, 31), None]),
        "ok": [True, None, False], "x": [2.5, None, -0.125], "empty": ["", "b", None],
    })
    ours, theirs = FilesTarget(Files(str(tmp_path / "ours"), format=fmt)), FilesTarget(Files(str(tmp_path / "spark"), format=fmt))
    write_table(table, ours, 1)
    write_frame(spark.createDataFrame(table).coalesce(1), theirs, 1)

    def lines(target: FilesTarget) -> list[str]:
        path = target.staging(1)
        return [line for f in sorted(os.listdir(path)) if f.endswith(f".{fmt}")
                for line in open(os.path.join(path, f), encoding="utf-8").read().splitlines()]

    assert lines(ours) == lines(theirs) and len(lines(ours)) >= 3
