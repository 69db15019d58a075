"""``udf: {function, schema, batch}``: a user's vectorized Python function over every batch.

It runs inside Spark's Python workers through ``mapInArrow`` (no shuffle, no state); a failure
names the step and the function (the message travels back in Spark's task error, see
:data:`eddyline.errors.TASK_MARK`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import Field

from eddyline.api.steps import STEPS
from eddyline.api.units import Model
from eddyline.columns import DIFF
from eddyline.errors import TASK_MARK, LaneStepError, SpecError
from eddyline.kinds.base import (
    CompileContext,
    LaneFeed,
    StepKind,
    arrow_schema,
    ddl,
    first_line,
    resolve,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec


class Udf(Model):
    """A vectorized Python function applied to every batch of rows (stateless).

    ``function`` is ``"package.module:name"``; it receives a ``pyarrow.RecordBatch`` (``batch:
    arrow``) or a ``pandas.DataFrame`` (``batch: pandas``) and returns the same kind, with the
    columns of ``schema`` (Spark DDL).
    """

    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    schema_: str = Field(alias="schema", min_length=1)
    batch: Literal["arrow", "pandas"] = "arrow"


#: the most rows the function is given at once on a resident lane: Spark's
#: ``spark.sql.execution.arrow.maxRecordsPerBatch`` as Eddyline's sessions leave it
BATCH_ROWS = 10_000


@dataclass(frozen=True)
class UdfRunner:
    step: str
    function: str
    batch: str  # "arrow" | "pandas"
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = resolve(self.function)
        for rb in batches:
            try:
                result = fn(rb.to_pandas() if self.batch == "pandas" else rb)
            except Exception as e:
                raise RuntimeError(
                    f"{TASK_MARK} step '{self.step}': udf '{self.function}' failed on a batch of {rb.num_rows} rows: "
                    f"{type(e).__name__}: {e}"
                ) from e
            yield self._conform(result)

    def _conform(self, result: Any) -> pa.RecordBatch:
        if self.batch == "pandas":
            import pandas as pd

            if not isinstance(result, pd.DataFrame):
                raise TypeError(f"{TASK_MARK} step '{self.step}': udf '{self.function}' returned {type(result).__name__}; expected a pandas DataFrame")
            table = pa.Table.from_pandas(result, preserve_index=False)
        elif isinstance(result, pa.RecordBatch):
            table = pa.Table.from_batches([result])
        elif isinstance(result, pa.Table):
            table = result
        else:
            raise TypeError(
                f"{TASK_MARK} step '{self.step}': udf '{self.function}' returned {type(result).__name__}; expected a pyarrow RecordBatch"
            )
        missing = [n for n in self.schema.names if n not in table.column_names]
        if missing:
            raise ValueError(
                f"{TASK_MARK} step '{self.step}': udf '{self.function}' returned columns {table.column_names}; "
                f"missing {missing} of the declared schema"
            )
        try:
            table = table.select(self.schema.names).cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"{TASK_MARK} step '{self.step}': udf '{self.function}': result does not fit the schema: {e}") from e
        return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=self.schema)


@STEPS.register
class UdfKind(StepKind):
    key = "udf"
    params = Udf
    live_params = ("function",)  # another module:function (imported modules are not reloaded), same schema

    def revisions(self, params: Any) -> str | None:
        try:
            declared = ddl(params.schema_).fieldNames()
        except Exception:
            return None  # compile names the bad schema
        if DIFF in declared:
            return None
        return f"declare '{DIFF} bigint' in its schema and return each row with its input row's {DIFF}"

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        u = step.params
        return [f"udf {u.function} ({u.batch} batches)   [Python, mapInArrow, no shuffle]"]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        struct, runner = self._runner(step)
        return inputs[0].mapInArrow(runner, struct)

    def _runner(self, step: StepSpec) -> tuple[Any, UdfRunner]:
        """The declared schema (Spark's) and the runner; SpecError naming the field at fault."""
        udf = step.params
        try:
            resolve(udf.function)
        except ValueError as e:
            raise SpecError(f"step '{step.name}': udf.function: {e}") from None
        try:
            struct = ddl(udf.schema_)
        except Exception as e:
            raise SpecError(f"step '{step.name}': udf.schema: expected Spark DDL like 'a long, b string': {first_line(e)}") from None
        return struct, UdfRunner(step.name, udf.function, udf.batch, arrow_schema(struct))

    def lane_step(self, step: StepSpec) -> UdfRunner:
        return self._runner(step)[1]

    def lane_run(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> pa.Table:
        """The function over the lane's rows in batches of at most :data:`BATCH_ROWS`, as Spark's
        tasks hand it theirs (no call when the lane has no row, as a task with none makes none)."""
        runner: UdfRunner = feed.prepared(step)
        (rows,) = inputs
        batches = rows.combine_chunks().to_batches(max_chunksize=BATCH_ROWS) if rows.num_rows else []
        try:
            out = list(runner(iter(batches)))
        except Exception as e:
            if TASK_MARK not in str(e):
                raise
            raise LaneStepError(str(e)) from e
        return pa.Table.from_batches(out, schema=runner.schema)
