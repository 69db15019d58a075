"""``aggregate: {key, aggregates, time}``: an unbounded aggregate per key with a changelog output
(per epoch one row per key whose value changed, ``_op`` = insert, then update)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from eddyline.api.registry import STEPS
from eddyline.api.units import Columns, Model, Name, names
from eddyline.kinds.base import KeyedStepKind

if TYPE_CHECKING:
    import pyarrow as pa

    from eddyline.operators.base import Kernel


class KeyedAggregate(Model):
    """An unbounded aggregate per key with a changelog output: each epoch, one row per key whose
    value changed, with ``_op`` = ``insert`` (first time) or ``update`` (upsert semantics)."""

    key: Columns
    aggregates: dict[Name, str] = Field(min_length=1)  # count/sum/min/max/avg(col), last(col), max_by(col, by)
    time: str | None = None


@STEPS.register
class KeyedAggregateKind(KeyedStepKind):
    key = "aggregate"
    params = KeyedAggregate

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.operators.keyed import KeyedAggregateKernel, KeyedAggregateSpec

        (schema,) = schemas
        specs = [KeyedAggregateSpec.parse(name, text) for name, text in params.aggregates.items()]
        return KeyedAggregateKernel(schema, names(params.key), specs, params.time)
