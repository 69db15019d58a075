"""``dedup: {key, time, ttl}``: the first row per key; a key is remembered for ``ttl`` of event time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Duration, Model, names
from eddyline.kinds.base import KeyedStepKind

if TYPE_CHECKING:
    import pyarrow as pa

    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel


class Dedup(Model):
    """Keep the first row per key; a key is forgotten ``ttl`` after its first row's event time."""

    key: Columns
    time: str
    ttl: Duration = Field(gt=0)
    watermark_delay: Duration = 0


@STEPS.register
class DedupKind(KeyedStepKind):
    key = "dedup"
    live_params = ("watermark_delay",)
    params = Dedup

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return inputs[0]

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        return self.passing_through(wanted, *names(step.params.key), step.params.time)

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.operators.dedup import DedupKernel

        (schema,) = schemas
        return DedupKernel(schema, names(params.key), params.time, params.ttl)
