"""``union: [a, b]``: the rows of several inputs with the same columns (no shuffle)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

from eddyline.api.steps import STEPS
from eddyline.api.units import Name
from eddyline.columns import DIFF
from eddyline.errors import SpecError
from eddyline.kinds.base import CompileContext, StepKind
from eddyline.plan.branches import quoted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec


def _two_or_more(value: tuple[str, ...]) -> tuple[str, ...]:
    if len(value) < 2:
        raise ValueError(f"expected at least 2 inputs, got {len(value)}")
    return value


@STEPS.register
class Union(StepKind):
    key = "union"
    params = Annotated[tuple[Name, ...], AfterValidator(_two_or_more)]
    names_inputs = True

    def inputs(self, step: StepSpec) -> tuple[str, ...]:
        return tuple(step.params)

    def input_fields(self, step: StepSpec) -> list[tuple[str, str]]:
        return [("union", i) for i in step.params]

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return inputs[0]

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        return (wanted,) * len(step.params)

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        return [f"union of {', '.join(step.params)}   [Spark union, no shuffle]"]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        if any(DIFF in df.columns for df in inputs):  # an insert-only input's rows weigh +1
            inputs = [df if DIFF in df.columns else df.selectExpr("*", f"CAST(1 AS BIGINT) AS {DIFF}") for df in inputs]
        first = inputs[0]
        for other in inputs[1:]:
            if [f.name for f in other.schema] != [f.name for f in first.schema]:
                raise SpecError(
                    f"step '{step.name}': union: inputs must have the same columns; "
                    f"'{step.params[0]}' has {first.columns}, another has {other.columns}"
                )
        # inputs that branch off one node are made from one read of it
        return ctx.union_of(step, [(df, [(c, quoted(c)) for c in first.columns]) for df in inputs])
