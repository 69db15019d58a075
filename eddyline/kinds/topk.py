"""``top_k: {partition_by, order_by, k, time, with_ties}``: the top rows of each partition (e.g.
each window), emitted once the watermark passes the partition's ``time``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Duration, Model, names
from eddyline.kinds.base import KeyedStepKind

if TYPE_CHECKING:
    import pyarrow as pa

    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel


class TopK(Model):
    """The top ``k`` rows of each partition (e.g. each window), emitted once the watermark passes
    the partition's ``time`` (e.g. its ``window_end``); ``with_ties`` keeps rows tied with the k-th."""

    partition_by: Columns
    order_by: tuple[str, ...] = Field(min_length=1)  # "column DESC" / "column ASC" / "column"
    k: int = Field(default=1, gt=0)
    time: str
    with_ties: bool = True
    watermark_delay: Duration = 0

    @model_validator(mode="after")
    def _order(self) -> TopK:
        self.ordering  # noqa: B018  (raises on a malformed order_by)
        return self

    @property
    def ordering(self) -> tuple[tuple[str, str], ...]:
        out = []
        for item in self.order_by:
            parts = item.split()
            if len(parts) == 1 or (len(parts) == 2 and parts[1].lower() in ("asc", "desc")):
                out.append((parts[0], "desc" if len(parts) == 2 and parts[1].lower() == "desc" else "asc"))
            else:
                raise ValueError(f"order_by: expected 'column [ASC|DESC]', got {item!r}")
        return tuple(out)


@STEPS.register
class TopKKind(KeyedStepKind):
    key = "top_k"
    params = TopK
    key_field = "partition_by"
    live_params = ("k", "watermark_delay")

    def revisions(self, params: Any) -> str | None:
        return None  # a revised input's groups are ranked over their summed rows when complete

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return None if inputs[0] is None else (*inputs[0], "rank")

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        t: TopK = step.params
        return self.passing_through(wanted, *names(t.partition_by), *(c for c, _ in t.ordering), t.time)

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.columns import DIFF
        from eddyline.operators.topk import TopKKernel, WeightedTopKKernel

        (schema,) = schemas
        t = params
        kind = WeightedTopKKernel if DIFF in schema.names else TopKKernel
        return kind(schema, names(t.partition_by), list(t.ordering), t.k, t.time, t.with_ties)
