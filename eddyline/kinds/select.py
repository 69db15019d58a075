"""``select: [a, "b * 2 AS c"]``: Spark SQL expressions over each row (JVM)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator

from eddyline.api.steps import STEPS
from eddyline.columns import DIFF
from eddyline.kinds.base import (
    CompileContext,
    LaneFeed,
    StepKind,
    columns_of,
    lane_sql,
    output_name,
    sql_columns,
    sql_problems,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec
    from eddyline.operators.sqlsteps import SqlStep


def _not_empty(value: tuple[str, ...]) -> tuple[str, ...]:
    if not value:
        raise ValueError("expected at least one expression")
    return value


@STEPS.register
class Select(StepKind):
    key = "select"
    params = Annotated[tuple[str, ...], AfterValidator(_not_empty)]
    live_params = ("select",)

    def passes_keys(self, params: Any, keys: tuple[str, ...]) -> bool:
        """When every key column is selected as it is (``*``, ``k`` or ```k```)."""
        return all(any(e.strip() in ("*", k, f"`{k}`") for e in params) for k in keys)

    def check(self, step: StepSpec) -> list[str]:
        return sql_problems([(f"select[{i}]", e) for i, e in enumerate(step.params)])

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        out: list[str] = []
        for name in map(output_name, step.params):
            if name is None:  # *
                if inputs[0] is None:
                    return None
                out += inputs[0]
            else:
                out.append(name)
        return tuple(out)

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        return (columns_of(*(sql_columns(e) for e in step.params)),)

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        return [f"select  {', '.join(step.params)}   [Spark SQL, JVM]"]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        out = inputs[0].selectExpr(*step.params)
        # a revision keeps its weight (the input's schema is known already; the output's is
        # asked for only when there is a weight to keep)
        if DIFF in inputs[0].columns and DIFF not in out.columns:
            out = inputs[0].selectExpr(*step.params, DIFF)
        return out

    def lane_step(self, step: StepSpec) -> SqlStep:
        return lane_sql(step, expressions=tuple(step.params))

    def lane_run(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> pa.Table:
        (rows,) = inputs
        out = feed.prepared(step).run(rows)
        if DIFF in rows.column_names and DIFF not in out.column_names:  # a revision keeps its weight, as above
            out = out.append_column(DIFF, rows.column(DIFF))
        return out
