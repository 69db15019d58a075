"""A Spark Python data source that reads text files as ``(file, line, raw)`` rows.

Spark's own text reader does not tell a line's number, and a dead letter must say where the bad
record was. One input partition per file keeps the numbering exact; batches are Arrow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

_BATCH = 65_536


class _FilePartition(InputPartition):
    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


class LinesDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "eddyline_lines"

    def schema(self) -> str:
        return "file string, line long, raw string"

    def reader(self, schema: object) -> DataSourceReader:
        return _LinesReader(json.loads(self.options.get("paths", "[]")))


class _LinesReader(DataSourceReader):
    def __init__(self, paths: list[str]):
        self.paths = paths

    def partitions(self) -> list[InputPartition]:
        return [_FilePartition(p) for p in self.paths] or [_FilePartition("")]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from eddyline.state.store import filesystem

        path = partition.path  # type: ignore[attr-defined]
        if not path:
            return
        fs, p = filesystem(path)
        with fs.open_input_stream(p) as f:
            text = f.read().decode("utf-8", errors="replace")
        lines = text.splitlines()
        name = p.rsplit("/", 1)[-1]
        for lo in range(0, len(lines), _BATCH):
            chunk = lines[lo : lo + _BATCH]
            keep = [(i + lo + 1, s) for i, s in enumerate(chunk) if s.strip()]
            yield pa.record_batch(
                {
                    "file": pa.array([name] * len(keep), pa.string()),
                    "line": pa.array([i for i, _ in keep], pa.int64()),
                    "raw": pa.array([s for _, s in keep], pa.string()),
                }
            )
