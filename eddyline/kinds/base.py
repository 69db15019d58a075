"""What a step kind implements beyond its spec facts: how it compiles to Spark and, when it keeps
state, which kernel its lanes run.

A kind's module holds three things: its parameters (a spec model, registered with
:data:`eddyline.api.steps.STEPS`), ``compile`` (the Spark side: the step's input frames in,
its output frame out, built through a :class:`CompileContext` the runtime provides) and
``kernel`` (the Arrow side: a pure :class:`~eddyline.operators.base.Kernel` for one lane). For
resident lanes (no Spark job an epoch) a stateful kind prepares its lanes' rows on Arrow
(``lane_input``) and a stateless one runs on a lane's Arrow rows (``lane_step``, ``lane_run``).
Nothing else in the engine branches on the kind.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from eddyline.api import steps as api_steps
from eddyline.api.units import names
from eddyline.columns import KG
from eddyline.errors import SpecError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from eddyline.api.network import NetworkSpec
    from eddyline.api.steps import StepSpec
    from eddyline.operators.base import Kernel
    from eddyline.operators.sqlsteps import SqlStep
    from eddyline.plan.keygroups import RoutingTable


class StepRun(Protocol):
    """What one epoch's plan says about a stateful step."""

    watermark_ms: int
    routing: RoutingTable


class CompileContext(Protocol):
    """The runtime's side of compiling one epoch, as a kind sees it."""

    spark: SparkSession
    spec: NetworkSpec
    epoch: int
    #: whether observations are collected (not when only analysing a network: validate, explain)
    observing: bool
    #: the epoch is expected to be small (the one before read few rows): a step may hand its rows
    #: to the lanes without combining them in a stage of their own (which costs more than the
    #: lanes' work on them then)
    small: bool

    def run(self, step: StepSpec) -> StepRun:
        """The epoch plan's watermark and routing of a stateful step."""
        ...

    def key_group(self, keys: tuple[str, ...]) -> str:
        """SQL for a row's key group, ``pmod(xxhash64(keys), K)`` (0 without keys)."""
        ...

    def observe(self, df: DataFrame, key: str, *aggregates: str) -> DataFrame:
        """``df``, with SQL ``aggregates`` over its rows reported under ``key`` after the epoch
        (when observing; otherwise ``df`` as it is)."""
        ...

    def observe_event_times(self, step: StepSpec, inputs: list[DataFrame]) -> list[DataFrame]:
        """The inputs, with the newest event time of each observed (the step's watermark
        follows it), as ``step:<name>:<input>``."""
        ...

    def union_of(self, step: StepSpec, parts: list[tuple[DataFrame, list[tuple[str, str]]]]) -> DataFrame:
        """The union of one projection per input of ``step`` (``parts``: the input and its output
        columns, each a name and SQL over the input's columns), with the inputs' newest event
        times observed as :meth:`observe_event_times` does. When every input reaches one node
        through filters and selects only, it is made from one read of that node
        (:mod:`eddyline.plan.branches`)."""
        ...

    def to_lanes(self, step: StepSpec, keyed: DataFrame, kernel: Kernel, key_columns: tuple[str, ...]) -> DataFrame:
        """The shared back half of every stateful step: ``keyed`` (with ``_kg`` and the
        kernel's input columns) shuffled so that lane i is partition i, each lane running
        ``kernel`` against its key groups' state. ``key_columns``: the input columns naming a
        row's key (for the heavy-hitter report)."""
        ...

    def late_rows(self, step: StepSpec, df: DataFrame) -> None:
        """Rows too late for ``step``, to be written to its late target."""
        ...

    def wanted(self, step: StepSpec) -> frozenset[str] | None:
        """The columns (lower case) of ``step``'s output that the steps and sinks after it read,
        None for all (see :meth:`NetworkSpec.columns_read`)."""
        ...

    def table(self, step: StepSpec) -> DataFrame:
        """The lookup table version the epoch's plan pinned for ``step``."""
        ...


class LaneFeed(Protocol):
    """The runtime's side of a resident epoch (:mod:`eddyline.runtime.residentmode`), as a kind
    sees it: no Spark, the rows in Arrow."""

    spec: NetworkSpec

    def key_groups(self, step: StepSpec, table: pa.Table, keys: tuple[str, ...]) -> np.ndarray:
        """Each row's key group, as :meth:`CompileContext.key_group` has Spark compute it."""
        ...

    def wanted(self, step: StepSpec) -> frozenset[str] | None:
        """As :meth:`CompileContext.wanted`."""
        ...

    def prepared(self, step: StepSpec) -> Any:
        """What :meth:`StepKind.lane_step` prepared of a stateless step for the network in force."""
        ...

    def table(self, step: StepSpec) -> pa.Table:
        """As :meth:`CompileContext.table`, on Arrow: the table version the epoch's plan pinned
        for ``step`` (before the first plan, the live files), with the types Spark's reader gives."""
        ...


class StepKind(api_steps.StepKind):
    def reads_plan(self, params: Any) -> bool:
        """Its frame depends on the epoch's plan beyond what its tasks read when they run (the
        sources' slices, a lane's state, routing and watermark): a lookup's table version, a
        watermark in its SQL. Such a step is built anew every epoch rather than once for all
        (see ``EpochCompiler.build``)."""
        return False

    def plans_small_epochs(self, params: Any) -> bool:
        """Its frame for a small epoch differs from a large one's (``CompileContext.small``)."""
        return False

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        raise NotImplementedError(f"step kind {self.key!r} does not compile")

    def kernel(self, params: Any, *schemas: pa.Schema) -> Kernel:
        """The lane kernel of a stateful step for its input schema(s) (without ``_kg``);
        raises ``ValueError`` for parameters that do not fit the input."""
        raise NotImplementedError(f"step kind {self.key!r} has no kernel")

    def resident_problem(self, step: StepSpec) -> str | None:
        """Why a resident epoch cannot run this step: a stateful step's rows prepared for its
        lanes (:meth:`lane_input`), a stateless step's run on a lane's rows (:meth:`lane_run`);
        None when it can."""
        if not self.stateful:
            return None if type(self).lane_run is not StepKind.lane_run else f"a {self.key} step runs in Spark"
        return f"a {self.key} step prepares its rows in Spark before its lanes"

    def lane_step(self, step: StepSpec) -> Any:
        """What the lanes of a resident stage need to run this stateless step (:meth:`lane_run`),
        prepared once by the driver for the network in force and pickled with it (a translated
        SQL expression, a resolved function); raises :class:`SpecError` naming the step and the
        field when they cannot run it. None: nothing to prepare."""
        return None

    def lane_run(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> pa.Table:
        """:meth:`compile`'s resident counterpart for a stateless step: its output rows from its
        inputs' rows on one lane (Arrow in, Arrow out), as Spark gives them for the same rows.
        Run over empty inputs too (the executor derives every step's schema so, before the
        first epoch); the step's own code failing on a lane's rows raises
        :class:`~eddyline.errors.LaneStepError`."""
        raise NotImplementedError(self.resident_problem(step))

    def lane_input(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> tuple[pa.Table, Kernel]:
        """:meth:`compile`'s resident counterpart up to the lanes: from its inputs' rows (Arrow),
        the rows its lanes take (with ``_kg``, the kernel's input schema) and the kernel."""
        raise NotImplementedError(self.resident_problem(step))

    def lane_late(self, step: StepSpec, inputs: list[pa.Table], watermark_ms: int) -> tuple[list[pa.Table], pa.Table | None]:
        """The resident counterpart of :meth:`CompileContext.late_rows`: a step with a late target
        (:meth:`late_target`) splits the rows too late for the epoch's plan watermark
        ``watermark_ms`` off its inputs, as :meth:`compile` has Spark split them. Its inputs
        without them (for :meth:`lane_input`) and them, in their order (None: it writes no late
        rows)."""
        return inputs, None

    def lane_output(self, feed: LaneFeed, step: StepSpec, rows: pa.Table) -> tuple[pa.Table, dict[str, dict[str, Any]]]:
        """:meth:`compile`'s resident counterpart after the lanes: the kernel's output rows as the
        step gives them on (what Spark does to them after the lanes), and what is observed of them
        by name (:func:`eddyline.runtime.lanenetwork.merged_observed` merges the lanes'). As
        they are, by default."""
        return rows, {}


class KeyedStepKind(StepKind):
    """A single-input stateful step whose rows keep their columns and gain their key group."""

    stateful = True
    rows_reach_lanes = True
    #: the name of the field holding the key columns, for messages
    key_field = "key"

    def key_columns(self, params: Any) -> tuple[str, ...]:
        return names(getattr(params, self.key_field))

    def passing_through(self, wanted: frozenset[str] | None, *own: str) -> tuple[frozenset[str] | None]:
        """What a step reads whose rows pass through as they are (a dedup's first rows, a
        top-k's top rows): ``wanted`` of its output and ``own`` (its keys, times, order)."""
        return (columns_of(wanted, frozenset(c.lower() for c in own)),)

    def lane_columns(self, step: StepSpec) -> frozenset[str] | None:
        """The input columns (lower case) its lanes need whatever is read after it, None for all;
        the others (but weights, ``_``…) are left out before the shuffle."""
        return None

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        (df,) = ctx.observe_event_times(step, inputs)
        need = self.lane_columns(step)
        have = df.columns if need is not None else []  # (one call into the JVM)
        if need is not None and all(k in have for k in self.key_columns(step.params)):
            kept = [c for c in have if c.lower() in need or c.startswith("_")]
            df = df.select(*[f"`{c}`" for c in kept]) if len(kept) < len(have) else df
        keyed, kernel = self.keyed(ctx, step, df)
        return ctx.to_lanes(step, keyed, kernel, self.key_columns(step.params)[:1])

    def resident_problem(self, step: StepSpec) -> str | None:
        plain = type(self).compile is KeyedStepKind.compile and type(self).keyed is KeyedStepKind.keyed
        return None if plain else super().resident_problem(step)

    def lane_input(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> tuple[pa.Table, Kernel]:
        (rows,) = inputs
        keys = self.key_columns(step.params)
        unknown = [k for k in keys if k not in rows.column_names]
        if unknown:
            raise SpecError(f"step '{step.name}': {self.key_field}: unknown column '{unknown[0]}'; "
                            f"input has {', '.join(rows.column_names)}")
        schema = pa.schema([f.with_nullable(True) for f in rows.schema])
        kernel = build_kernel(step, schema)
        return rows.cast(schema).append_column(KG, pa.array(feed.key_groups(step, rows, keys), pa.int32())), kernel

    def keyed(self, ctx: CompileContext, step: StepSpec, df: DataFrame) -> tuple[DataFrame, Kernel]:
        keys = self.key_columns(step.params)
        unknown = [k for k in keys if k not in df.columns]
        if unknown:
            raise SpecError(f"step '{step.name}': {self.key_field}: unknown column '{unknown[0]}'; input has {', '.join(df.columns)}")
        keyed = df.selectExpr("*", f"{ctx.key_group(keys)} AS {KG}")
        return keyed, build_kernel(step, arrow_schema(df.schema))


def lane_sql(step: StepSpec, **sql: Any) -> SqlStep:
    """A filter's or a select's Spark SQL as the DuckDB SQL resident lanes run (SpecError naming
    the step when it does not translate)."""
    from eddyline.operators.sqlsteps import SqlStep, SqlStepError

    try:
        return SqlStep(step.name, **sql)
    except SqlStepError as e:
        raise SpecError(str(e)) from None


def build_kernel(step: StepSpec, *schemas: pa.Schema) -> Kernel:
    """The step's kernel; a parameter that does not fit the input is a spec error naming it."""
    kind = step.info
    assert isinstance(kind, StepKind)
    try:
        return kind.kernel(step.params, *schemas)
    except (ValueError, KeyError) as e:
        raise SpecError(f"step '{step.name}': {step.kind}: {e}") from None


# --------------------------------------------------------------------------- aggregates
_AGG = re.compile(r"^\s*(count|sum|min|max|avg)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.I)
AGG_FUNCS = ("count", "sum", "min", "max", "avg")


def parse_aggregate(text: str) -> tuple[str, str | None]:
    """``"max(price)"`` → ``("max", "price")``; ``"count(*)"`` → ``("count", None)``."""
    m = _AGG.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(
            f"expected one of count(*), count(col), sum(col), min(col), max(col), avg(col); got {text!r}"
        )
    func, col = m.group(1).lower(), m.group(2)
    if col == "*":
        if func != "count":
            raise ValueError(f"expected a column inside {func}(), got {text!r}")
        return func, None
    return func, col


def check_aggregates(aggregates: dict[str, str]) -> None:
    """Raise one ``ValueError`` naming every ``aggregates.<name>`` that does not parse."""
    problems = []
    for name, text in aggregates.items():
        try:
            parse_aggregate(text)
        except ValueError as e:
            problems.append(f"aggregates.{name}: {e}")
    if problems:
        raise ValueError("; ".join(problems))


class Aggregating:
    """For parameters with ``aggregates: {name: "func(col)"}``."""

    aggregates: dict[str, str]

    @property
    def parsed_aggregates(self) -> tuple[tuple[str, str, str | None], ...]:
        return tuple((n, *parse_aggregate(t)) for n, t in self.aggregates.items())

    def read_columns(self, *own: str) -> frozenset[str]:
        """``own`` (keys, time) and the columns the aggregates read, lower case."""
        return frozenset(c.lower() for c in (*own, *(col for _, _, col in self.parsed_aggregates if col is not None)))


# --------------------------------------------------------------------------- Spark ↔ Arrow
def ddl(text: str) -> Any:
    """A Spark DDL column list (``"a long, b string"``) as a StructType."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    t = _parse_datatype_string(text)
    if not isinstance(t, StructType):
        raise ValueError(f"expected a list of columns, got {text!r}")
    return t


def arrow_schema(struct: Any) -> pa.Schema:
    """Spark schema → Arrow, every field nullable: a kernel sees rows of several origins (heartbeats,
    the other side of a join, stage-2 seeds) whose columns may be null whatever Spark declares."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.schema([f.with_nullable(True) for f in to_arrow_schema(struct, timezone="UTC")])


def spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def resolve(path: str) -> Any:
    """``"package.module:name"`` → the callable (raises ``ValueError`` with the reason)."""
    import importlib

    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module failing while it loads
        raise ValueError(f"cannot import module '{module_name}': {type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"module '{module_name}' has no function '{attr}'")
    return fn


@functools.lru_cache(maxsize=1024)
def sql_columns(text: str) -> frozenset[str] | None:
    """The names (lower case, as Spark resolves them) an SQL expression may read a column by;
    None when it may read any (``*``) or does not parse. ``a.b`` counts ``a`` (a struct) and
    ``b``: a name too many only keeps a column."""
    import sqlglot
    from sqlglot.errors import ParseError

    try:
        parsed = sqlglot.parse_one(text, read="spark")
    except ParseError:
        return None
    if parsed is None or any(True for _ in parsed.find_all(sqlglot.exp.Star)):
        return None
    return frozenset(part.name.lower() for col in parsed.find_all(sqlglot.exp.Column) for part in col.parts)


def output_name(text: str) -> str | None:
    """The name of the column an SQL select expression makes (its alias, or the column it
    is); None for ``*``."""
    import sqlglot

    parsed = sqlglot.parse_one(text, read="spark")
    return None if isinstance(parsed, sqlglot.exp.Star) else parsed.alias_or_name


def columns_of(*parts: frozenset[str] | None) -> frozenset[str] | None:
    """The union of column sets, None (all) if any is None."""
    out: frozenset[str] = frozenset()
    for p in parts:
        if p is None:
            return None
        out |= p
    return out


def sql_problems(expressions: list[tuple[str, str]]) -> list[str]:
    """``field: message`` for each SQL expression that does not parse (sqlglot's Spark dialect,
    no Spark needed) or is a whole query instead of an expression."""
    import sqlglot
    from sqlglot.errors import ParseError

    problems = []
    for field, text in expressions:
        try:
            parsed = sqlglot.parse_one(text, read="spark")
        except ParseError as e:
            detail = _parse_detail(e.errors[0]["description"] if e.errors else str(e))
            problems.append(f"{field}: invalid SQL expression {text!r}: {detail}")
            continue
        if parsed is None or isinstance(parsed, sqlglot.exp.Select | sqlglot.exp.Command):
            problems.append(f"{field}: expected an SQL expression, got {text!r}")
    return problems


def _parse_detail(description: str) -> str:
    """sqlglot's reason in the words of the expression, not of its classes: "Required keyword:
    'expression' missing for <class 'sqlglot.expressions.core.GT'>" says an operand is missing."""
    import re

    found = re.match(r"Required keyword: '(\w+)' missing for <class '[\w.]*\.(\w+)'>", description)
    if found is None:
        return description
    what = {"expression": "its right-hand operand", "this": "its operand"}.get(found.group(1), found.group(1))
    return f"{found.group(2).upper()} is missing {what}"
