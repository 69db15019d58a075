"""The files source reuses the Parquet schema Spark inferred, only while the files' footers match."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from eddyline.api.sources import SourceSpec
from eddyline.io.files import FilesSource


def _source(path: str) -> FilesSource:
    return FilesSource(SourceSpec.model_validate({"name": "events", "files": {"path": path, "format": "parquet"}}))


def _write(path, name: str, table: pa.Table) -> None:
    pq.write_table(table, str(path / name))


def test_same_footers_reuse_the_schema_and_a_new_footer_is_inferred_again(spark, tmp_path):
    _write(tmp_path, "001.parquet", pa.table({"k": [1, 2], "v": [10, 20]}))
    _write(tmp_path, "002.parquet", pa.table({"k": [3], "v": [30]}))
    _write(tmp_path, "003.parquet", pa.table({"k": [4], "v": [40], "note": ["new column"]}))
    src = _source(str(tmp_path))

    first = src.frames(spark, {"files": ["001.parquet"]}, 2).data
    assert sorted(first.collect()) == [(1, 10), (2, 20)]
    assert src._schemas is not None
    cached = src._schemas[1]

    # Same footer: read with the kept schema (and the rows are right).
    second = src.frames(spark, {"files": ["002.parquet"]}, 2).data
    assert second.schema == cached
    assert second.collect() == [(3, 30)]

    # A file with another footer must not be read with the old schema: its new column would be lost.
    third = src.frames(spark, {"files": ["003.parquet"]}, 2).data
    assert third.columns == ["k", "v", "note"]
    assert third.collect() == [(4, 40, "new column")]

    # Mixed footers in one epoch: Spark infers (and the kept schema is left alone).
    mixed = src.frames(spark, {"files": ["002.parquet", "003.parquet"]}, 2).data
    assert sorted(r.k for r in mixed.collect()) == [3, 4]


def test_peek_reads_the_key_columns_of_the_planned_parquet_files_only(tmp_path):
    _write(tmp_path, "001.parquet", pa.table({"k": [1, 2], "v": [10, 20]}))
    _write(tmp_path, "002.parquet", pa.table({"k": [3], "v": [30]}))
    src = _source(str(tmp_path))
    got = src.peek({"files": ["002.parquet", "001.parquet"]}, ("k",))
    assert got.column_names == ["k"] and sorted(got.column("k").to_pylist()) == [1, 2, 3]
    assert src.peek({"files": []}, ("k",)) is None
    assert src.peek({"files": ["001.parquet"]}, ("missing",)) is None  # Spark reports it when the epoch runs
    csv = FilesSource(SourceSpec.model_validate(
        {"name": "e", "files": {"path": str(tmp_path), "format": "csv", "schema": "k BIGINT, v BIGINT"}}))
    assert csv.peek({"files": ["001.parquet"]}, ("k",)) is None
