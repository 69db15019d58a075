"""``window_aggregate``: tumbling and sliding event-time windows with count/sum/min/max/avg.

On Spark one epoch of a window aggregate is::

    assign windows (Expand) → key group = pmod(xxhash64(keys), K)
    → partial aggregate per (key group, keys, window start)      [JVM, combines before the shuffle]
    → routing value per key group → repartition(lanes)            [lane i = partition i]
    → mapInArrow(lane)                                            [Python: state + WindowKernel]

so however hot a key is, its lane receives one row per key and window in an epoch (a small
epoch skips the combining: its few rows cost the lanes less than a stage would). The lanes
drop the partials of windows that closed before the epoch and count their late rows, so the
plan holds no watermark and is built once; a step with a ``late`` target splits its late rows
off in the JVM instead (and is built every epoch), and a resident lane splits them off at the
same watermark before its partials (:meth:`WindowAggregateKind.lane_late`). Behind a shed
point, counts and sums are Horvitz-Thompson estimates with ``<name>_error`` columns.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from eddyline.api.steps import STEPS
from eddyline.api.units import (
    Columns,
    Duration,
    Files,
    Model,
    Name,
    Window,
    format_duration_ms,
    names,
)
from eddyline.columns import DIFF, KG, WEIGHT
from eddyline.errors import SpecError
from eddyline.kinds.base import (
    Aggregating,
    CompileContext,
    LaneFeed,
    StepKind,
    arrow_schema,
    check_aggregates,
)
from eddyline.operators.partials import SLOT, WEIGHT_SUM
from eddyline.operators.window import (
    LAST,
    START_MS,
    TMAX,
    WINDOW_END,
    WINDOW_START,
    WindowConfig,
    WindowKernel,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec

EVENT_MS = "_t"
#: a small epoch hands its (row, window) pairs to the lanes uncombined up to this many windows
#: per row (see _uncombined)
UNCOMBINED_WINDOWS_PER_ROW = 10
LATE = "_late"
VAR = "__var"


class WindowAggregate(Aggregating, Model):
    key: Columns | None = None
    time: str = Field(min_length=1)
    window: Window
    aggregates: dict[Name, str] = Field(min_length=1)
    watermark_delay: Duration = 0
    #: Windows stay open this long after they fire; a late row re-emits the window (revision + 1).
    allowed_lateness: Duration = 0
    #: Rows later than the allowed lateness are counted, and also written here when set.
    late: Files | None = None

    @model_validator(mode="after")
    def _check_aggregates(self) -> WindowAggregate:
        check_aggregates(self.aggregates)
        return self

    @property
    def keys(self) -> tuple[str, ...]:
        return names(self.key)

    def config(self, weighted: bool = False, advance: bool = False) -> WindowConfig:
        """``advance``: the watermark may advance within the epoch (fed by sources alone)."""
        return WindowConfig(
            weighted=weighted,
            advance_delay_ms=self.watermark_delay if advance else None,
            keys=self.keys,
            size_ms=self.window.size,
            slide_ms=self.window.slide_ms,
            cumulate_ms=self.window.step,
            aggregates=self.parsed_aggregates,
            allowed_lateness_ms=self.allowed_lateness,
        )


@STEPS.register
class WindowAggregateKind(StepKind):
    key = "window_aggregate"
    params = WindowAggregate
    stateful = True
    weighs_shed_rows = True
    observes_own_time = True
    live_params = ("watermark_delay", "allowed_lateness")

    def reads_plan(self, params: Any) -> bool:
        # Late rows written out whole are split off in the JVM, at the watermark in its SQL.
        # Otherwise the lanes drop the closed windows' partials, and the plan serves every epoch.
        return params.late is not None

    def plans_small_epochs(self, params: Any) -> bool:
        return True  # hands a small epoch's rows to the lanes uncombined

    def key_columns(self, params: Any) -> tuple[str, ...]:
        return params.keys

    def single_key_group(self, params: Any) -> bool:
        return not params.keys

    def late_target(self, params: Any) -> Files | None:
        return params.late

    def revisions(self, params: Any) -> str | None:
        return None  # count, sum and avg subtract a value taken back; min and max keep their values

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        return (*self.key_columns(step.params), "window_start", "window_end", *step.params.aggregates, "revision")

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        wa: WindowAggregate = step.params
        if wa.late is not None:  # late rows are written out whole
            return (None,)
        return (wa.read_columns(*wa.keys, wa.time),)

    def kernel(self, params: Any, *schemas: pa.Schema) -> WindowKernel:
        (schema,) = schemas
        return WindowKernel(params.config(), schema)

    def resident_problem(self, step: StepSpec) -> str | None:
        return None

    def lane_late(self, step: StepSpec, inputs: list[pa.Table], watermark_ms: int) -> tuple[list[pa.Table], pa.Table | None]:
        """With a late target, the rows whose last window has closed at the plan's watermark
        (end + lateness <= it) or that have no event time, whole, as :meth:`compile` splits them
        off in Spark; the lanes drop the closed windows of the others' partials, counting none
        of their rows (those rows' last window is open)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from eddyline.operators.rows import event_time_ms

        wa: WindowAggregate = step.params
        if wa.late is None:
            return inputs, None
        (rows,) = inputs
        _time_checked(step, wa, rows.schema)
        times = rows.column(wa.time)
        t = event_time_ms(times.fill_null(0)) if rows.num_rows else np.zeros(0, np.int64)
        slide = wa.window.slide_ms
        closed = (t - t % slide) + (wa.window.size + wa.allowed_lateness) <= watermark_ms
        late = pa.array(closed | pc.is_null(times).to_numpy(zero_copy_only=False), pa.bool_())
        return [rows.filter(pc.invert(late))], rows.filter(late)

    def lane_input(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> tuple[pa.Table, WindowKernel]:
        """The windows' partials, combined per key group, key and window (as :meth:`compile`
        has Spark combine them, in its column order); the lanes drop the windows too late for
        their watermark and count their rows, as they do behind Spark."""
        import pyarrow as pa

        from eddyline.eventtime import NO_WATERMARK
        from eddyline.operators.window import partial_aggregate

        wa: WindowAggregate = step.params
        (rows,) = inputs
        if DIFF in rows.column_names:
            raise SpecError(f"step '{step.name}': revisions into a window aggregate are weighted in Spark")
        for col in (*wa.keys, wa.time, *(c for _, _, c in wa.parsed_aggregates if c is not None)):
            if col not in rows.column_names:
                raise SpecError(f"step '{step.name}': unknown column '{col}'; input has {', '.join(rows.column_names)}")
        _time_checked(step, wa, rows.schema)
        if WEIGHT in rows.column_names:  # behind a shed point
            wa, rows = _weighted_rows(wa, rows)
        ancestors, _ = feed.spec.stateful_upstream(step)
        cfg = wa.config(False, advance=not ancestors)
        rows = rows.cast(pa.schema([f.with_nullable(True) for f in rows.schema]))
        partials, _ = partial_aggregate(cfg, rows, wa.time, NO_WATERMARK, feed.key_groups(step, rows, cfg.keys))
        order = [KG, *cfg.keys, START_MS, LAST, *(p for p, _, _, _ in cfg.partial_columns()),
                 *([TMAX] if cfg.advance_delay_ms is not None else [])]
        schema = pa.schema([partials.schema.field(c).with_nullable(True) for c in order])
        return partials.select(order).cast(schema), WindowKernel(cfg, schema)

    def lane_output(self, feed: Any, step: StepSpec, rows: pa.Table) -> tuple[pa.Table, dict[str, dict[str, Any]]]:
        """Behind a shed point, the variance sums become confidence half-widths and their ratio to
        the estimates is observed, as :meth:`compile` has Spark do (each lane's sums, maxima and
        counts: the lanes' merged give the mean)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        overload = feed.spec.control.overload
        if overload is None or not any(c.endswith(VAR) for c in rows.column_names):
            return rows, {}
        z = NormalDist().inv_cdf(0.5 + overload.confidence / 2)
        columns, names, seen = [], [], {"rows": rows.num_rows}
        for c in rows.column_names:
            if not c.endswith(VAR):
                columns.append(rows.column(c))
                names.append(c)
                continue
            name = c[: -len(VAR)]
            var = rows.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
            with np.errstate(invalid="ignore"):
                error = pa.array(z * np.sqrt(var), pa.float64(), mask=pc.is_null(rows.column(c)).to_numpy(zero_copy_only=False))
            columns.append(error)
            names.append(f"{name}_error")
            estimate = pc.cast(rows.column(name), pa.float64())
            ratio = pc.divide(error, pc.if_else(pc.equal(estimate, 0.0), None, pc.abs(estimate))).drop_null()
            seen[f"sum:{name}"] = float(pc.sum(ratio).as_py() or 0.0)
            seen[f"count:{name}"] = len(ratio)
            seen[f"max:{name}"] = pc.max(ratio).as_py() if len(ratio) else None
        return pa.Table.from_arrays(columns, names=names), {f"estimates:{step.name}": seen}

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        wa = step.params
        w = wa.window
        kind = (f"sliding {format_duration_ms(w.size)} every {format_duration_ms(w.slide_ms)}" if w.slide
                else f"cumulative up to {format_duration_ms(w.size)}, ending every {format_duration_ms(w.step)}" if w.step
                else f"tumbling {format_duration_ms(w.size)}")
        keys = ", ".join(wa.keys) or "(global: one key group)"
        aggs = ", ".join(f"{n}={t}" for n, t in wa.aggregates.items())
        return [
            f"window_aggregate  key {keys}; {kind} on {wa.time}; {aggs}",
            f"  1. JVM: assign windows (up to {w.size // (w.step or w.slide_ms)} per row)"
            + (f", drop windows past end + lateness ({format_duration_ms(wa.allowed_lateness)}), split off late rows"
               if wa.late is not None else ""),
            f"  2. JVM: _kg = pmod(xxhash64({keys if wa.keys else ''}), {key_groups}); partial aggregates per (_kg, keys, window_start)",
            "  3. shuffle: repartition(lanes, routing value of _kg)   [lane i = partition i]",
            "  4. Python per lane (mapInArrow): load key-group state, "
            + ("" if wa.late is not None else
               f"drop windows past end + lateness ({format_duration_ms(wa.allowed_lateness)}) and count late rows, ")
            + f"merge partials, fire windows with end <= watermark (delay {format_duration_ms(wa.watermark_delay)}), "
            "write state versions",
        ]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql.types import TimestampNTZType, TimestampType

        wa: WindowAggregate = step.params
        (df,) = inputs
        _check_columns(step.name, wa, df)
        estimate = WEIGHT in df.columns
        if estimate:
            wa, df = _weighted(wa, df)
        weighted = DIFF in df.columns
        # fed by sources alone: its lanes may fire as soon as their own rows pass the watermark
        # (a step fed by stateful steps follows their watermarks of the epoch before)
        ancestors, _ = ctx.spec.stateful_upstream(step)
        cfg = wa.config(weighted, advance=not ancestors)
        time_type = df.schema[wa.time].dataType
        if not isinstance(time_type, TimestampType | TimestampNTZType):
            raise SpecError(
                f"step '{step.name}': time: expected a timestamp column, "
                f"'{wa.time}' is {time_type.simpleString()}"
            )
        size, slide, lateness = cfg.size_ms, cfg.slide_ms, cfg.allowed_lateness_ms
        # Few, string-built expressions: every Column built in Python is a py4j round trip, and
        # planning cost is paid whenever the frame is built.
        t_ms = f"CAST(floor(unix_micros(CAST(`{wa.time}` AS TIMESTAMP)) / 1000) AS BIGINT)"
        last_start = f"({EVENT_MS} - pmod({EVENT_MS}, {slide}))"
        df = df.selectExpr("*", f"{t_ms} AS {EVENT_MS}")
        observed = ["count(1) AS rows", f"max({EVENT_MS}) AS max_t"]
        closed = ""  # which windows the JVM drops: none unless late rows are split off here
        if wa.late is not None:  # (rows without an event time count as late)
            wm = ctx.run(step).watermark_ms
            df = df.selectExpr("*", f"coalesce({last_start} + {size + lateness} <= {wm}, true) AS {LATE}")
            df = ctx.observe(df, f"step:{step.name}:0", *observed, f"count_if({LATE}) AS late")
            ctx.late_rows(step, df.filter(F.col(LATE)).drop(EVENT_MS, LATE))
            live = df.where(f"NOT {LATE}")
            closed = f"{START_MS} + {size + lateness} > {wm}"
        else:
            live = ctx.observe(df, f"step:{step.name}:0", *observed)
        k = cfg.windows_per_row
        kg = ctx.key_group(cfg.keys)
        # explode_outer: a row without an event time keeps a partial (window start null) in
        # which the lanes count it as late
        if cfg.cumulate_ms is not None:  # virtual starts (end - size) of the windows ending after t
            every = cfg.cumulate_ms
            first = f"({EVENT_MS} - pmod({EVENT_MS}, {every}) + {every - size})"
            live = live.selectExpr("*", f"explode_outer(sequence({first}, {last_start}, {every})) AS {START_MS}")
        elif k == 1:
            live = live.selectExpr("*", f"{last_start} AS {START_MS}")
        else:
            live = live.selectExpr(
                "*", f"explode_outer(sequence({last_start} - {(k - 1) * slide}, {last_start}, {slide})) AS {START_MS}")
        live = live.selectExpr("*", f"{kg} AS {KG}")
        if closed and k > 1:
            live = live.where(closed)
        aggs: list[str] = [f"count_if(coalesce({START_MS} = {last_start}, true)) AS {LAST}"]
        extrema = {name: col for name, _, col in cfg.extrema}  # min/max of a revised input
        for pcol, func, col, _ in cfg.partial_columns():
            if pcol in extrema:  # worked out in the lanes from the window's value rows
                aggs.append(f"CAST(NULL AS {live.schema[col].dataType.simpleString()}) AS `{pcol}`")
            elif func == "count" and weighted:  # a revision's weight counts (negative: taken back)
                aggs.append(f"sum({DIFF if col is None else f'CASE WHEN `{col}` IS NULL THEN 0 ELSE {DIFF} END'}) AS `{pcol}`")
            elif func == "count":
                aggs.append(f"count({'1' if col is None else f'`{col}`'}) AS `{pcol}`")
            elif func == "sum":
                ctype = live.schema[col].dataType.simpleString()
                c = f"CAST(`{col}` AS DOUBLE)" if ctype.startswith("decimal") or ctype in ("float", "double") else f"`{col}`"
                aggs.append(f"sum({c}{f' * {DIFF}' if weighted else ''}) AS `{pcol}`")
            else:
                aggs.append(f"{func}(`{col}`) AS `{pcol}`")
        if extrema:
            aggs += [f"CAST(0 AS TINYINT) AS {SLOT}",
                     *[f"CAST(NULL AS {live.schema[c].dataType.simpleString()}) AS `{n}__v`" for n, c in extrema.items()],
                     f"CAST(NULL AS BIGINT) AS {WEIGHT_SUM}"]
        if cfg.advance_delay_ms is not None:
            aggs.append(f"max({EVENT_MS}) AS {TMAX}")
        partial = live.groupBy(KG, *cfg.keys, START_MS).agg(*[F.expr(a) for a in aggs])
        if extrema:
            partial = _with_value_rows(partial, live, cfg)
        elif ctx.small and not weighted and k <= UNCOMBINED_WINDOWS_PER_ROW:
            partial = _uncombined(partial, live, cfg, last_start)
        result = ctx.to_lanes(step, partial, WindowKernel(cfg, arrow_schema(partial.schema)), cfg.keys[:1])
        if estimate:  # the variance sums become confidence half-widths
            overload = ctx.spec.control.overload
            assert overload is not None
            z = NormalDist().inv_cdf(0.5 + overload.confidence / 2)
            estimated = [c[: -len(VAR)] for c in result.columns if c.endswith(VAR)]
            result = result.selectExpr(*[
                f"CAST({z!r} * sqrt(`{c}`) AS DOUBLE) AS `{c[: -len(VAR)]}_error`" if c.endswith(VAR) else f"`{c}`"
                for c in result.columns
            ])
            # how wide the intervals are against the estimates, per aggregate, for the progress
            # (overload.estimates); a window whose estimate is 0 is left out of the ratio
            ratios = {n: f"`{n}_error` / nullif(abs(`{n}`), 0)" for n in estimated}
            result = ctx.observe(result, f"estimates:{step.name}", "count(1) AS rows", *[
                a for n, r in ratios.items() for a in (f"avg({r}) AS `mean:{n}`", f"max({r}) AS `max:{n}`")])
        return result


def _uncombined(partial: DataFrame, live: DataFrame, cfg: WindowConfig, last_start: str) -> DataFrame:
    """In a small epoch, each (row, window) pair as a partial of its own, typed as ``partial``
    (the combined partials): the lanes merge partials anyway, and the stage that would combine
    them first costs more than the lanes' work on a few thousand rows. Not when a sum is of
    floats (their order of addition would differ from a combined epoch's), else ``partial``."""
    from pyspark.sql.types import FractionalType

    types = {f.name: f.dataType for f in partial.schema}
    per_row = {LAST: f"CASE WHEN coalesce({START_MS} = {last_start}, true) THEN 1 ELSE 0 END", TMAX: EVENT_MS}
    for pcol, func, col, _ in cfg.partial_columns():
        if func == "sum" and isinstance(types[pcol], FractionalType):
            return partial
        per_row[pcol] = (("1" if col is None else f"CASE WHEN `{col}` IS NULL THEN 0 ELSE 1 END") if func == "count"
                         else f"`{col}`")
    return live.selectExpr(*[
        f"`{c}`" if c not in per_row else f"CAST({per_row[c]} AS {t.simpleString()}) AS `{c}`" for c, t in types.items()])


def _with_value_rows(partial: DataFrame, live: DataFrame, cfg: WindowConfig) -> DataFrame:
    """The windows' partial rows and, per min/max of a revised input, one row per window and
    distinct value with its summed weight (slot j + 1 for the j-th min/max; see WindowKernel)."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType.simpleString() for f in partial.schema}
    window_key = [KG, *cfg.keys, START_MS]
    for j, (name, _, col) in enumerate(cfg.extrema):
        values = (live.where(f"`{col}` IS NOT NULL")
                  .selectExpr(*[f"`{c}`" for c in window_key], f"`{col}` AS _v", DIFF)
                  .groupBy(*window_key, "_v").agg(F.expr(f"sum({DIFF}) AS {WEIGHT_SUM}")))
        given = {c: f"`{c}`" for c in window_key} | {SLOT: str(j + 1), f"{name}__v": "_v", WEIGHT_SUM: WEIGHT_SUM}
        partial = partial.union(values.selectExpr(
            *[f"CAST({given.get(c, 'NULL')} AS {types[c]}) AS `{c}`" for c in partial.columns]))
    return partial


def _weighted(wa: WindowAggregate, df: DataFrame) -> tuple[WindowAggregate, DataFrame]:
    """Horvitz-Thompson estimates behind a shed point: every kept row stands for ``_w`` = 1 /
    keep rows, so counts become sums of ``_w`` and sums of ``x`` sums of ``x * _w``; the variance
    of each estimate is the sum of ``x² (_w² - _w)`` over kept rows (zero when nothing was shed).
    Minimum, maximum and average are left as they are (an average is a ratio of the two)."""
    extra: list[str] = []
    aggregates: dict[str, str] = {}
    for name, func, col in wa.parsed_aggregates:
        if func == "count":
            w = WEIGHT if col is None else f"CASE WHEN `{col}` IS NULL THEN NULL ELSE {WEIGHT} END"
            extra += [f"CAST({w} AS DOUBLE) AS `__hw_{name}`", f"CAST(({w}) * ({w}) - ({w}) AS DOUBLE) AS `__hv_{name}`"]
        elif func == "sum":
            extra += [f"CAST(`{col}` AS DOUBLE) * {WEIGHT} AS `__hw_{name}`",
                      f"CAST(`{col}` AS DOUBLE) * CAST(`{col}` AS DOUBLE) * ({WEIGHT} * {WEIGHT} - {WEIGHT}) AS `__hv_{name}`"]
        else:
            aggregates[name] = wa.aggregates[name]
            continue
        aggregates[name] = f"sum(__hw_{name})"
        aggregates[f"{name}{VAR}"] = f"sum(__hv_{name})"
    return wa.model_copy(update={"aggregates": aggregates}), df.selectExpr("*", *extra)


def _time_checked(step: StepSpec, wa: WindowAggregate, schema: pa.Schema) -> None:
    """The window's time column is in ``schema`` (an input's rows in a resident lane) and a
    timestamp (SpecError)."""
    import pyarrow as pa

    if wa.time not in schema.names:
        raise SpecError(f"step '{step.name}': time: unknown column '{wa.time}'; input has {', '.join(schema.names)}")
    if not pa.types.is_timestamp(schema.field(wa.time).type):
        raise SpecError(f"step '{step.name}': time: expected a timestamp column, '{wa.time}' is "
                        f"{schema.field(wa.time).type}")


def _weighted_rows(wa: WindowAggregate, rows: pa.Table) -> tuple[WindowAggregate, pa.Table]:
    """:func:`_weighted` on Arrow, for resident lanes: the same columns, computed with the same
    double arithmetic in the same order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def doubles(col: str) -> tuple[np.ndarray, np.ndarray]:
        c = pc.cast(rows.column(col), pa.float64())
        return c.to_numpy(zero_copy_only=False).astype(np.float64), pc.is_null(c).to_numpy(zero_copy_only=False)

    w = rows.column(WEIGHT).to_numpy(zero_copy_only=False).astype(np.float64)
    aggregates: dict[str, str] = {}
    for name, func, col in wa.parsed_aggregates:
        if func == "count":
            null = np.zeros(rows.num_rows, bool) if col is None else doubles(col)[1]
            hw, hv = w, w * w - w
        elif func == "sum":
            x, null = doubles(col)
            hw, hv = x * w, x * x * (w * w - w)
        else:
            aggregates[name] = wa.aggregates[name]
            continue
        rows = rows.append_column(f"__hw_{name}", pa.array(hw, pa.float64(), mask=null))
        rows = rows.append_column(f"__hv_{name}", pa.array(hv, pa.float64(), mask=null))
        aggregates[name] = f"sum(__hw_{name})"
        aggregates[f"{name}{VAR}"] = f"sum(__hv_{name})"
    return wa.model_copy(update={"aggregates": aggregates}), rows


def _check_columns(step: str, wa: WindowAggregate, df: DataFrame) -> None:
    from pyspark.sql.types import NumericType

    have = {f.name: f.dataType for f in df.schema}
    taken = [k for k in wa.keys if k in (WINDOW_START, WINDOW_END, "revision")]
    if taken:
        raise SpecError(
            f"step '{step}': key: '{taken[0]}' is a name the window's output uses; rename it in a select first"
        )
    if wa.time not in have:
        raise SpecError(f"step '{step}': time: unknown column '{wa.time}'; input has {', '.join(have)}")
    for k in wa.keys:
        if k not in have:
            raise SpecError(f"step '{step}': key: unknown column '{k}'; input has {', '.join(have)}")
    for name, func, col in wa.parsed_aggregates:
        if col is None:
            continue
        if col not in have:
            raise SpecError(
                f"step '{step}': aggregates.{name}: unknown column '{col}'; input has {', '.join(have)}"
            )
        if func in ("sum", "avg") and not isinstance(have[col], NumericType):
            raise SpecError(
                f"step '{step}': aggregates.{name}: {func}() expects a numeric column, "
                f"'{col}' is {have[col].simpleString()}"
            )
