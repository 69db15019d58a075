"""The ``files`` sink: each epoch's rows staged and published as one directory
(:mod:`.target`), taken back by moving them aside or, with ``retract: revisions``, by writing
revisions (:mod:`.changelog`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from eddyline.api.sinks import SINKS
from eddyline.api.units import Files
from eddyline.columns import DIFF
from eddyline.io.files.changelog import Revisions
from eddyline.io.files.target import FilesTarget, prepare_parts, write_frame, write_table
from eddyline.io.sinks import Sink, SinkKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.sinks import SinkSpec


class FilesSink(Sink):
    rewinds = True

    def __init__(self, spec: SinkSpec):
        super().__init__(spec)
        self.target = FilesTarget(spec.params)
        self.revisions = Revisions(self.target) if spec.params.retract == "revisions" else None

    def stage(self, df: DataFrame, epoch: int) -> None:
        self.target.writer = self.writer
        if self.revisions is not None and DIFF not in df.columns:
            df = df.selectExpr("*", f"CAST(1 AS BIGINT) AS {DIFF}")
        write_frame(df, self.target, epoch, in_driver=self.small_epoch)

    takes_arrow = True

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        self.target.writer = self.writer
        if self.revisions is not None and DIFF not in table.column_names:
            table = table.append_column(DIFF, pa.array(np.ones(table.num_rows, np.int64)))
        write_table(table, self.target, epoch)

    def lane_parts(self, epoch: int) -> dict[str, Any] | None:
        if self.revisions is not None:
            return None  # (revisions are written from every epoch's rows at once)
        self.target.writer = self.writer
        return prepare_parts(self.target, epoch)

    def parts_staged(self, epoch: int, names: list[str]) -> None:
        self.target.staged(epoch, names)

    def fence(self, generation: int) -> None:
        super().fence(generation)
        self.target.writer = self.writer
        self.target.fence(generation)

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        if self.revisions is not None:
            self.revisions.write(epoch)
        self.target.publish(epoch, tentative)

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        if self.revisions is not None:
            self.revisions.take_back(epochs, at_epoch)
        else:
            self.target.retract(epochs, at_epoch)

    def restore(self, at_epoch: int) -> None:
        if self.revisions is not None:
            self.revisions.put_back(at_epoch)
        else:
            self.target.restore(at_epoch)

    def drop(self, epoch: int) -> None:
        self.target.discard(epoch)


@SINKS.register
class FilesSinkKind(SinkKind):
    key = "files"
    params = Files
    live_params = ("path",)

    def check(self, sink: SinkSpec) -> list[str]:
        if sink.params.schema_ is not None:
            return ["files.schema: a sink writes its input's schema; remove 'schema'"]
        if sink.params.header is not None and sink.params.format != "csv":
            return [f"files.header: only CSV files have a header line, not {sink.params.format}"]
        if sink.params.retract == "revisions" and sink.params.format != "parquet":
            return [f"files.retract: revisions are written as Parquet; set format: parquet (not {sink.params.format})"]
        return []

    def describe(self, params: Any) -> str:
        return f"{params.path} ({params.format}, one epoch=N directory per epoch)"

    def make(self, spec: SinkSpec, console: Any = None) -> FilesSink:
        return FilesSink(spec)
