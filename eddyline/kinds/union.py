"""``union: [a, b]``: the rows of several inputs with the same columns (no shuffle)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

from eddyline.api.steps import STEPS
from eddyline.api.units import Name
from eddyline.columns import DIFF
from eddyline.errors import SpecError
from eddyline.kinds.base import CompileContext, LaneFeed, StepKind
from eddyline.plan.branches import quoted

if TYPE_CHECKING:
    import pyarrow as pa
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
        _same_columns(step, [df.columns for df in inputs])
        first = inputs[0]
        # inputs that branch off one node are made from one read of it
        return ctx.union_of(step, [(df, [(c, quoted(c)) for c in first.columns]) for df in inputs])

    def lane_run(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> pa.Table:
        """The inputs' rows one after the other, with the columns and types Spark's union gives
        them (inputs of other types, which Spark widens to a common one, are refused)."""
        import numpy as np
        import pyarrow as pa

        if any(DIFF in t.column_names for t in inputs):
            inputs = [t if DIFF in t.column_names else t.append_column(DIFF, pa.array(np.ones(t.num_rows, np.int64)))
                      for t in inputs]
        _same_columns(step, [t.column_names for t in inputs])
        first = inputs[0].schema
        for name, other in zip(step.params[1:], inputs[1:], strict=True):
            differ = [f.name for f, g in zip(first, other.schema, strict=True) if f.type != g.type]
            if differ:
                c = differ[0]
                raise SpecError(f"step '{step.name}': union: resident lanes take inputs of the same column types; "
                                f"'{c}' is {first.field(c).type} in '{step.params[0]}' and "
                                f"{other.schema.field(c).type} in '{name}' (Spark widens it)")
        schema = pa.schema([f.with_nullable(any(t.schema.field(i).nullable for t in inputs)) for i, f in enumerate(first)])
        return pa.concat_tables([t.cast(schema) for t in inputs])


def _same_columns(step: StepSpec, columns: list[list[str]]) -> None:
    first = columns[0]
    for other in columns[1:]:
        if other != first:
            raise SpecError(
                f"step '{step.name}': union: inputs must have the same columns; "
                f"'{step.params[0]}' has {first}, another has {other}"
            )
