"""Turn the network + one epoch plan into Spark DataFrames.

Stateless steps become Spark SQL expressions (they run in the JVM). A window aggregate becomes:

    assign windows (Expand) → drop pairs past end + lateness → key group = pmod(xxhash64(keys), K)
    → partial aggregate per (key group, keys, window start)      [JVM, combines before the shuffle]
    → routing value per key group → repartition(lanes)            [lane i = partition i]
    → mapInArrow(run_lane)                                        [Python: state + kernel]

The watermark, the routing table and the state index come from the logged plan, never from the
clock, so the DataFrames of a replayed epoch equal the original ones.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from eddyline.api.spec import NetworkSpec, StepSpec, WindowAggregate
from eddyline.columns import KG, PROBE
from eddyline.errors import SpecError
from eddyline.io.sources import Source
from eddyline.operators.base import Kernel
from eddyline.operators.window import START_MS, WINDOW_END, WINDOW_START, WindowConfig, WindowKernel
from eddyline.plan.keygroups import RoutingTable, route_values
from eddyline.runtime.lanes import LaneTask, run_lane

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

EVENT_MS = "_t"
LATE = "_late"


@dataclass
class StepRun:
    """What one epoch needs to know about a stateful step."""

    watermark_ms: int
    routing: RoutingTable
    index: dict[int, list]
    #: per-lane state memory budget (None: unbounded)
    state_budget: int | None = None
    #: in-memory bytes of a state row as measured last epoch
    bytes_per_row: float = 0.0


@dataclass(frozen=True)
class Known:
    """What an observation would find, known before the epoch runs (see ``Frames.facts``)."""

    values: dict[str, Any]

    @property
    def get(self) -> dict[str, Any]:
        return self.values


@dataclass(frozen=True)
class SharedObservation:
    """One field of another observation, read under the name its reader expects: a step that
    reads a source as it is shares the source's observation instead of adding its own."""

    of: Observation | Known
    field: str
    name: str = "max_t"

    @property
    def get(self) -> dict[str, Any]:
        return {self.name: self.of.get.get(self.field)}


def max_event_ms(col: str) -> str:
    """SQL aggregate: the newest value of ``col`` in epoch milliseconds.

    An observation is evaluated row by row outside Spark's generated code: the rows pay only
    for max(); the conversion to milliseconds (monotonic, so it commutes with max) runs once.
    Converting every row cost about 20 ms of JVM CPU per 400,000-row epoch."""
    return f"CAST(floor(unix_micros(max(CAST(`{col}` AS TIMESTAMP))) / 1000) AS BIGINT)"


@dataclass
class EpochFrames:
    nodes: dict[str, DataFrame] = field(default_factory=dict)
    #: per (step, input): the rows shed there (only when a shed sink is configured)
    shed: dict[str, DataFrame] = field(default_factory=dict)
    #: per source: rows; per stateful step: rows in, max event time, late rows
    observations: dict[str, Observation | Known | SharedObservation] = field(default_factory=dict)
    dead_letters: dict[str, DataFrame] = field(default_factory=dict)
    late: dict[str, DataFrame] = field(default_factory=dict)


def window_config(wa: WindowAggregate) -> WindowConfig:
    return WindowConfig(
        keys=wa.keys,
        size_ms=wa.window.size,
        slide_ms=wa.window.slide_ms,
        aggregates=wa.parsed_aggregates,
        allowed_lateness_ms=wa.allowed_lateness,
    )


def topological(spec: NetworkSpec) -> list[StepSpec]:
    """Steps in an order where every input comes first (the spec is validated acyclic)."""
    done = {s.name for s in spec.sources}
    order: list[StepSpec] = []
    pending = list(spec.steps)
    while pending:
        ready = [s for s in pending if all(i in done for i in s.inputs)]
        if not ready:
            names = ", ".join(f"'{s.name}'" for s in pending)
            raise SpecError(f"steps {names}: inputs form a cycle or name nothing")
        for s in ready:
            order.append(s)
            done.add(s.name)
            pending.remove(s)
    return order


class EpochCompiler:
    """Builds one epoch's DataFrames. Holds nothing between epochs but the SparkSession."""

    def __init__(self, spark: SparkSession, spec: NetworkSpec, sources: dict[str, Source], checkpoint: str):
        from eddyline.io.tables import LookupTables

        self.spark = spark
        self.spec = spec
        self.sources = sources
        self.checkpoint = checkpoint
        self.tables = LookupTables(spec, checkpoint)
        self._table_versions: dict[str, dict[str, Any]] = {}
        self._heartbeats: dict[tuple[Any, ...], DataFrame] = {}
        # Event-time columns that stateful steps read straight from a source: the source's
        # observation also takes their newest value. Each observation is a node that every row
        # passes through outside Spark's generated code; one instead of two saved about 45 ms
        # of JVM CPU per 400,000-row epoch of the dedup benchmark (bench/RESULTS.md).
        self._direct_times: dict[str, list[str]] = {}
        for step in spec.steps:
            if step.stateful and step.window_aggregate is None:
                for name, col in zip(step.inputs, step.time_columns(), strict=True):
                    if col is not None and name in sources:
                        times = self._direct_times.setdefault(name, [])
                        if col not in times:
                            times.append(col)
        #: per source, this epoch: its frame, its observation and, per time column observed
        #: there, the observation's field holding its newest value
        self._shared: dict[str, tuple[DataFrame, Observation | Known, dict[str, str]]] = {}

    def build(
        self,
        epoch: int,
        source_slices: dict[str, dict[str, Any]],
        steps: dict[str, StepRun],
        lanes: int,
        *,
        observe: bool = True,
        kill_driver_pid: int | None = None,
        tables: dict[str, dict[str, Any]] | None = None,
        shed: dict[str, dict[str, Any]] | None = None,
    ) -> EpochFrames:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        self._table_versions = tables or {}
        out = EpochFrames()
        self._shared = {}
        for src in self.spec.sources:
            count_bad = None
            if observe:

                def count_bad(df: DataFrame, name: str = src.name) -> DataFrame:
                    bad_obs = Observation(f"e{epoch}-bad-{name}")
                    out.observations[f"bad:{name}"] = bad_obs  # only sources that parse records
                    return df.observe(bad_obs, F.expr("count_if(_bad)").alias("bad"))

            frames = self.sources[src.name].frames(self.spark, source_slices[src.name], lanes, count_bad)
            df = frames.data
            times = self._direct_times.get(src.name, [])
            known = frames.facts(times) if observe else None
            if known is not None:
                # a Parquet slice's footers have its rows and newest times: nothing to observe
                facts = Known(known)
                out.observations[f"source:{src.name}"] = facts
                self._shared[src.name] = (df, facts, {c: f"max_t:{c}" for c in times})
            elif observe:
                obs = Observation(f"e{epoch}-src-{src.name}")
                have = df.columns if times else []
                newest = {c: f"max_t:{c}" for c in times if c in have}
                rows = F.count(F.lit(1)).alias("rows")
                try:
                    df = df.observe(obs, rows, *[F.expr(max_event_ms(c)).alias(a) for c, a in newest.items()])
                except Exception:  # a column that is no time: the step's own observation says so
                    newest = {}
                    obs = Observation(f"e{epoch}-src-rows-{src.name}")  # an observation is used once
                    df = df.observe(obs, rows)
                out.observations[f"source:{src.name}"] = obs
                self._shared[src.name] = (df, obs, newest)
            out.nodes[src.name] = df
            if frames.dead_letters is not None:
                out.dead_letters[src.name] = frames.dead_letters
        overload = self.spec.control.overload
        for step in topological(self.spec):
            ins = [out.nodes[i] for i in step.inputs]
            if overload is not None and step.stateful:
                ins = self._shed_inputs(epoch, step, ins, (shed or {}).get(step.name), out, observe)
            try:
                out.nodes[step.name] = self._step(epoch, step, ins, steps.get(step.name), out, observe, kill_driver_pid)
            except SpecError:
                raise
            except Exception as e:  # analysis errors name the step
                raise SpecError(f"step '{step.name}': {step.kind}: {_first_line(e)}") from e
        return out

    def _step(
        self,
        epoch: int,
        step: StepSpec,
        ins: list[DataFrame],
        run: StepRun | None,
        out: EpochFrames,
        observe: bool,
        kill_driver_pid: int | None,
    ) -> DataFrame:
        from pyspark.sql import functions as F

        if step.filter is not None:
            return ins[0].filter(F.expr(step.filter))
        if step.select is not None:
            return ins[0].selectExpr(*step.select)
        if step.udf is not None:
            return self._udf(step, ins[0])
        if step.lookup is not None:
            return self._lookup(step, ins[0])
        if step.union is not None:
            first = ins[0]
            for other in ins[1:]:
                if [f.name for f in other.schema] != [f.name for f in first.schema]:
                    raise SpecError(
                        f"step '{step.name}': union: inputs must have the same columns; "
                        f"'{step.union[0]}' has {first.columns}, another has {other.columns}"
                    )
                first = first.unionByName(other)
            return first
        assert run is not None, f"no plan for stateful step {step.name}"
        if step.window_aggregate is not None:
            return self._window(epoch, step, step.window_aggregate, ins[0], run, out, observe, kill_driver_pid)
        if observe:
            ins = self._observe_event_time(epoch, step, ins, out)
        if step.join is not None:
            keyed, kernel = self._join(step, ins[0], ins[1], run)
        elif step.pattern is not None and step.pattern.seeds is not None:
            keyed, kernel = self._pattern_stage2(step, ins[0], ins[1], run)
        else:
            keyed, kernel = self._keyed(step, ins[0], run)
        return self._lanes(epoch, step.name, keyed, kernel, run, kill_driver_pid, _key_columns(step))

    def _shed_inputs(
        self,
        epoch: int,
        step: StepSpec,
        ins: list[DataFrame],
        plan: dict[str, Any] | None,
        out: EpochFrames,
        observe: bool,
    ) -> list[DataFrame]:
        """Drop rows before a stateful step as the epoch plan says (a replay drops the same).

        Random shedding keeps a row when a hash of (epoch seed, row content) falls below the keep
        fraction; semantic shedding keeps rows whose utility reaches last epoch's quantile for it.
        Offered and kept rows are observed per input; a window step gets a weight ``_w`` (1 /
        keep) for its scaled estimates."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from eddyline.operators.shed import random_keep_sql

        cfg = self.spec.control.overload
        assert cfg is not None
        utility = cfg.utility.get(step.name)
        shed_out = []
        for i, df in enumerate(ins):
            keep = float(plan["keep"][i]) if plan else 1.0
            cond = "true"
            if keep < 1.0 and plan is not None:
                cut = (plan.get("thresholds") or [None] * len(ins))[i]
                if plan["mode"] == "semantic" and utility is not None and cut is not None:
                    cond = f"coalesce(({utility}) >= {cut!r}, false)"
                else:
                    content = ", ".join(f"`{c}`" for c in df.columns)
                    cond = random_keep_sql(f"xxhash64({content})", keep, int(plan["seed"]) + i)
            df = df.selectExpr("*", f"{cond} AS _keep")
            if observe:
                obs = Observation(f"e{epoch}-shed-{step.name}-{i}")
                aggs = [F.expr("count(1)").alias("offered"), F.expr("count_if(_keep)").alias("kept")]
                if utility is not None:
                    aggs.append(F.expr(f"percentile_approx(CAST(({utility}) AS DOUBLE), array({', '.join(str(q / 20) for q in range(21))}), 1000)").alias("q"))
                df = df.observe(obs, *aggs)
                out.observations[f"shed:{step.name}:{i}"] = obs
            if cfg.shed_sink is not None and keep < 1.0:
                out.shed[f"{step.name}:{i}"] = df.where("NOT _keep").drop("_keep").selectExpr(
                    f"'{step.name}' AS _step", f"{i} AS _input", f"{epoch}L AS _epoch", "*"
                )
            df = df.where("_keep").drop("_keep")
            if step.window_aggregate is not None and cfg.estimate:
                weight = 1.0 / keep if (plan is not None and plan["mode"] == "random") else 1.0
                df = df.selectExpr("*", f"CAST({weight!r} AS DOUBLE) AS {WEIGHT}")
            shed_out.append(df)
        return shed_out

    def _observe_event_time(self, epoch: int, step: StepSpec, ins: list[DataFrame], out: EpochFrames) -> list[DataFrame]:
        """Observe the newest event time reaching the step (its watermark follows it)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        observed = []
        for i, (df, col) in enumerate(zip(ins, step.time_columns(), strict=True)):
            if col is None:
                observed.append(df)
                continue
            shared = self._shared.get(step.inputs[i])
            if shared is not None and shared[0] is df and col in shared[2]:
                # the source's rows, as they are (not shed): its observation has the newest time
                out.observations[f"step:{step.name}:{i}"] = SharedObservation(shared[1], shared[2][col])
                observed.append(df)
                continue
            if col not in df.columns:
                raise SpecError(f"step '{step.name}': time: unknown column '{col}'; input has {', '.join(df.columns)}")
            obs = Observation(f"e{epoch}-step-{step.name}-{i}")
            observed.append(df.observe(obs, F.expr(max_event_ms(col)).alias("max_t")))
            out.observations[f"step:{step.name}:{i}"] = obs
        return observed

    def _keyed(self, step: StepSpec, df: DataFrame, run: StepRun) -> tuple[DataFrame, Kernel]:
        """Single-input stateful steps: rows keep their columns and gain their key group."""
        from eddyline.operators import kernels

        keys = step.key_columns
        unknown = [k for k in keys if k not in df.columns]
        if unknown:
            what = "partition_by" if step.top_k is not None else "key"
            raise SpecError(f"step '{step.name}': {what}: unknown column '{unknown[0]}'; input has {', '.join(df.columns)}")
        keyed = df.selectExpr("*", f"{self._key_group(keys, run.routing.key_groups)} AS {KG}")
        try:
            kernel = kernels.build(step, _arrow_schema(df.schema))
        except (ValueError, KeyError) as e:
            raise SpecError(f"step '{step.name}': {step.kind}: {e}") from None
        return keyed, kernel

    def _pattern_stage2(self, step: StepSpec, events: DataFrame, seeds: DataFrame, run: StepRun) -> tuple[DataFrame, Kernel]:
        """Stage 2 of a split pattern reads the events (``_seed`` null) and stage 1's seeds (event
        columns null, the seed packed into ``_seed``) in one frame, keyed alike."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        from eddyline.operators.pattern import SEED

        p = step.pattern
        assert p is not None
        keys = (p.key,) if isinstance(p.key, str) else tuple(p.key)
        keyed, kernel = self._keyed(step, events, run)
        seed_fields = [f for f in seeds.schema if f.name not in (KG, *keys)]
        seed_type = StructType(seed_fields)
        event_part = keyed.withColumn(SEED, F.lit(None).cast(seed_type))
        seed_part = seeds.select(
            *[
                F.col(KG) if f.name == KG else F.col(f"`{f.name}`") if f.name in keys else F.lit(None).cast(f.dataType).alias(f.name)
                for f in keyed.schema
            ],
            F.struct(*[F.col(f"`{f.name}`") for f in seed_fields]).alias(SEED),
        )
        return event_part.unionByName(seed_part), kernel

    def _join(self, step: StepSpec, left: DataFrame, right: DataFrame, run: StepRun) -> tuple[DataFrame, Kernel]:
        """Both sides in one frame: ``_kg``, ``_side`` (0 left, 1 right), ``l__*`` and ``r__*``
        columns (the other side's are null), so one shuffle brings matching keys together."""
        from eddyline.operators import kernels

        j = step.join
        assert j is not None
        lkeys = (j.left_key,) if isinstance(j.left_key, str) else tuple(j.left_key)
        rkeys = (j.right_key,) if isinstance(j.right_key, str) else tuple(j.right_key)
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
        nulls_l = [f"CAST(NULL AS {t.simpleString()}) AS `l__{n}`" for n, t in ltypes.items()]
        nulls_r = [f"CAST(NULL AS {t.simpleString()}) AS `r__{n}`" for n, t in rtypes.items()]
        kg_l = self._key_group(lkeys, run.routing.key_groups)
        kg_r = self._key_group(rkeys, run.routing.key_groups)
        lpart = left.selectExpr(f"{kg_l} AS {KG}", "CAST(0 AS TINYINT) AS _side", *[f"`{n}` AS `l__{n}`" for n in ltypes], *nulls_r)
        rpart = right.selectExpr(f"{kg_r} AS {KG}", "CAST(1 AS TINYINT) AS _side", *nulls_l, *[f"`{n}` AS `r__{n}`" for n in rtypes])
        try:
            kernel = kernels.build_join(step, _arrow_schema(left.schema), _arrow_schema(right.schema))
        except (ValueError, KeyError) as e:
            raise SpecError(f"step '{step.name}': join: {e}") from None
        both = lpart.unionByName(rpart)
        if run.routing.spread:
            both = self._spread(both, run.routing)
        return both, kernel

    def _spread(self, rows: DataFrame, routing: RoutingTable) -> DataFrame:
        """SPREADFIRE: a new row of a split key group is *stored* in one fragment (chosen by a
        hash of its content, so a replay chooses the same) and sent as a *probe* copy to every
        other fragment, where it meets the rows those fragments stored earlier. Fragment ``f``
        of group ``g`` is the virtual key group ``g + K*f``."""
        k = routing.key_groups
        cases = " ".join(f"WHEN {g} THEN {1 + len(extra)}" for g, extra in sorted(routing.spread.items()))
        content = ", ".join(f"`{c}`" for c in rows.columns if c != KG)
        cols = [f"`{c}`" for c in rows.columns if c != KG]
        return (
            rows.selectExpr("*", f"CASE {KG} {cases} ELSE 1 END AS _nfrag")
            .selectExpr("*", f"CAST(pmod(xxhash64({content}), _nfrag) AS INT) AS _home", "explode(sequence(0, _nfrag - 1)) AS _frag")
            .selectExpr(f"CAST({KG} + {k} * _frag AS INT) AS {KG}", *cols, f"_frag != _home AS {PROBE}")
        )

    def _udf(self, step: StepSpec, df: DataFrame) -> DataFrame:
        from eddyline.runtime.udf import UdfRunner, resolve

        udf = step.udf
        assert udf is not None
        try:
            resolve(udf.function)
        except ValueError as e:
            raise SpecError(f"step '{step.name}': udf.function: {e}") from None
        try:
            struct = _ddl(udf.schema_)
        except Exception as e:
            raise SpecError(f"step '{step.name}': udf.schema: expected Spark DDL like 'a long, b string': {_first_line(e)}") from None
        runner = UdfRunner(step.name, udf.function, udf.batch, _arrow_schema(struct))
        return df.mapInArrow(runner, struct)

    def _lookup(self, step: StepSpec, df: DataFrame) -> DataFrame:
        from functools import reduce

        from pyspark.sql import functions as F

        lk = step.lookup
        assert lk is not None
        table = self.tables.frame(self.spark, step.name, self._table_versions.get(step.name))
        keys = (lk.key,) if isinstance(lk.key, str) else lk.key
        tkeys = (lk.table_key,) if isinstance(lk.table_key, str) else lk.table_key
        for what, cols, have in (("key", keys, df.columns), ("table_key", tkeys, table.columns)):
            unknown = [c for c in cols if c not in have]
            if unknown:
                raise SpecError(f"step '{step.name}': lookup.{what}: unknown column '{unknown[0]}'; expected one of {', '.join(have)}")
        clash = sorted((set(table.columns) - set(tkeys)) & set(df.columns))
        if clash:
            raise SpecError(
                f"step '{step.name}': lookup.table: column '{clash[0]}' is in both the stream and the table; "
                "rename it in the table or select it away upstream"
            )
        renamed = table.select(*[F.col(c).alias(f"__lk_{i}") for i, c in enumerate(tkeys)], *[c for c in table.columns if c not in tkeys])
        cond = reduce(lambda a, b: a & b, [df[k] == renamed[f"__lk_{i}"] for i, k in enumerate(keys)])
        joined = df.join(F.broadcast(renamed), on=cond, how=lk.how)
        return joined.drop(*[f"__lk_{i}" for i in range(len(tkeys))])

    def _window(
        self,
        epoch: int,
        step: StepSpec,
        wa: WindowAggregate,
        df: DataFrame,
        run: StepRun,
        out: EpochFrames,
        observe: bool,
        kill_driver_pid: int | None,
    ) -> DataFrame:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F
        from pyspark.sql.types import TimestampNTZType, TimestampType

        _check_window_columns(step.name, wa, df)
        estimate = WEIGHT in df.columns
        if estimate:
            wa, df = _weighted(wa, df)
        cfg = window_config(wa)
        time_type = df.schema[wa.time].dataType
        if not isinstance(time_type, TimestampType | TimestampNTZType):
            raise SpecError(
                f"step '{step.name}': time: expected a timestamp column, "
                f"'{wa.time}' is {time_type.simpleString()}"
            )
        size, slide, lateness, wm = cfg.size_ms, cfg.slide_ms, cfg.allowed_lateness_ms, run.watermark_ms
        # Few, string-built expressions: every Column built in Python is a py4j round trip, and
        # planning cost is paid every epoch.
        t_ms = f"CAST(floor(unix_micros(CAST(`{wa.time}` AS TIMESTAMP)) / 1000) AS BIGINT)"
        df = df.selectExpr("*", f"{t_ms} AS {EVENT_MS}").selectExpr(
            "*", f"coalesce({EVENT_MS} - pmod({EVENT_MS}, {slide}) + {size + lateness} <= {wm}, true) AS {LATE}"
        )
        if observe:
            obs = Observation(f"e{epoch}-step-{step.name}")
            df = df.observe(
                obs,
                F.expr("count(1)").alias("rows"),
                F.expr(f"max({EVENT_MS})").alias("max_t"),
                F.expr(f"count_if({LATE})").alias("late"),
            )
            out.observations[f"step:{step.name}"] = obs
        if wa.late is not None:
            out.late[step.name] = df.filter(F.col(LATE)).drop(EVENT_MS, LATE)
        k = cfg.windows_per_row
        last_start = f"({EVENT_MS} - pmod({EVENT_MS}, {slide}))"
        kg = self._key_group(cfg.keys, run.routing.key_groups)
        live = df.where(f"NOT {LATE}")  # rows without an event time count as late
        if k == 1:
            live = live.selectExpr("*", f"{last_start} AS {START_MS}", f"{kg} AS {KG}")
        else:
            live = live.selectExpr(
                "*", f"explode(sequence({last_start} - {(k - 1) * slide}, {last_start}, {slide})) AS {START_MS}"
            ).selectExpr("*", f"{kg} AS {KG}")
            live = live.where(f"{START_MS} + {size + lateness} > {wm}")
        aggs: list[str] = []
        for pcol, func, col, _ in cfg.partial_columns():
            if func == "count":
                aggs.append(f"count({'1' if col is None else f'`{col}`'}) AS `{pcol}`")
            elif func == "sum":
                ctype = live.schema[col].dataType.simpleString()
                c = f"CAST(`{col}` AS DOUBLE)" if ctype.startswith("decimal") or ctype in ("float", "double") else f"`{col}`"
                aggs.append(f"sum({c}) AS `{pcol}`")
            else:
                aggs.append(f"{func}(`{col}`) AS `{pcol}`")
        partial = live.groupBy(KG, *cfg.keys, START_MS).agg(*[F.expr(a) for a in aggs])
        result = self._lanes(
            epoch, step.name, partial, WindowKernel(cfg, _arrow_schema(partial.schema)), run, kill_driver_pid, cfg.keys[:1]
        )
        if estimate:  # the variance sums become confidence half-widths
            z = NormalDist().inv_cdf(0.5 + self.spec.control.overload.confidence / 2)  # type: ignore[union-attr]
            result = result.selectExpr(*[
                f"CAST({z!r} * sqrt(`{c}`) AS DOUBLE) AS `{c[: -len(VAR)]}_error`" if c.endswith(VAR) else f"`{c}`"
                for c in result.columns
            ])
        return result

    def _lanes(
        self,
        epoch: int,
        step: str,
        keyed: DataFrame,
        kernel: Kernel,
        run: StepRun,
        kill_driver_pid: int | None,
        key_columns: tuple[str, ...] = (),
    ) -> DataFrame:
        """The shared back half of every stateful step: ``keyed`` (which has ``_kg`` and the
        kernel's input columns) is shuffled so that lane i is partition i, then each lane runs
        ``kernel`` against its key groups' state."""
        from pyspark.sql import functions as F

        lanes = run.routing.lanes  # each step has its own number of lanes (elastic lanes)
        routes = ", ".join(f"{v}L" for v in run.routing.route_values())
        lane_routes = ", ".join(f"{v}L" for v in route_values(lanes))
        wanted = [*kernel.input_schema.names, *([PROBE] if PROBE in keyed.columns else [])]
        columns = [f for f in keyed.schema if f.name in wanted]
        # One heartbeat row per lane (_kg = -1 - lane) rides the same shuffle: a lane learns its
        # number from its data (a task's partition id is shifted when a union follows the lane in
        # the same Spark stage), and an empty lane still runs to fire its key groups' timers.
        # The heartbeat frame depends only on the lane count and the columns, so it is built
        # once and reused by later epochs (each DataFrame built costs a JVM analysis round).
        beat_key = (lanes, tuple((f.name, f.dataType.simpleString()) for f in columns))
        heartbeats = self._heartbeats.get(beat_key)
        if heartbeats is None:
            heartbeats = self.spark.range(0, lanes, 1, 1).select(
                *[
                    F.expr("CAST(-1 - id AS INT)").alias(KG) if f.name == KG else F.lit(None).cast(f.dataType).alias(f.name)
                    for f in columns
                ]
            )
            self._heartbeats[beat_key] = heartbeats
        # Rows are shuffled on their routing value, computed in the shuffle's partitioning
        # expression: a value Spark's hash sends to the key group's lane (a heartbeat: to its
        # lane). No column carries it, so none is handed to Python (every column costs the JVM's
        # Arrow conversion per row: bench/adaptive/arrow_handoff.py), and no projection adds or
        # drops it (each costs an analysis round in the driver).
        route = (
            f"CASE WHEN {KG} >= 0 THEN element_at(array({routes}), {KG} + 1) "
            f"ELSE element_at(array({lane_routes}), -{KG}) END"
        )
        if [f.name for f in columns] != keyed.columns:
            keyed = keyed.select(*[f"`{f.name}`" for f in columns])
        routed = keyed.union(heartbeats).repartition(lanes, F.expr(route))
        task = LaneTask(
            step=step,
            epoch=epoch,
            checkpoint=self.checkpoint,
            kernel=kernel,
            routing=tuple(int(x) for x in run.routing.owners()),
            index=run.index,
            watermark_ms=run.watermark_ms,
            state_budget=run.state_budget,
            bytes_per_row=run.bytes_per_row,
            key_columns=key_columns,
            kill_driver_pid=kill_driver_pid,
        )
        return routed.mapInArrow(functools.partial(run_lane, task), _spark_schema(kernel.output_schema))

    def _key_group(self, keys: tuple[str, ...], key_groups: int) -> str:
        """SQL for a row's key group; a global aggregate has one key group."""
        if not keys:
            return "CAST(0 AS INT)"
        cols = ", ".join(f"`{k}`" for k in keys)
        return f"CAST(pmod(xxhash64({cols}), {key_groups}) AS INT)"


WEIGHT = "_w"
VAR = "__var"


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


def _key_columns(step: StepSpec) -> tuple[str, ...]:
    """The lane input column(s) naming a row's key (first key column; a join's from either side)."""
    if step.join is not None:
        lk, rk = step.join.left_key, step.join.right_key
        return (f"l__{lk if isinstance(lk, str) else lk[0]}", f"r__{rk if isinstance(rk, str) else rk[0]}")
    return step.key_columns[:1]


def _check_window_columns(step: str, wa: WindowAggregate, df: DataFrame) -> None:
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


def _ddl(ddl: str) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    t = _parse_datatype_string(ddl)
    if not isinstance(t, StructType):
        raise ValueError(f"expected a list of columns, got {ddl!r}")
    return t


def _arrow_schema(struct: Any) -> pa.Schema:
    """Spark schema → Arrow, every field nullable: a kernel sees rows of several origins (heartbeats,
    the other side of a join, stage-2 seeds) whose columns may be null whatever Spark declares."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.schema([f.with_nullable(True) for f in to_arrow_schema(struct, timezone="UTC")])


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def empty_epoch(spark: SparkSession, spec: NetworkSpec, lanes: int) -> EpochFrames:
    """The network over empty slices of every source: Spark analyses every step (column and
    type errors surface here) without reading data or touching a checkpoint."""
    from eddyline.eventtime import NO_WATERMARK
    from eddyline.io.sources import make_source

    sources = {s.name: make_source(s) for s in spec.sources}
    runs = {
        s.name: StepRun(NO_WATERMARK, RoutingTable.uniform(spec.key_groups, lanes), {})
        for s in spec.steps
        if s.stateful
    }
    empty = {n: {"start": 0, "end": 0, "files": []} for n in sources}
    return EpochCompiler(spark, spec, sources, "/nonexistent-checkpoint").build(0, empty, runs, lanes, observe=False)
