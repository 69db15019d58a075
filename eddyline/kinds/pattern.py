"""``pattern``: complex event patterns per key (sequences with Kleene plus, strict or
skip-till-next contiguity), the pattern itself returned by a ``factory``.

AnduIN's pipeline split ``P+ = P ∨ (P P+)`` runs one pattern as two steps: stage 1 emits the
partial matches that just bound the split element, stage 2 (``seeds``: the stage-1 step) reads the
events and those seeds in one keyed frame and extends them; together they give exactly the
single-step matches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Duration, Model, Name, names
from eddyline.columns import KG
from eddyline.kinds.base import CompileContext, KeyedStepKind, LaneFeed, resolve

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel


class PatternSplit(Model):
    stage: Literal[1, 2]
    at: str = Field(min_length=1)  # the name of a Kleene-plus element


class PatternSpec(Model):
    """Complex event pattern per key; ``factory`` is ``"module:function"`` returning the pattern
    (e.g. ``eddyline.operators.pattern:tick_pattern``), called with ``args``."""

    key: Columns
    time: str
    within: Duration = Field(gt=0)
    factory: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    args: dict[str, Any] = Field(default_factory=dict)
    measures: dict[Name, tuple[str, str | None, str]] = Field(default_factory=dict)
    watermark_delay: Duration = 0
    #: AnduIN's pipeline split P+ = P v (P P+) at the Kleene-plus element ``split.at``: stage 1
    #: emits the partial matches that just bound it; stage 2 (``seeds``: the stage-1 step) extends
    #: them. Both stages read the same events and give exactly the single-step matches.
    split: PatternSplit | None = None
    seeds: Name | None = None

    @model_validator(mode="after")
    def _split_fields(self) -> PatternSpec:
        if self.split is not None and (self.split.stage == 2) != (self.seeds is not None):
            raise ValueError("seeds: a stage-2 pattern names its stage-1 step in 'seeds'; only stage 2 does")
        if self.split is None and self.seeds is not None:
            raise ValueError("seeds: only a stage-2 pattern (split.stage: 2) reads seeds")
        return self


@STEPS.register
class PatternKind(KeyedStepKind):
    key = "pattern"
    live_params = ("watermark_delay",)
    params = PatternSpec

    def inputs(self, step: StepSpec) -> tuple[str, ...]:
        assert step.input is not None
        return (step.input,) if step.params.seeds is None else (step.input, step.params.seeds)

    def input_fields(self, step: StepSpec) -> list[tuple[str, str]]:
        assert step.input is not None
        seeds = step.params.seeds
        return [("input", step.input), *([("pattern.seeds", seeds)] if seeds is not None else [])]

    def time_columns(self, step: StepSpec) -> tuple[str | None, ...]:
        p = step.params
        return (p.time,) if p.seeds is None else (p.time, None)  # seeds follow the stage-1 step's watermark

    def watermark_follows(self, step: StepSpec) -> str | None:
        # stage 2 continues stage 1's seeds right after their last row, so it must advance in
        # lockstep with stage 1, in the same epoch
        return step.params.seeds

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        from eddyline.operators.pattern import PatternKernel, Split

        (schema,) = schemas
        p = params
        try:
            factory = resolve(p.factory)
        except ValueError as e:
            raise ValueError(f"factory: cannot load {p.factory!r}: {e}") from e
        pattern = factory(**p.args)
        split = None
        if p.split is not None:
            elements = [e.name for e in pattern.elements]
            if p.split.at not in elements:
                raise ValueError(f"split.at: unknown element {p.split.at!r}; the pattern has {', '.join(elements)}")
            split = Split(p.split.stage, elements.index(p.split.at))
        return PatternKernel(schema, names(p.key), p.time, pattern, p.within, dict(p.measures), split=split)

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        if step.params.seeds is None:
            return super().compile(ctx, step, inputs)
        events, seeds = ctx.observe_event_times(step, inputs)
        keyed, kernel = self._stage2(ctx, step, events, seeds)
        return ctx.to_lanes(step, keyed, kernel, self.key_columns(step.params)[:1])

    def resident_problem(self, step: StepSpec) -> str | None:
        return None  # (stage 2's frame as lane_input makes it)

    def lane_input(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> tuple[pa.Table, Kernel]:
        """A single step's or stage 1's rows as a plain keyed step's; stage 2's as :meth:`_stage2`
        makes them: the events keyed, then the seeds (their key groups as stage 1 gave them)."""
        from eddyline.operators.pattern import stage2_batch

        if step.params.seeds is None:
            return super().lane_input(feed, step, inputs)
        events, seeds = inputs
        keyed, kernel = super().lane_input(feed, step, [events])
        return stage2_batch(kernel, keyed, seeds), kernel

    def _stage2(self, ctx: CompileContext, step: StepSpec, events: DataFrame, seeds: DataFrame) -> tuple[DataFrame, Kernel]:
        """Stage 2 reads the events (``_seed`` null) and stage 1's seeds (event columns null, the
        seed packed into ``_seed``) in one frame, keyed alike."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        from eddyline.operators.pattern import SEED

        keys = names(step.params.key)
        keyed, kernel = self.keyed(ctx, step, events)
        seed_fields = [f for f in seeds.schema if f.name not in (KG, *keys)]
        event_part = keyed.withColumn(SEED, F.lit(None).cast(StructType(seed_fields)))
        seed_part = seeds.select(
            *[
                F.col(KG) if f.name == KG else F.col(f"`{f.name}`") if f.name in keys else F.lit(None).cast(f.dataType).alias(f.name)
                for f in keyed.schema
            ],
            F.struct(*[F.col(f"`{f.name}`") for f in seed_fields]).alias(SEED),
        )
        return event_part.unionByName(seed_part), kernel
