"""``filter: "price > 100"``: keeps the rows where a Spark SQL condition holds (JVM)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eddyline.api.steps import STEPS
from eddyline.kinds.base import (
    CompileContext,
    LaneFeed,
    StepKind,
    columns_of,
    lane_sql,
    sql_columns,
    sql_problems,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec
    from eddyline.operators.sqlsteps import SqlStep


@STEPS.register
class Filter(StepKind):
    key = "filter"
    params = str
    live_params = ("filter",)

    def passes_keys(self, params: Any, keys: tuple[str, ...]) -> bool:
        return True  # a filter only thins the rows

    def check(self, step: StepSpec) -> list[str]:
        return sql_problems([("filter", step.params)])

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        return (columns_of(wanted, sql_columns(step.params)),)

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        return [f"filter  {step.params}   [Spark SQL, JVM]"]

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return inputs[0]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        from pyspark.sql import functions as F

        return inputs[0].filter(F.expr(step.params))

    def lane_step(self, step: StepSpec) -> SqlStep:
        return lane_sql(step, condition=step.params)

    def lane_run(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> pa.Table:
        return feed.prepared(step).run(inputs[0])
