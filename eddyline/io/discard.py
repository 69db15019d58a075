"""The ``discard`` sink: runs the epoch's output to the end and throws the rows away.

For measuring a query without the cost of writing its output (Flink's ``blackhole``
connector, Spark's ``noop`` format): the rows are still computed and counted, nothing is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from eddyline.api.sinks import SINKS
from eddyline.api.units import Model
from eddyline.io.sinks import Sink, SinkKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.sinks import SinkSpec


class Discard(Model):
    """Compute and count the output, keep none of it."""


class DiscardSink(Sink):
    # nothing is visible, so there is nothing to take back or put back: a replay may rewind it
    rewinds = True

    def stage(self, df: DataFrame, epoch: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    takes_arrow = True

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        pass

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        pass

    def restore(self, at_epoch: int) -> None:
        pass


@SINKS.register
class DiscardKind(SinkKind):
    key = "discard"
    params = Discard

    def make(self, spec: SinkSpec, console: Any = None) -> DiscardSink:
        return DiscardSink(spec)
