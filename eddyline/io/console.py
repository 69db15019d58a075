"""The ``console`` sink: prints each epoch's output (at most ``rows`` rows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import Field

from eddyline.api.sinks import SINKS
from eddyline.api.units import Model
from eddyline.io.sinks import Sink, SinkKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from rich.console import Console as RichConsole

    from eddyline.api.sinks import SinkSpec


class Console(Model):
    """Print each epoch's output (at most ``rows`` rows)."""

    rows: int = Field(default=20, gt=0)


class ConsoleSink(Sink):
    counts_itself = True
    """Prints each epoch's output; it collects the epoch to the driver, so keep it for small outputs."""

    def __init__(self, spec: SinkSpec, console: RichConsole | None = None):
        super().__init__(spec)
        self.console = console

    def stage(self, df: DataFrame, epoch: int) -> None:
        # The whole epoch, not ``limit(rows)``: a limited action stops reading early, and the
        # epoch's observed metrics (input rows, late rows) come from the first action that runs.
        self.collected[epoch] = df.toArrow()

    takes_arrow = True

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        self.collected[epoch] = table

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        from rich.console import Console
        from rich.table import Table

        table = self.collected.pop(epoch, None)
        if table is None:
            return
        shown = self.spec.params.rows
        more = f" (first {shown} of {table.num_rows} rows)" if table.num_rows > shown else ""
        kind = " (tentative)" if tentative else ""
        out = Table(title=f"{self.name} · epoch {epoch}{kind}{more}", show_lines=False)
        for name in table.column_names:
            out.add_column(name)
        for row in table.slice(0, shown).to_pylist():
            out.add_row(*[str(v) for v in row.values()])
        (self.console or Console()).print(out)

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        from rich.console import Console

        listed = ", ".join(map(str, epochs))
        (self.console or Console()).print(f"{self.name} · epoch {at_epoch}: retracts tentative epochs {listed}")


@SINKS.register
class ConsoleKind(SinkKind):
    key = "console"
    params = Console

    def make(self, spec: SinkSpec, console: Any = None) -> ConsoleSink:
        return ConsoleSink(spec, console)
