"""A files sink's staged write: an epoch staged again replaces the earlier attempt's rows."""

from __future__ import annotations

import os

import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pytest

from eddyline.api.units import Files
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
