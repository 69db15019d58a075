"""The ``memory`` sink: keeps every epoch's rows in the driver (tests, notebooks)."""

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


class Memory(Model):
    """Collect output in the driver; read it back with ``Network.collected(sink_name)``."""


class MemorySink(Sink):
    """Keeps every epoch's rows in the driver, keyed by epoch (so a replay replaces, never adds).
    Tentative epochs are listed in ``tentative``; a retraction drops their rows."""

    counts_itself = True
    rewinds = True

    def __init__(self, spec: SinkSpec):
        super().__init__(spec)
        self.tentative: set[int] = set()
        #: per epoch that retracted earlier epochs' rows: those rows, to put back (undo)
        self.aside: dict[int, dict[int, pa.Table]] = {}

    def stage(self, df: DataFrame, epoch: int) -> None:
        self.collected[epoch] = df.toArrow()

    takes_arrow = True

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        self.collected[epoch] = table

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        if tentative:
            self.tentative.add(epoch)

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        aside = self.aside.setdefault(at_epoch, {})
        aside.update({e: self.collected.pop(e) for e in epochs if e in self.collected})
        self.tentative.difference_update(epochs)

    def restore(self, at_epoch: int) -> None:
        for epoch, rows in self.aside.get(at_epoch, {}).items():
            self.collected.setdefault(epoch, rows)

    def table(self) -> pa.Table | None:
        if not self.collected:
            return None
        return pa.concat_tables([self.collected[e] for e in sorted(self.collected)])


@SINKS.register
class MemoryKind(SinkKind):
    key = "memory"
    params = Memory

    def make(self, spec: SinkSpec, console: Any = None) -> MemorySink:
        return MemorySink(spec)
