"""``over_aggregate``: SQL's ``AGG(col) OVER (PARTITION BY key ORDER BY time ROWS n PRECEDING)``."""

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


class OverAggregate(Aggregating, Model):
    """SQL's ``AGG(col) OVER (PARTITION BY key ORDER BY time ROWS preceding PRECEDING)``: one
    output row per input row, once the watermark passes it, with aggregates over it and up to
    ``preceding`` earlier rows of its key."""

    key: Columns
    time: str
    preceding: int = Field(ge=0)
    aggregates: dict[Name, str] = Field(min_length=1)
    watermark_delay: Duration = 0


@STEPS.register
class OverAggregateKind(KeyedStepKind):
    key = "over_aggregate"
    live_params = ("watermark_delay",)
    params = OverAggregate

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return None if inputs[0] is None else (*inputs[0], *step.params.aggregates)

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.operators.over import OverAggregateKernel

        (schema,) = schemas
        return OverAggregateKernel(schema, names(params.key), params.time, params.preceding, params.parsed_aggregates)
