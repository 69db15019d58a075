"""``combine: {key, aggregates, time}``: the local half of a local/global aggregate split.

Before the shuffle, inside the tasks that read the input (``mapInArrow``, no state), the rows of
each key are merged into one partial row: its count, sum, min, max, the ``last``/``max_by``
value with its ordering value, an average's sum and count. An ``aggregate`` step with the same
key, aggregates and time and ``combined: true`` then merges these partials into its state
(:meth:`~eddyline.operators.keyed.KeyedAggregateKernel.merging`) and emits what it would have
emitted from the rows themselves.

This is what the ``aggregate-local-global-split`` rewrite rule (:mod:`eddyline.kinds.rewrite`)
puts in front of an aggregate whose hot key lanes cannot spread: the lane that owns the key
then receives one row per key and task chunk instead of every row of the key. A revised input
(``_diff``) is combined for count, sum and avg; min and max would have to keep every value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from eddyline.api.steps import STEPS
from eddyline.api.units import names
from eddyline.errors import TASK_MARK, LaneStepError, SpecError
from eddyline.kinds.aggregate import Aggregates, aggregate_columns, aggregate_kernel
from eddyline.kinds.base import CompileContext, LaneFeed, StepKind, arrow_schema, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec
    from eddyline.operators.keyed import KeyedAggregateKernel

#: rows a task gathers before it combines them: more rows, fewer partials per key; bounded memory
CHUNK_ROWS = 200_000


@dataclass(frozen=True)
class Combiner:
    """In a Spark task: the task's rows, in chunks of up to :data:`CHUNK_ROWS`, as partials."""

    step: str
    kernel: KeyedAggregateKernel

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunk: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            chunk.append(batch)
            rows += batch.num_rows
            if rows >= CHUNK_ROWS:
                yield from self._combined(chunk)
                chunk, rows = [], 0
        if rows:
            yield from self._combined(chunk)

    def _combined(self, chunk: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            out = self.kernel.combine(pa.Table.from_batches(chunk))
        except Exception as e:
            raise RuntimeError(f"{TASK_MARK} step '{self.step}': combine failed: {type(e).__name__}: {e}") from e
        yield from out.combine_chunks().to_batches()


@STEPS.register
class CombineKind(StepKind):
    key = "combine"
    offered = False  # the local/global rewrite writes it; a user writes an aggregate
    params = Aggregates

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        return (aggregate_columns(step.params),)

    def revisions(self, params: Any) -> str | None:
        from eddyline.operators.keyed import KeyedAggregateSpec

        kept = [n for n, text in params.aggregates.items() if KeyedAggregateSpec.parse(n, text).func not in ("count", "sum", "avg")]
        if kept:
            return f"aggregates {', '.join(kept)}: only count, sum and avg partials can take a row back"
        return None

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        p = step.params
        return [f"combine  {', '.join(names(p.key))}: {', '.join(p.aggregates)}   "
                "[Python, mapInArrow, no shuffle: one partial row per key and task chunk]"]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        (df,) = inputs
        kernel = self._kernel(step, arrow_schema(df.schema))
        return df.mapInArrow(Combiner(step.name, kernel), spark_schema(kernel.partial_schema))

    def _kernel(self, step: StepSpec, schema: pa.Schema) -> KeyedAggregateKernel:
        try:
            return aggregate_kernel(step.params, schema)
        except (ValueError, KeyError) as e:
            raise SpecError(f"step '{step.name}': combine: {e}") from None

    def lane_run(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> pa.Table:
        """The lane's rows as partials, in chunks of up to :data:`CHUNK_ROWS` as a Spark task
        combines its own (the aggregate after it emits the same whatever rows each partial
        stands for)."""
        (rows,) = inputs
        kernel = self._kernel(step, pa.schema([f.with_nullable(True) for f in rows.schema]))
        batches = rows.combine_chunks().to_batches() if rows.num_rows else []
        try:
            out = list(Combiner(step.name, kernel)(iter(batches)))
        except RuntimeError as e:  # (marked: as a failed task says it)
            raise LaneStepError(str(e)) from e
        return pa.Table.from_batches(out, schema=kernel.partial_schema) if out else kernel.partial_schema.empty_table()
