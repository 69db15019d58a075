"""``aggregate: {key, aggregates, time}``: an unbounded aggregate per key whose output is a
changelog of revisions (per epoch and changed key: the old row with ``_diff`` −1, the new with +1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from eddyline.api.registry import STEPS
from eddyline.api.units import Columns, Model, Name, names
from eddyline.kinds.base import KeyedStepKind

if TYPE_CHECKING:
    import pyarrow as pa

    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel


class KeyedAggregate(Model):
    """An unbounded aggregate per key whose output is a changelog: each epoch, per key whose
    value changed, its previous row with ``_diff`` = −1 (unless it is new) and its new row with
    +1 (docs/revisions.md)."""

    key: Columns
    aggregates: dict[Name, str] = Field(min_length=1)  # count/sum/min/max/avg(col), last(col), max_by(col, by)
    time: str | None = None


@STEPS.register
class KeyedAggregateKind(KeyedStepKind):
    key = "aggregate"
    params = KeyedAggregate

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        from eddyline.operators.keyed import KeyedAggregateSpec

        p: KeyedAggregate = step.params
        used = [*names(p.key), *([p.time] if p.time else [])]
        for name, text in p.aggregates.items():
            spec = KeyedAggregateSpec.parse(name, text)
            used += [c for c in (spec.column, spec.by) if c is not None]
        return (frozenset(c.lower() for c in used),)

    def revisions(self, params: Any) -> str | None:
        from eddyline.operators.keyed import KeyedAggregateSpec, keyed_revision_problem

        specs = [KeyedAggregateSpec.parse(name, text) for name, text in params.aggregates.items()]
        return keyed_revision_problem([(s.name, s.func) for s in specs])

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.operators.keyed import KeyedAggregateKernel, KeyedAggregateSpec

        (schema,) = schemas
        specs = [KeyedAggregateSpec.parse(name, text) for name, text in params.aggregates.items()]
        return KeyedAggregateKernel(schema, names(params.key), specs, params.time)
