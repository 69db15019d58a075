"""``join``: an equi-join of two streams, unbounded (optional ``ttl``), windowed or interval.

Both sides travel in one frame (``_kg``, ``_side`` 0/1, ``l__*`` and ``r__*`` columns, the other
side's null), so one shuffle brings matching keys together. Interval and unbounded joins can
have a hot key group split over several lanes (SPREADFIRE, see
:meth:`eddyline.runtime.compile.EpochCompiler.to_lanes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Duration, Model, Name, names
from eddyline.columns import KG, join_right_names
from eddyline.errors import SpecError
from eddyline.kinds.base import CompileContext, LaneFeed, StepKind, arrow_schema, build_kernel
from eddyline.plan.branches import quoted

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel


class Join(Model):
    """An equi-join of two streams.

    * ``kind: unbounded`` (default): every matching pair, as soon as both rows are there; rows
      are forgotten ``ttl`` after their event time (never, without ``ttl``);
    * ``kind: window``: pairs within the same tumbling window of ``size``, emitted when the
      window closes;
    * ``kind: interval``: a right row at ``right_time`` joins a left row whose
      ``[left_time, left_end]`` contains it (a bid and the auction open at that moment).
    """

    left: Name
    right: Name
    left_key: Columns
    right_key: Columns
    kind: Literal["unbounded", "window", "interval"] = "unbounded"
    left_time: str | None = None
    right_time: str | None = None
    left_end: str | None = None
    size: Duration | None = Field(default=None, gt=0)
    ttl: Duration | None = Field(default=None, gt=0)
    watermark_delay: Duration = 0

    @model_validator(mode="after")
    def _kind_fields(self) -> Join:
        if len(names(self.left_key)) != len(names(self.right_key)):
            raise ValueError("right_key: expected as many columns as left_key")
        need = {
            "window": ("left_time", "right_time", "size"),
            "interval": ("left_time", "left_end", "right_time"),
            "unbounded": ("left_time", "right_time") if self.ttl is not None else (),
        }[self.kind]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required for a {self.kind} join")
        return self


@STEPS.register
class JoinKind(StepKind):
    key = "join"
    live_params = ("watermark_delay",)
    params = Join
    stateful = True
    names_inputs = True
    stores_read_columns = True

    def inputs(self, step: StepSpec) -> tuple[str, ...]:
        return (step.params.left, step.params.right)

    def input_fields(self, step: StepSpec) -> list[tuple[str, str]]:
        return [("join.left", step.params.left), ("join.right", step.params.right)]

    def time_columns(self, step: StepSpec) -> tuple[str | None, ...]:
        return (step.params.left_time, step.params.right_time)

    def shed_inputs(self, step: StepSpec) -> tuple[int, ...]:
        # only the right input: a left row dropped would lose every match it is still waiting for
        return (1,)

    def spreadable(self, params: Any) -> bool:
        return params.kind in ("interval", "unbounded")

    def revisions(self, params: Any) -> str | None:
        return None  # a pair weighs the product of its rows' weights

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        left, right = inputs
        if left is None or right is None:
            return None
        extra = ("window_start", "window_end") if step.params.kind == "window" else ()
        return (*left, *join_right_names(left, right), *extra)

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.operators.join import (
            IntervalJoinKernel,
            UnboundedJoinKernel,
            WindowJoinKernel,
        )

        left, right = schemas
        j = params
        lk, rk = names(j.left_key), names(j.right_key)
        if j.kind == "window":
            assert j.left_time and j.right_time and j.size
            return WindowJoinKernel(left, right, lk, rk, left_time=j.left_time, right_time=j.right_time, size_ms=j.size)
        if j.kind == "interval":
            assert j.left_time and j.left_end and j.right_time
            return IntervalJoinKernel(left, right, lk, rk, left_start=j.left_time, left_end=j.left_end, right_time=j.right_time)
        return UnboundedJoinKernel(left, right, lk, rk, ttl_ms=j.ttl, left_time=j.left_time, right_time=j.right_time)

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        return [
            f"join  {self.summary(step.params)}",
            f"  1. JVM: both inputs keyed by their join keys, tagged _side; _kg = pmod(xxhash64(keys), {key_groups})",
            "  2. shuffle: repartition(lanes, routing value of _kg), one heartbeat row per lane",
            "  3. Python per lane (mapInArrow): the join kernel against its key groups' state",
        ]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        from pyspark.sql.types import StructType

        left, right = inputs
        j = step.params
        lkeys, rkeys = names(j.left_key), names(j.right_key)
        ltypes = {f.name: f.dataType for f in left.schema}
        rtypes = {f.name: f.dataType for f in right.schema}
        for what, keys, have in (("left_key", lkeys, ltypes), ("right_key", rkeys, rtypes)):
            for k in keys:
                if k not in have:
                    raise SpecError(f"step '{step.name}': join.{what}: unknown column '{k}'; input has {', '.join(have)}")
        for lk, rk in zip(lkeys, rkeys, strict=True):
            if ltypes[lk] != rtypes[rk]:
                raise SpecError(
                    f"step '{step.name}': join.right_key: '{rk}' is {rtypes[rk].simpleString()} but left key '{lk}' is "
                    f"{ltypes[lk].simpleString()}; cast one side in a select first"
                )
        lschema, rschema = left.schema, right.schema
        cut = join_columns(left.columns, right.columns, j, ctx.wanted(step))
        if cut is not None:  # the state and the output hold only what is read after the join
            lschema, rschema = (StructType([f for f in schema if f.name in keep])
                                for schema, keep in zip((lschema, rschema), cut, strict=True))
            ltypes = {f.name: f.dataType for f in lschema}
            rtypes = {f.name: f.dataType for f in rschema}
        nulls_l = [(f"l__{n}", f"CAST(NULL AS {t.simpleString()})") for n, t in ltypes.items()]
        nulls_r = [(f"r__{n}", f"CAST(NULL AS {t.simpleString()})") for n, t in rtypes.items()]
        lpart = [(KG, ctx.key_group(lkeys)), ("_side", "CAST(0 AS TINYINT)"), *[(f"l__{n}", quoted(n)) for n in ltypes], *nulls_r]
        rpart = [(KG, ctx.key_group(rkeys)), ("_side", "CAST(1 AS TINYINT)"), *nulls_l, *[(f"r__{n}", quoted(n)) for n in rtypes]]
        kernel = build_kernel(step, arrow_schema(lschema), arrow_schema(rschema))
        # the lane input columns naming a row's key: the first key column of either side
        keyed = ctx.union_of(step, [(left, lpart), (right, rpart)])
        return ctx.to_lanes(step, keyed, kernel, (f"l__{lkeys[0]}", f"r__{rkeys[0]}"))

    def resident_problem(self, step: StepSpec) -> str | None:
        return None

    def lane_input(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> tuple[pa.Table, Kernel]:
        """Both sides in the lanes' one schema, as :meth:`compile` builds them in Spark."""
        import numpy as np
        import pyarrow as pa

        from eddyline.operators.join import LEFT_PREFIX, RIGHT_PREFIX, SIDE

        left, right = inputs
        j = step.params
        lkeys, rkeys = names(j.left_key), names(j.right_key)
        for what, keys, table in (("left_key", lkeys, left), ("right_key", rkeys, right)):
            for k in keys:
                if k not in table.column_names:
                    raise SpecError(f"step '{step.name}': join.{what}: unknown column '{k}'; input has "
                                    f"{', '.join(table.column_names)}")
        for lk, rk in zip(lkeys, rkeys, strict=True):
            if left.schema.field(lk).type != right.schema.field(rk).type:
                raise SpecError(f"step '{step.name}': join.right_key: '{rk}' is {right.schema.field(rk).type} but left "
                                f"key '{lk}' is {left.schema.field(lk).type}; cast one side in a select first")
        cut = join_columns(left.column_names, right.column_names, j, feed.wanted(step))
        if cut is not None:  # the state and the output hold only what is read after the join
            left, right = left.select(cut[0]), right.select(cut[1])
        kernel = build_kernel(step, *(pa.schema([f.with_nullable(True) for f in t.schema]) for t in (left, right)))

        def side(table: pa.Table, number: int, prefix: str, keys: tuple[str, ...]) -> pa.Table:
            n, columns = table.num_rows, []
            for f in kernel.input_schema:
                if f.name == KG:
                    columns.append(pa.array(feed.key_groups(step, table, keys), pa.int32()))
                elif f.name == SIDE:
                    columns.append(pa.array(np.full(n, number, np.int8)))
                elif f.name.startswith(prefix):
                    columns.append(table.column(f.name[len(prefix):]).cast(f.type))
                else:
                    columns.append(pa.nulls(n, f.type))
            return pa.Table.from_arrays(columns, schema=kernel.input_schema)

        return pa.concat_tables([side(left, 0, LEFT_PREFIX, lkeys), side(right, 1, RIGHT_PREFIX, rkeys)]), kernel


def join_columns(
    left: list[str], right: list[str], j: Join, wanted: frozenset[str] | None
) -> tuple[list[str], list[str]] | None:
    """The columns of each input a join needs when what follows it reads only ``wanted`` (lower
    case) of its output: its keys and times, weights (names that start with ``_``) and the
    columns behind the wanted output names. A left column that shares its name with a kept right
    one is kept, so that the right one keeps its output name (``<name>_right``). None: keep all
    (everything is read, nothing can be left out, or leaving it out would rename a column)."""
    if wanted is None:
        return None
    out_right = join_right_names(left, right)
    own_left = {*names(j.left_key), j.left_time, j.left_end}
    own_right = {*names(j.right_key), j.right_time}
    keep_right = [n for n, out in zip(right, out_right, strict=True)
                  if n in own_right or out.lower() in wanted or n.startswith("_")]
    keep_left = [n for n in left if n in own_left or n.lower() in wanted or n.startswith("_") or n in keep_right]
    if len(keep_left) == len(left) and len(keep_right) == len(right):
        return None
    if join_right_names(keep_left, keep_right) != [o for n, o in zip(right, out_right, strict=True) if n in keep_right]:
        return None
    return keep_left, keep_right
