"""``session_window: {key, time, gap, aggregates}``: event-time sessions per key, closed by a
``gap`` without rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Duration, Model, Name, names
from eddyline.kinds.base import Aggregating, KeyedStepKind

if TYPE_CHECKING:
    import pyarrow as pa

    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel


class SessionWindow(Aggregating, Model):
    key: Columns
    time: str
    gap: Duration = Field(gt=0)
    aggregates: dict[Name, str] = Field(min_length=1)
    watermark_delay: Duration = 0


@STEPS.register
class SessionWindowKind(KeyedStepKind):
    key = "session_window"
    live_params = ("watermark_delay",)
    params = SessionWindow

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return (*self.key_columns(step.params), "session_start", "session_end", *step.params.aggregates)

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        sw: SessionWindow = step.params
        return (sw.read_columns(*names(sw.key), sw.time),)

    def lane_columns(self, step: StepSpec) -> frozenset[str] | None:
        return self.reads(step, None)[0]  # a session's rows are its keys, bounds and aggregates

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.operators.session import SessionWindowKernel

        (schema,) = schemas
        return SessionWindowKernel(schema, names(params.key), params.time, params.gap, params.parsed_aggregates)
