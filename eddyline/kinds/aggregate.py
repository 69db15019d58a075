"""``aggregate: {key, aggregates, time}``: an unbounded aggregate per key whose output is a
changelog of revisions (per epoch and changed key: the old row with ``_diff`` −1, the new with +1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Model, Name, names
from eddyline.kinds.base import KeyedStepKind

if TYPE_CHECKING:
    import pyarrow as pa

    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel
    from eddyline.operators.keyed import KeyedAggregateKernel


class Aggregates(Model):
    """Aggregates per key: ``count/sum/min/max/avg(col)``, ``last(col)`` (by ``time``) and
    ``max_by(col, by)``."""

    key: Columns
    aggregates: dict[Name, str] = Field(min_length=1)  # count/sum/min/max/avg(col), last(col), max_by(col, by)
    time: str | None = None


class KeyedAggregate(Aggregates):
    """An unbounded aggregate per key whose output is a changelog: each epoch, per key whose
    value changed, its previous row with ``_diff`` = −1 (unless it is new) and its new row with
    +1 (docs/revisions.md). ``combined``: the input rows are the partials of a ``combine`` step
    with the same key, aggregates and time (:mod:`eddyline.kinds.combine`)."""

    combined: bool = False


def aggregate_columns(p: Aggregates) -> frozenset[str]:
    """The input columns aggregates per key read (lower case)."""
    from eddyline.operators.keyed import KeyedAggregateSpec

    used = [*names(p.key), *([p.time] if p.time else [])]
    for name, text in p.aggregates.items():
        spec = KeyedAggregateSpec.parse(name, text)
        used += [c for c in (spec.column, spec.by) if c is not None]
    return frozenset(c.lower() for c in used)


def aggregate_kernel(p: Aggregates, schema: pa.Schema, combined: bool = False) -> KeyedAggregateKernel:
    """The kernel of aggregates ``p`` over rows of ``schema`` (``combined``: over the partials
    of a ``combine`` step, of that schema)."""
    from eddyline.operators.keyed import KeyedAggregateKernel, KeyedAggregateSpec

    specs = [KeyedAggregateSpec.parse(name, text) for name, text in p.aggregates.items()]
    make = KeyedAggregateKernel.merging if combined else KeyedAggregateKernel
    return make(schema, names(p.key), specs, p.time)


@STEPS.register
class KeyedAggregateKind(KeyedStepKind):
    key = "aggregate"
    params = KeyedAggregate

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return (*self.key_columns(step.params), *step.params.aggregates)

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        p: KeyedAggregate = step.params
        return (None if p.combined else aggregate_columns(p),)

    def time_columns(self, step: StepSpec) -> tuple[str | None, ...]:
        # partials carry no event time (an aggregate ignores the watermark anyway)
        return (None,) if step.params.combined else (step.params.time,)

    def shed_inputs(self, step: StepSpec) -> tuple[int, ...]:
        return () if step.params.combined else (0,)  # a partial row stands for many rows: not shed

    def revisions(self, params: Any) -> str | None:
        from eddyline.operators.keyed import KeyedAggregateSpec, keyed_revision_problem

        specs = [KeyedAggregateSpec.parse(name, text) for name, text in params.aggregates.items()]
        return keyed_revision_problem([(s.name, s.func) for s in specs])

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        (schema,) = schemas
        return aggregate_kernel(params, schema, params.combined)
