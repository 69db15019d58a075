"""Streaming SQL: the Flink SQL subset Nexmark needs, compiled into the network model.

A script of ``CREATE TABLE … WITH ('connector' = …)``, ``CREATE VIEW``, ``SET`` and ``INSERT INTO
… SELECT …`` statements becomes the same spec dict a YAML file holds (sources, steps, sinks), and
is validated like one. Parsed by sqlglot (Spark's dialect, extended below with what Flink adds:
window table functions, ``DESCRIPTOR``, ``WATERMARK FOR``, the ``SESSION`` group window).

How a query maps onto step kinds::

    FROM t WHERE p                               → filter (pushed below a join where it can go)
    SELECT exprs                                 → select (only when the columns change)
    TABLE(TUMBLE|HOP|CUMULATE(TABLE t, DESCRIPTOR(c), …))
        GROUP BY k, window_start, window_end     → window_aggregate (no aggregates: dedup)
    GROUP BY k, SESSION(c, INTERVAL …)           → session_window
    GROUP BY k (no window)                       → aggregate (a changelog of revisions)
    a JOIN b ON a.k = b.k                        → join (unbounded; SET 'table.exec.state.ttl')
        AND b.t BETWEEN a.t0 AND a.t1            → join kind interval (bounds and point computed
                                                   by a select where they are expressions)
        on two TUMBLE tables, equal windows      → join kind window
        on two queries grouped per TUMBLE window, AND equal window_start, window_end
                                                 → join kind window on each side's window_start
    b JOIN (… GROUP BY window_start, window_end) w ON … b.t BETWEEN w.t - INTERVAL x AND w.t
                                                 → join kind interval, b's rows the intervals
                                                   [b.t, b.t + x] and w's rows the points w.t
    a JOIN (SELECT MAX(a'.c) AS m, window_start, window_end FROM a' GROUP BY window_start, window_end) w
        ON both bounds equal AND a.c >= w.m, a' the same window aggregate as a (Nexmark q5)
                                                 → top_k (k 1, with ties) over a's window_aggregate
    ROW_NUMBER()|RANK() OVER (PARTITION BY … ORDER BY …) AS rn … WHERE rn <= k
                                                 → top_k (RANK: with ties)
    AGG(x) OVER (PARTITION BY k ORDER BY t ROWS BETWEEN n PRECEDING AND CURRENT ROW)
                                                 → over_aggregate

A streaming top-k emits a partition once it is complete, so its partition must end in event
time: a window (``window_start``/``window_end``), or the key of an interval join (the rows of
a left row end at its interval's end). Rows grouped per window leave their step once their
window ends, behind the event time of the tables they came from: they are joined as points
(an interval join) or on their window's start (a window join), never as intervals that would
start behind the watermark. Anything else is refused, naming the clause, before anything runs
(:class:`~eddyline.errors.SpecError`, every message starting ``sql:``).

>>> raw = compile_sql('''
...   CREATE TABLE bid (auction BIGINT, price BIGINT, date_time TIMESTAMP(3))
...     WITH ('connector' = 'nexmark', 'stream' = 'bid');
...   CREATE TABLE out WITH ('connector' = 'blackhole');
...   INSERT INTO out SELECT auction, price FROM bid WHERE price > 100;''', name="expensive")
>>> [list(s) for s in raw["steps"]]
[['name', 'input', 'filter'], ['name', 'input', 'select']]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import sqlglot
from pydantic import ValidationError
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError
from sqlglot.tokens import TokenType

from eddyline.api.sources import SOURCES
from eddyline.api.steps import STEPS, StepSpec
from eddyline.columns import join_right_names
from eddyline.errors import SpecError

WINDOW_TVFS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")


# --------------------------------------------------------------------------- the dialect


def _tvf_args(self: Any) -> list[exp.Expression]:
    """Arguments of a window table function: ``TABLE t [PARTITION BY c]``, ``DESCRIPTOR(c)``,
    intervals, each optionally named (``SIZE => INTERVAL '10' SECOND``)."""
    args: list[exp.Expression] = []
    while True:
        name = None
        if self._curr and self._next and self._next.token_type == TokenType.FARROW:
            name = self._curr.text.upper()
            self._advance(2)
        if self._match(TokenType.TABLE):
            arg = self._parse_table_parts()
            if self._match(TokenType.PARTITION_BY):
                # one column, or several in parentheses (Flink: PARTITION BY (a, b))
                keys = self._parse_wrapped_csv(self._parse_column) if self._curr.token_type == TokenType.L_PAREN \
                    else [self._parse_column()]
                arg = exp.Anonymous(this="PARTITIONED", expressions=[arg, *keys])
        else:
            arg = self._parse_disjunction()
        if arg is None:
            break
        args.append(exp.Kwarg(this=exp.var(name), expression=arg) if name else arg)
        if not self._match(TokenType.COMMA):
            break
    return args


def _tvf_parser(name: str) -> Any:
    return lambda self: exp.Anonymous(this=name, expressions=_tvf_args(self))


def _watermark(self: Any) -> exp.Expression | None:
    if not self._match_text_seq("FOR"):
        return None
    column = self._parse_field()
    self._match(TokenType.ALIAS)
    return exp.WatermarkColumnConstraint(this=column, expression=self._parse_disjunction())


class Flink(Spark):
    """Spark's dialect plus the Flink syntax the subset needs (sqlglot has no Flink dialect)."""

    class Parser(Spark.Parser):
        FUNC_TOKENS = {*Spark.Parser.FUNC_TOKENS, TokenType.SESSION}
        FUNCTION_PARSERS = {**Spark.Parser.FUNCTION_PARSERS, **{n: _tvf_parser(n) for n in WINDOW_TVFS}}
        SCHEMA_UNNAMED_CONSTRAINTS = {*Spark.Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}
        CONSTRAINT_PARSERS = {**Spark.Parser.CONSTRAINT_PARSERS, "WATERMARK": _watermark}


def parse(text: str) -> list[exp.Expression]:
    """The statements of a script; a syntax error as a SpecError with its line and column."""
    try:
        return [s for s in sqlglot.parse(text, read=Flink) if s is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        where = f"line {first.get('line')}, column {first.get('col')}: " if first else ""
        near = (first.get("highlight") or "").strip()
        what = str(first.get("description", e)).strip()
        raise SpecError(f"sql: syntax error at {where}{what}{f' near {near!r}' if near else ''}") from None


# --------------------------------------------------------------------------- relations


@dataclass(frozen=True)
class Field:
    """A column a query can name: ``quals.name``, computed by ``sql`` from its node's columns."""

    name: str
    quals: frozenset[str]
    sql: exp.Expression | None  # None: not computable here (a HOP window's bounds before GROUP BY)
    delay: int | None = None  # an event-time column, with its watermark delay (ms)
    role: str | None = None  # window_start, window_end, interval_end

    @property
    def column(self) -> str | None:
        """The node column it is, when it is one as it is."""
        return self.sql.name if isinstance(self.sql, exp.Column) and not self.sql.table else None


@dataclass(frozen=True)
class Window:
    """A window table function not yet grouped or joined."""

    kind: str  # TUMBLE, HOP, CUMULATE, SESSION
    time: str  # the node column of DESCRIPTOR(...)
    size: int  # CUMULATE: the largest window
    slide: int | None
    delay: int
    keys: tuple[str, ...] = ()  # SESSION(TABLE t PARTITION BY k, ...)
    step: int | None = None  # CUMULATE: how often a window ends


@dataclass(frozen=True)
class Rank:
    """``ROW_NUMBER() OVER (...) AS name`` waiting for the enclosing ``WHERE name <= k``."""

    name: str
    partition: tuple[exp.Expression, ...]  # over the node's columns
    roles: tuple[str | None, ...]  # of the partition's columns (window_start, ...)
    order: tuple[exp.Ordered, ...]  # over the node's columns
    with_ties: bool


@dataclass(frozen=True)
class PerWindow:
    """``SELECT MAX(c) … GROUP BY window_start, window_end`` over a window aggregate's rows: not
    compiled by itself (a window over a window), only joined back to that aggregate's rows ON the
    window bounds AND ``c >= max`` (:meth:`Compiler.top_rows_join`)."""

    func: str  # max or min
    column: str  # the aggregate column of the window aggregate (node) it is over
    clause: str  # how the query wrote it, for messages


@dataclass(frozen=True)
class Rel:
    """Rows of network node ``node`` (whose columns are ``columns``) seen through ``fields``."""

    node: str
    columns: tuple[str, ...]
    fields: tuple[Field, ...]
    window: Window | None = None
    rank: Rank | None = None
    #: how far its window_end runs ahead of event time (rows of a window table, not grouped)
    ahead: int = 0
    #: the window size when rows carry window_start / window_end of a fixed-size window
    window_size: int | None = None
    #: the node columns of the interval join that made these rows (their partition ends)
    interval_keys: tuple[str, ...] = ()
    #: the window whose bounds the rows carry as columns (a window aggregate's, a distinct per
    #: window's or a window join's output), for joining such rows on their bounds
    windowed: Window | None = None
    #: a per-window maximum waiting for the join that makes it a top-1 (its node: the aggregate's)
    pending: PerWindow | None = None

    def requalify(self, qual: str) -> Rel:
        return replace(self, fields=tuple(replace(f, quals=frozenset({qual})) for f in self.fields))

    def direct(self) -> bool:
        """Whether it is exactly its node's columns (nothing to compute)."""
        return [f.column for f in self.fields] == list(self.columns) and all(
            f.name == f.column for f in self.fields
        )


def col(name: str) -> exp.Column:
    return exp.Column(this=exp.to_identifier(name))


def render(e: exp.Expression) -> str:
    return e.sql(dialect="spark")


def _duration(e: exp.Expression, clause: str) -> int:
    """``INTERVAL '10' SECOND`` → 10000 ms."""
    units = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
    if isinstance(e, exp.Kwarg):
        e = e.expression
    if isinstance(e, exp.Interval) and e.this is not None:
        unit = (e.text("unit") or "").upper().rstrip("S")
        value = e.this.name
        if unit in units and re.fullmatch(r"\d+(\.\d+)?", value):
            return round(float(value) * units[unit])
        if not unit and (m := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+?)S?\s*", value)) and m.group(2).upper() in units:
            return round(float(m.group(1)) * units[m.group(2).upper()])
    raise SpecError(f"sql: {clause}: expected an interval like INTERVAL '10' SECOND, got {render(e)}")


def _window_text(w: Window) -> str:
    """``TUMBLE 10 s``, ``HOP 10 s every 2 s``: a window for messages."""
    sec = lambda ms: f"{ms / 1000:g} s"  # noqa: E731
    every = w.slide or w.step
    return f"{w.kind} {sec(w.size)}" + (f" every {sec(every)}" if every and every != w.size else "")


def _param_text(key: str, value: Any) -> str:
    """A window aggregate's parameter as the compiler wrote it, for messages (windows in seconds)."""
    if key == "window" and isinstance(value, dict):
        every = value.get("slide") or value.get("step")
        return f"{value['size'] / 1000:g} s" + (f" every {every / 1000:g} s" if every else "")
    if key == "watermark_delay" and isinstance(value, int):
        return f"{value / 1000:g} s"
    return "none" if value is None else ", ".join(value) if isinstance(value, list) else str(value)


def _conjuncts(e: exp.Expression | None) -> list[exp.Expression]:
    if e is None:
        return []
    if isinstance(e, exp.Paren):
        return _conjuncts(e.this)
    if isinstance(e, exp.And):
        return _conjuncts(e.left) + _conjuncts(e.right)
    return [e]


def _and(parts: list[exp.Expression]) -> exp.Expression:
    out = parts[0]
    for p in parts[1:]:
        out = exp.And(this=out, expression=p)
    return out


def _fn(e: exp.Expression) -> str:
    """The upper-case name of a function call (``TUMBLE``, ``SESSION_START``), else ''."""
    if isinstance(e, exp.Anonymous):
        return str(e.this).upper()
    if isinstance(e, exp.Func):
        return e.sql_name().upper()
    return ""


def _output_columns(step: dict[str, Any], columns: dict[str, tuple[str, ...] | None]) -> tuple[str, ...] | None:
    """The output columns of a step written in YAML, as its kind tells them; None: not known
    (also for a step that does not validate: validation names its problem later)."""
    try:
        spec = StepSpec.model_validate(step)
    except ValidationError:
        return None
    return spec.info.output_columns(spec, tuple(columns.get(name) for name in spec.inputs))


# --------------------------------------------------------------------------- the compiler


@dataclass
class Table:
    """A ``CREATE TABLE``: a source when read, a sink when inserted into."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    delays: dict[str, int]
    kind: str
    params: dict[str, Any]
    node: dict[str, Any]  # node-level fields (limit, max_rows_per_epoch, qos)


#: Flink connector names for Eddyline's kinds
CONNECTORS = {"blackhole": "discard", "print": "console", "filesystem": "files"}
NODE_FIELDS = {"limit", "max_rows_per_epoch", "qos"}


class Compiler:
    """Compiles statements into ``sources``, ``steps`` and ``sinks`` (spec dicts)."""

    def __init__(self, nodes: dict[str, tuple[str, ...] | None] | None = None) -> None:
        self.tables: dict[str, Table] = {}
        self.views: dict[str, Rel] = {}
        #: nodes of the network around the SQL (a YAML network), by name: their columns
        self.nodes = dict(nodes or {})
        self.sources: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.sinks: list[dict[str, Any]] = []
        self.settings: dict[str, str] = {}
        self.prefix = "q"
        self._used: dict[str, Rel] = {}

    # ------------------------------------------------------------------ statements
    def script(self, text: str) -> None:
        for statement in parse(text):
            self.statement(statement)

    def statement(self, s: exp.Expression) -> None:
        if isinstance(s, exp.Create) and str(s.args.get("kind", "")).upper() == "TABLE":
            self.create_table(s)
        elif isinstance(s, exp.Create) and str(s.args.get("kind", "")).upper() == "VIEW":
            name = s.this.name
            self.prefix = name
            self.views[name] = self.query(s.expression)
        elif isinstance(s, exp.Insert):
            self.insert(s)
        elif isinstance(s, exp.Set):
            for item in s.expressions:
                eq = item.this
                if not isinstance(eq, exp.EQ):
                    raise SpecError(f"sql: SET: expected SET 'key' = 'value', got {render(s)}")
                self.settings[eq.this.name] = eq.expression.name
        elif isinstance(s, exp.Select | exp.Union):
            raise SpecError("sql: a SELECT without INSERT INTO: expected INSERT INTO <table> SELECT …")
        else:
            raise SpecError(f"sql: {render(s).split('(')[0][:40]}: not supported; expected CREATE TABLE, CREATE VIEW, SET or INSERT INTO")

    def create_table(self, s: exp.Create) -> None:
        schema = s.this if isinstance(s.this, exp.Schema) else None
        name = (schema.this if schema else s.this).name
        clause = f"CREATE TABLE {name}"
        cols, types, delays = [], [], {}
        for item in schema.expressions if schema else []:
            if isinstance(item, exp.ColumnDef):
                cols.append(item.name)
                types.append(item.args["kind"].sql(dialect="spark") if item.args.get("kind") else "STRING")
            elif isinstance(item, exp.WatermarkColumnConstraint):
                expr = item.expression
                delay = 0
                if isinstance(expr, exp.Sub):
                    delay, expr = _duration(expr.expression, f"{clause}: WATERMARK"), expr.this
                if not isinstance(expr, exp.Column) or expr.name != item.this.name:
                    raise SpecError(f"sql: {clause}: WATERMARK FOR {item.this.name}: expected AS {item.this.name} [- INTERVAL …]")
                delays[item.this.name] = delay
            else:
                raise SpecError(f"sql: {clause}: {render(item)}: not supported (columns and WATERMARK only)")
        props = s.args.get("properties")
        options: dict[str, str] = {}
        for p in props.expressions if props else []:
            if not isinstance(p, exp.Property):
                raise SpecError(f"sql: {clause}: WITH: expected 'key' = 'value', got {render(p)}")
            options[p.name.lower()] = p.args["value"].name
        connector = options.pop("connector", None)
        if connector is None:
            raise SpecError(f"sql: {clause}: WITH: expected 'connector' = …")
        kind = CONNECTORS.get(connector, connector)
        params: dict[str, Any] = {}
        node: dict[str, Any] = {}
        for key, value in options.items():
            path = key.replace("-", "_").split(".")
            target = node if path[0] in NODE_FIELDS else params
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = value
        self.tables[name] = Table(name, tuple(cols), tuple(types), delays, kind, params, node)

    def insert(self, s: exp.Insert) -> None:
        target = s.this.this if isinstance(s.this, exp.Schema) else s.this
        name = target.name
        table = self.tables.get(name)
        if table is None:
            raise SpecError(f"sql: INSERT INTO {name}: unknown table; expected one made by CREATE TABLE")
        if name in self._used:
            raise SpecError(f"sql: INSERT INTO {name}: the table is also read; a table is a source or a sink")
        self.prefix = name
        rel = self.query(s.expression)
        names = [f.name for f in rel.fields]
        if table.columns:
            if len(table.columns) != len(names):
                raise SpecError(
                    f"sql: INSERT INTO {name}: the query has {len(names)} columns ({', '.join(names)}), "
                    f"the table declares {len(table.columns)} ({', '.join(table.columns)})"
                )
            rel = replace(rel, fields=tuple(replace(f, name=n) for f, n in zip(rel.fields, table.columns, strict=True)))
        rel = self.materialize(rel)
        self.sinks.append({"name": name, "input": rel.node, table.kind: table.params, **table.node})

    # ------------------------------------------------------------------ nodes
    def step(self, what: str, kind: str, params: Any, input: str | None = None) -> str:
        taken = {s["name"] for s in (*self.sources, *self.steps)} | set(self.tables) | set(self.nodes)
        base = f"{self.prefix}_{what}"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        self.steps.append({"name": name, **({"input": input} if input else {}), kind: params})
        return name

    def read(self, name: str, qual: str) -> Rel:
        """A table, view or network node by name, its fields qualified by ``qual``."""
        if name in self.views:
            return self.views[name].requalify(qual)
        if name in self._used:
            return self._used[name].requalify(qual)
        table = self.tables.get(name)
        if table is not None:
            if any(s["name"] == name for s in self.sinks):
                raise SpecError(f"sql: FROM {name}: the table is inserted into; a table is a source or a sink")
            if table.kind == "files" and table.columns and "schema" not in table.params:
                table.params["schema"] = ", ".join(f"{c} {t}" for c, t in zip(table.columns, table.types, strict=True))
            self.sources.append({"name": name, table.kind: table.params, **table.node})
            rel = self._source_rel(table)
        elif name in self.nodes:
            columns = self.nodes[name]
            if columns is None:
                raise SpecError(f"sql: FROM {name}: cannot tell the columns of '{name}'; read it through a select step")
            # window_start / window_end of a window step's rows are its windows' bounds
            rel = Rel(name, columns, tuple(Field(c, frozenset(), col(c), role=c if c in ("window_start", "window_end") else None)
                                           for c in columns))
        else:
            known = sorted({*self.tables, *self.views, *self.nodes})
            raise SpecError(f"sql: unknown table '{name}' in FROM; expected one of {', '.join(known) or '(none)'}")
        self._used[name] = rel
        return rel.requalify(qual)

    def _source_rel(self, table: Table) -> Rel:
        """The source's rows, seen through the declared columns."""
        kind = SOURCES.get(table.kind) if table.kind in SOURCES else None
        params = _params_for(table) if kind is not None else None
        real = kind.columns(params) if kind is not None and params is not None else None
        declared = table.columns or real
        if declared is None:
            raise SpecError(f"sql: CREATE TABLE {table.name}: expected its columns, e.g. (id BIGINT, ts TIMESTAMP(3))")
        if real is not None:
            missing = [c for c in declared if c not in real]
            if missing:
                raise SpecError(
                    f"sql: CREATE TABLE {table.name}: column '{missing[0]}' is not in the {table.kind} source; "
                    f"it has {', '.join(real)}"
                )
        # the query sees the declared columns; the node has the real ones (a join names its
        # output after them), and a select narrows them where a query's columns must be exact
        fields = tuple(Field(c, frozenset(), col(c), table.delays.get(c)) for c in declared)
        return Rel(table.name, tuple(real or declared), fields)

    # ------------------------------------------------------------------ queries
    def query(self, q: exp.Expression) -> Rel:
        while isinstance(q, exp.Subquery):
            q = q.this
        if isinstance(q, exp.Union):
            return self.union(q)
        if not isinstance(q, exp.Select):
            raise SpecError(f"sql: expected a SELECT query, got {render(q)[:60]}")
        self._refuse(q)
        ctes = q.args.get("with_") or q.args.get("with")  # the key's name depends on sqlglot's version
        for cte in (ctes.expressions if ctes else []):
            self.views[cte.alias] = self.query(cte.this)
        rel, where = self.from_(q)
        if rel.rank is not None:
            rel, where = self.top_k(rel, where)
        if where:
            rel = self.filter(rel, where, "WHERE")
        return self.select(rel, q)

    def _refuse(self, q: exp.Select) -> None:
        if q.args.get("order"):
            raise SpecError("sql: ORDER BY without ROW_NUMBER() is not supported in a streaming query")
        for arg, clause in (("limit", "LIMIT"), ("offset", "OFFSET"), ("qualify", "QUALIFY"), ("windows", "WINDOW")):
            if q.args.get(arg):
                raise SpecError(f"sql: {clause} is not supported in a streaming query")
        if q.args.get("distinct") and q.args["distinct"].args.get("on"):
            raise SpecError("sql: DISTINCT ON is not supported; expected SELECT DISTINCT or GROUP BY")

    def union(self, q: exp.Union) -> Rel:
        if not isinstance(q, exp.Union) or q.args.get("distinct"):
            raise SpecError("sql: UNION without ALL is not supported (it would keep every row to drop duplicates); expected UNION ALL")
        parts: list[Rel] = []

        def collect(e: exp.Expression) -> None:
            if isinstance(e, exp.Union) and not e.args.get("distinct"):
                collect(e.left)
                collect(e.right)
            else:
                parts.append(self.materialize(self.query(e)))

        collect(q)
        first = parts[0]
        for other in parts[1:]:
            if len(other.columns) != len(first.columns):
                raise SpecError(f"sql: UNION ALL: the queries have {len(first.columns)} and {len(other.columns)} columns")
        parts = [p if p.columns == first.columns else self.materialize(replace(p, fields=tuple(
            replace(f, name=n) for f, n in zip(p.fields, first.columns, strict=True)))) for p in parts]
        node = self.step("union", "union", [p.node for p in parts])
        return Rel(node, first.columns, tuple(Field(c, frozenset(), col(c)) for c in first.columns))

    # FROM, joins and the WHERE conjuncts that go with them
    def from_(self, q: exp.Select) -> tuple[Rel, list[exp.Expression]]:
        src = q.args.get("from_") or q.args.get("from")
        if src is None:
            raise SpecError("sql: a SELECT without FROM is not supported; expected FROM <table>")
        where = _conjuncts(q.args["where"].this) if q.args.get("where") else []
        first = len(self.steps)
        rel = self.from_item(src.this)
        joins = q.args.get("joins") or []
        if len(joins) > 1:
            raise SpecError("sql: FROM: joins of more than two tables are not supported; join two, then join the result in an outer query")
        for j in joins:
            side, kind = (j.args.get("side") or "").upper(), (j.args.get("kind") or "").upper()
            if side or kind not in ("", "INNER", "CROSS"):
                raise SpecError(f"sql: {' '.join(x for x in (side, kind) if x)} JOIN is not supported; expected an inner join")
            if j.args.get("using"):
                raise SpecError("sql: JOIN … USING is not supported; expected JOIN … ON a.k = b.k")
            middle = len(self.steps)
            right = self.from_item(j.this)
            conds = _conjuncts(j.args["on"]) + where if j.args.get("on") else where
            if rel.pending or right.pending:
                # the steps compiled for the per-window maximum's side, which the rewrite drops
                made = self.steps[first:middle] if rel.pending else self.steps[middle:]
                rel, where = self.top_rows_join(rel, right, conds, [s["name"] for s in made])
            else:
                rel, where = self.join(rel, right, conds)
        self._refuse_pending(rel)
        return rel, where

    def from_item(self, item: exp.Expression) -> Rel:
        alias = item.alias_or_name if isinstance(item, exp.Table | exp.Subquery) else ""
        if isinstance(item, exp.Subquery):
            rel = self.query(item.this)
            return rel.requalify(item.alias) if item.alias else rel.requalify("")
        if isinstance(item, exp.Table) and isinstance(item.this, exp.Anonymous) and str(item.this.this).upper() == "TABLE":
            (call,) = item.this.expressions or [None]
            rel = self.window_table(call)
            return rel.requalify(item.alias) if item.alias else rel
        if isinstance(item, exp.Table) and isinstance(item.this, exp.Identifier):
            return self.read(item.name, alias or item.name)
        raise SpecError(f"sql: FROM {render(item)[:60]}: expected a table, a subquery or TABLE(TUMBLE|HOP|CUMULATE|SESSION(…))")

    def window_table(self, call: exp.Expression | None) -> Rel:
        name = _fn(call) if call is not None else ""
        if name not in ("TUMBLE", "HOP", "CUMULATE", "SESSION"):
            raise SpecError(f"sql: FROM TABLE({name or '…'}(…)): expected a window function TUMBLE, HOP, CUMULATE or SESSION")
        args = [a.expression if isinstance(a, exp.Kwarg) else a for a in call.expressions]
        want = {"TUMBLE": 3, "HOP": 4, "CUMULATE": 4, "SESSION": 3}[name]
        if len(args) != want:
            raise SpecError(f"sql: {name}: expected {want} arguments (TABLE t, DESCRIPTOR(col), interval{'s' if want > 3 else ''}), got {len(args)}")
        table, descriptor, *intervals = args
        keys: list[exp.Expression] = []
        if isinstance(table, exp.Anonymous) and table.this == "PARTITIONED":
            table, *keys = table.expressions
        if name != "SESSION" and keys:
            raise SpecError(f"sql: {name}: PARTITION BY is for SESSION only")
        if not isinstance(table, exp.Table):
            raise SpecError(f"sql: {name}: expected TABLE <name> as its first argument")
        if _fn(descriptor) != "DESCRIPTOR" or len(descriptor.expressions) != 1:
            raise SpecError(f"sql: {name}: expected DESCRIPTOR(<time column>) as its second argument")
        rel = self.read(table.name, table.alias_or_name)
        self._refuse_pending(rel)
        if rel.window or rel.rank:
            raise SpecError(f"sql: {name}: TABLE {table.name} is itself windowed or ranked; expected a plain table")
        if not all(f.column for f in rel.fields):
            rel = self.materialize(rel)
        time = self.resolve_field(rel, descriptor.expressions[0], f"{name}: DESCRIPTOR")
        if time.column is None:
            raise SpecError(f"sql: {name}: DESCRIPTOR: expected a column")
        sizes = [_duration(i, name) for i in intervals]
        size, slide = (sizes[1], sizes[0]) if name in ("HOP", "CUMULATE") else (sizes[0], None)
        if name in ("HOP", "CUMULATE") and (size % slide):
            what = "slide" if name == "HOP" else "step"
            raise SpecError(f"sql: {name}: the {what} ({slide} ms) must divide the size ({size} ms)")
        key_cols = tuple(self._column(rel, k, "SESSION: PARTITION BY") for k in keys)
        window = (Window(name, time.column, size, None, time.delay or 0, key_cols, step=slide) if name == "CUMULATE"
                  else Window(name, time.column, size, slide, time.delay or 0, key_cols))
        quals = rel.fields[0].quals if rel.fields else frozenset()
        bounds = []
        for role in ("window_start", "window_end"):
            sql = None
            if name == "TUMBLE":
                ms = f"floor(unix_millis({render(time.sql)}) / {size}) * {size}"
                ms = ms if role == "window_start" else f"{ms} + {size}"
                sql = sqlglot.parse_one(f"timestamp_millis(CAST({ms} AS BIGINT))", read="spark")
            bounds.append(Field(role, quals, sql, time.delay, role))
        return replace(rel, fields=(*rel.fields, *bounds), window=window, ahead=size if name == "TUMBLE" else 0,
                       window_size=size if name == "TUMBLE" else None)

    def join(self, left: Rel, right: Rel, conds: list[exp.Expression]) -> tuple[Rel, list[exp.Expression]]:
        if left.rank or right.rank:
            raise SpecError("sql: JOIN of a ROW_NUMBER() query: expected its WHERE rn <= k in the query that defines it")
        keys: list[tuple[Field, Field]] = []
        interval: tuple[exp.Expression, exp.Expression, exp.Expression] | None = None
        bounds: list[exp.Expression] = []  # the ON conditions equating window bounds
        pushed: dict[str, list[exp.Expression]] = {"l": [], "r": []}
        rest: list[exp.Expression] = []
        for c in conds:
            sides = self._sides(left, right, c)
            if sides <= {"l"} or sides <= {"r"}:
                side = next(iter(sides), "l")
                table = left if side == "l" else right
                roles = {self._field_of(table, x).role for x in c.find_all(exp.Column)}
                if roles & {"window_start", "window_end"} and table.window is not None:
                    raise SpecError(f"sql: WHERE {render(c)}: a condition on a window's bounds before GROUP BY is not supported")
                pushed[side].append(c)
                continue
            if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column):
                a, b = c.this, c.expression
                if self._side(left, right, a) == "r":
                    a, b = b, a
                fa, fb = self._field_of(left, a), self._field_of(right, b)
                if fa.role in ("window_start", "window_end") or fb.role in ("window_start", "window_end"):
                    if fa.role != fb.role:
                        raise SpecError(f"sql: JOIN ON {render(c)}: expected window_start = window_start and window_end = window_end")
                    bounds.append(c)
                else:
                    keys.append((fa, fb))
                continue
            if isinstance(c, exp.Between) and interval is None:
                # a point of one table between two expressions over the other's columns
                point, low, high = c.this, c.args["low"], c.args["high"]
                ps, ls, hs = (self._sides(left, right, x) for x in (point, low, high))
                if len(ps) == len(ls) == len(hs) == 1 and ls == hs != ps:
                    holder, other = (left, right) if ls == {"l"} else (right, left)
                    if holder.windowed is not None:
                        # intervals of grouped rows would start behind their step's watermark:
                        # the other table's rows are the intervals instead
                        if other.windowed is not None:
                            raise SpecError(f"sql: JOIN … {render(c)}: an interval join of two grouped queries (GROUP BY … "
                                            "window_start, window_end) is not supported; expected a join ON their window bounds")
                        flipped = self._flip_interval(holder, c)
                        return self.join(left, right, [flipped if x is c else x for x in conds])
                    if ls == {"r"}:  # the interval is on the left in Eddyline's join: swap sides
                        return self.join(right, left, conds)
                    interval = (low, high, point)
                    continue
            rest.append(c)
        if not keys:
            raise SpecError("sql: JOIN: expected an equality between a column of each table (an equi-join), e.g. ON a.id = b.id")
        left = self.filter(left, pushed["l"], "WHERE") if pushed["l"] else left
        right = self.filter(right, pushed["r"], "WHERE") if pushed["r"] else right
        params: dict[str, Any] = {}
        delay = 0
        windowed: Window | None = None
        tables = bool(left.window or right.window)  # a join of window tables (not grouped rows)
        if tables:
            lw, rw = left.window, right.window
            if not (lw and rw and lw.kind == rw.kind == "TUMBLE" and lw.size == rw.size
                    and self._bound_roles(left, right, bounds) == {"window_start", "window_end"}):
                raise SpecError(
                    "sql: JOIN of window tables: expected two TUMBLE tables of one size, joined ON their keys "
                    "AND a.window_start = b.window_start AND a.window_end = b.window_end"
                )
            params = {"kind": "window", "size": lw.size, "left_time": lw.time, "right_time": rw.time}
            delay = max(lw.delay, rw.delay)
            left = replace(left, fields=tuple(f for f in left.fields if not f.role), window=None)
            right = replace(right, fields=tuple(f for f in right.fields if not f.role), window=None)
            windowed = replace(lw, delay=delay)
        elif bounds:
            # rows grouped per window on both sides, equal bounds: a window join on their starts
            left, right, params = self._grouped_window_join(left, right, bounds)
            windowed = replace(left.windowed, time=params["left_time"]) if left.windowed else None
        elif interval is None and "table.exec.state.ttl" in self.settings:
            times = [f for f in left.fields if f.delay is not None], [f for f in right.fields if f.delay is not None]
            if not (times[0] and times[1]):
                raise SpecError("sql: JOIN with a state TTL: expected a WATERMARK on both tables (the TTL is in event time)")
            params = {"ttl": self.settings["table.exec.state.ttl"].replace(" ", ""),
                      "left_time": times[0][0].column, "right_time": times[1][0].column}
        # the kernel joins whole rows; columns computed by a query are computed first
        left = left if all(f.column for f in left.fields) else self.materialize(left)
        right = right if all(f.column for f in right.fields) else self.materialize(right)
        end: Field | None = None
        if interval is not None:
            low, high, point = interval
            clause = "JOIN … BETWEEN"
            # bounds and point computed where they are not columns (a select before the join)
            delay = max((self._field_of(rel, x).delay or 0 for rel, e in ((left, low), (right, point))
                         for x in e.find_all(exp.Column)), default=0)
            end = self._field_of(left, high) if isinstance(high, exp.Column) else None
            left, (lo, hi) = self._ensure(left, [low, high], clause)
            right, (at,) = self._ensure(right, [point], clause)
            params = {"kind": "interval", "left_time": lo, "left_end": hi, "right_time": at}
        lk = [self._plain(left, a, "JOIN ON") for a, _ in keys]
        rk = [self._plain(right, b, "JOIN ON") for _, b in keys]
        renamed = dict(zip(right.columns, join_right_names(left.columns, right.columns), strict=True))
        out_cols = (*left.columns, *renamed.values(), *(("window_start", "window_end") if params.get("kind") == "window" else ()))
        if delay:
            params["watermark_delay"] = delay
        node = self.step("join", "join", {
            "left": left.node, "right": right.node,
            "left_key": lk[0] if len(lk) == 1 else lk, "right_key": rk[0] if len(rk) == 1 else rk, **params,
        })
        fields = [replace(f, sql=col(f.column)) for f in left.fields]
        fields += [replace(f, sql=col(renamed[f.column])) for f in right.fields]
        out = Rel(node, out_cols, tuple(fields), windowed=windowed)
        if params.get("kind") == "window":
            out = replace(out, window_size=params["size"])
        if tables:
            # two window tables: their bounds are the join's
            quals = frozenset().union(*(f.quals for f in (*left.fields, *right.fields)))
            extra = (Field("window_start", quals, col("window_start"), delay, "window_start"),
                     Field("window_end", quals, col("window_end"), delay, "window_end"))
            out = replace(out, fields=(*out.fields, *extra))
        if interval is not None:
            out = replace(out, interval_keys=tuple(lk))
            if end is not None and end.column is not None:
                out = replace(out, fields=tuple(
                    replace(f, role="interval_end") if f.column == end.column and f.quals == end.quals else f for f in out.fields))
        return out, rest

    def _flip_interval(self, rel: Rel, c: exp.Between) -> exp.Between:
        """``p BETWEEN h - INTERVAL w AND h`` with ``h`` over the rows of a grouped query ``rel``
        (``window_start AND window_end`` of a fixed-size window: ``w`` its size) as ``h BETWEEN p
        AND p + INTERVAL w``: the same pairs, with the other table's rows as the intervals.

        Grouped rows leave their step when their window ends, behind that step's watermark by up
        to a window, so as intervals (which the join takes as late once the watermark passed
        their start) they could be dropped, and the points they need evicted before they come,
        as at the end of the input. As points at ``h`` they are never behind the watermark the
        join inherits, and the other table's rows wait ``w`` after their own time for them."""
        point, low, high = c.this, c.args["low"], c.args["high"]
        width: exp.Expression | None = None
        if isinstance(low, exp.Sub) and low.this == high and isinstance(low.expression, exp.Interval):
            _duration(low.expression, f"JOIN … {render(c)}")
            width = low.expression
        elif isinstance(low, exp.Column) and isinstance(high, exp.Column) and rel.windowed is not None \
                and rel.windowed.kind in ("TUMBLE", "HOP") and (self._field_of(rel, low).role, self._field_of(rel, high).role) \
                == ("window_start", "window_end"):
            size = rel.windowed.size
            width = exp.Interval(this=exp.Literal.string(str(size // 1000 if size % 1000 == 0 else size)),
                                 unit=exp.var("SECOND" if size % 1000 == 0 else "MILLISECOND"))
        if width is None:
            raise SpecError(
                f"sql: JOIN … {render(c)}: an interval over the rows of a grouped query (GROUP BY … window_start, "
                "window_end), which come out only as their window ends, is supported as BETWEEN t - INTERVAL … AND t "
                "(e.g. w.window_end - INTERVAL '10' SECOND AND w.window_end) or window_start AND window_end"
            )
        return exp.Between(this=high.copy(), low=point.copy(), high=exp.Add(this=point.copy(), expression=width.copy()))

    def _bound_roles(self, left: Rel, right: Rel, conds: list[exp.Expression]) -> set[str | None]:
        """The bounds (window_start, window_end) that ON conditions equating window bounds equate."""
        return {f.role for c in conds for x in c.find_all(exp.Column) for f in self._lookup(left, x) + self._lookup(right, x)}

    def _grouped_window_join(self, left: Rel, right: Rel, bounds: list[exp.Expression]) -> tuple[Rel, Rel, dict[str, Any]]:
        """Rows grouped per window on both sides (``GROUP BY k, window_start, window_end``), joined
        ON their keys and equal bounds: a window join whose time is each side's window_start (a row
        at its window's start lies in that window), the sides' bound columns renamed out of the
        way of the join's own window_start / window_end. A grouped row leaves its step only once
        its window is complete (or, a distinct, as it arrives), never behind its step's watermark,
        so the join drops none of them as late and closes a window after both sides filled it."""
        lw, rw = left.windowed, right.windowed
        on = " AND ".join(render(c) for c in bounds)
        if not (lw and rw):
            raise SpecError(
                f"sql: JOIN ON {on}: expected both tables grouped per window (GROUP BY …, window_start, window_end) "
                "or both window tables TABLE(TUMBLE(…)); a table of each is not supported"
            )
        if not (lw.kind == rw.kind == "TUMBLE" and lw.size == rw.size):
            raise SpecError(
                f"sql: JOIN ON {on}: expected two TUMBLE windows of one size; got {_window_text(lw)} and {_window_text(rw)}"
            )
        if self._bound_roles(left, right, bounds) != {"window_start", "window_end"}:
            raise SpecError(
                f"sql: JOIN ON {on}: expected both bounds equal, a.window_start = b.window_start AND a.window_end = b.window_end"
            )
        sides, times = [], []
        for rel, tag in ((left, "_l_"), (right, "_r_")):
            named = tuple(replace(f, name=f"{tag}{f.name}") if f.name in ("window_start", "window_end") else f for f in rel.fields)
            done = self.materialize(replace(rel, fields=named))
            times.append(next(d.name for d in done.fields if d.role == "window_start"))
            sides.append(replace(done, fields=tuple(replace(d, name=f.name) for d, f in zip(done.fields, rel.fields, strict=True))))
        return sides[0], sides[1], {"kind": "window", "size": lw.size, "left_time": times[0], "right_time": times[1]}

    def _sides(self, left: Rel, right: Rel, e: exp.Expression) -> set[str]:
        """The tables ("l", "r") whose columns an expression reads."""
        return {self._side(left, right, x) for x in e.find_all(exp.Column)}

    def _side(self, left: Rel, right: Rel, c: exp.Column) -> str:
        in_l = self._lookup(left, c)
        in_r = self._lookup(right, c)
        if in_l and in_r:
            raise SpecError(f"sql: column '{c.sql()}' is ambiguous: both tables have it; qualify it")
        if not in_l and not in_r:
            raise SpecError(f"sql: unknown column '{c.sql()}' in JOIN; expected one of {self._names(left, right)}")
        return "l" if in_l else "r"

    # the pieces of a query
    def _lookup(self, rel: Rel, c: exp.Column) -> list[Field]:
        qual = c.table
        return [f for f in rel.fields if f.name.lower() == c.name.lower() and (not qual or qual in f.quals)]

    def _field_of(self, rel: Rel, c: exp.Column) -> Field:
        found = self._lookup(rel, c)
        if len(found) > 1:
            raise SpecError(f"sql: column '{c.sql()}' is ambiguous; qualify it")
        if not found:
            raise SpecError(f"sql: unknown column '{c.sql()}'; expected one of {self._names(rel)}")
        return found[0]

    def _names(self, *rels: Rel) -> str:
        return ", ".join(dict.fromkeys(f"{min(f.quals)}.{f.name}" if f.quals and min(f.quals) else f.name
                                       for r in rels for f in r.fields))

    def resolve_field(self, rel: Rel, c: exp.Expression, clause: str) -> Field:
        if not isinstance(c, exp.Column):
            raise SpecError(f"sql: {clause}: expected a column, got {render(c)}")
        try:
            return self._field_of(rel, c)
        except SpecError as e:
            raise SpecError(str(e.problems[0]).replace("sql: ", f"sql: {clause}: ", 1)) from None

    def resolve(self, rel: Rel, e: exp.Expression, clause: str) -> exp.Expression:
        """``e`` over the rel's node columns (each column replaced by what it is computed by)."""

        def sub(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
                f = self.resolve_field(rel, node, clause)
                if f.sql is None:
                    raise SpecError(f"sql: {clause}: {f.name} of a {rel.window.kind if rel.window else ''} window is known only "
                                    "after GROUP BY window_start, window_end")
                return f.sql.copy()
            return node

        return e.copy().transform(sub)

    def _column(self, rel: Rel, e: exp.Expression, clause: str) -> str:
        name = self.resolve(rel, e, clause)
        if not isinstance(name, exp.Column):
            raise SpecError(f"sql: {clause}: expected a column, got {render(e)}")
        return name.name

    def _plain(self, rel: Rel, f: Field, clause: str) -> str:
        if f.column is None:
            raise SpecError(f"sql: {clause}: expected a column, got {render(f.sql) if f.sql else f.name}")
        return f.column

    def filter(self, rel: Rel, conds: list[exp.Expression], clause: str) -> Rel:
        for c in conds:
            if rel.rank is not None and any(x.name == rel.rank.name for x in c.find_all(exp.Column)):
                raise SpecError(f"sql: WHERE {render(c)}: expected {rel.rank.name} <= k (a top-k) in the enclosing query")
            if c.find(exp.AggFunc):
                raise SpecError(f"sql: {clause} {render(c)}: an aggregate in WHERE; expected HAVING")
        text = render(self.resolve(rel, _and(conds), clause))
        node = self.step("filter", "filter", text, rel.node)
        return replace(rel, node=node)

    def materialize(self, rel: Rel) -> Rel:
        """A select step computing the rel's fields (none when its node has them as they are)."""
        if rel.rank is not None:
            raise SpecError(f"sql: ROW_NUMBER() AS {rel.rank.name}: expected WHERE {rel.rank.name} <= k in the enclosing query")
        self._refuse_pending(rel)
        if rel.direct():
            return rel
        items = []
        for f in rel.fields:
            if f.sql is None:
                raise SpecError(f"sql: {f.name} of a HOP or SESSION window is known only after GROUP BY window_start, window_end")
            items.append(f.name if f.column == f.name else f"{render(f.sql)} AS {exp.to_identifier(f.name).sql(dialect='spark')}")
        dupes = [n for n in dict.fromkeys(f.name for f in rel.fields) if sum(f.name == n for f in rel.fields) > 1]
        if dupes:
            raise SpecError(f"sql: SELECT: the column name '{dupes[0]}' is used twice; name them apart with AS")
        node = self.step("select", "select", items, rel.node)
        fields = tuple(replace(f, sql=col(f.name)) for f in rel.fields)
        return replace(rel, node=node, columns=tuple(f.name for f in rel.fields), fields=fields)

    def _ensure(self, rel: Rel, exprs: list[exp.Expression], clause: str) -> tuple[Rel, list[str]]:
        """Node columns holding ``exprs`` (a select computes those that are not columns)."""
        return self._ensure_sql(rel, [self.resolve(rel, e, clause) for e in exprs])

    def _ensure_sql(self, rel: Rel, resolved: list[exp.Expression]) -> tuple[Rel, list[str]]:
        """Node columns holding expressions over the node's columns: a select step keeps every
        column and adds the computed ones (named as the field computing them, if one does)."""
        if all(isinstance(r, exp.Column) for r in resolved):
            return rel, [r.name for r in resolved]
        extra: dict[str, exp.Expression] = {}
        names = []
        for i, r in enumerate(resolved):
            if isinstance(r, exp.Column):
                names.append(r.name)
                continue
            same = next((f.name for f in rel.fields if f.sql == r and f.name not in rel.columns), None)
            name = same if same and same not in extra else f"_e{i}"
            extra[name] = r
            names.append(name)
        keep = tuple(Field(c, frozenset(), col(c)) for c in rel.columns)
        done = self.materialize(replace(rel, fields=(*keep, *(Field(n, frozenset(), e) for n, e in extra.items())), rank=None))
        computed = {render(e): n for n, e in extra.items()}
        fields = tuple(replace(f, sql=col(computed[render(f.sql)])) if f.sql is not None and render(f.sql) in computed else f
                       for f in rel.fields)
        return replace(rel, node=done.node, columns=done.columns, fields=fields), names

    # ROW_NUMBER() … WHERE rn <= k
    def top_k(self, rel: Rel, where: list[exp.Expression]) -> tuple[Rel, list[exp.Expression]]:
        rank = rel.rank
        assert rank is not None
        k, rest = None, []
        for c in where:
            bound = self._rank_bound(c, rank.name)
            if bound is None:
                rest.append(c)
            elif k is not None:
                raise SpecError(f"sql: WHERE {render(c)}: {rank.name} is bounded twice")
            else:
                k = bound
        if k is None:
            raise SpecError(f"sql: ROW_NUMBER() AS {rank.name}: expected WHERE {rank.name} <= k in the enclosing query")
        rel = replace(rel, rank=None)
        rel, cols = self._ensure_sql(rel, [*rank.partition, *(o.this for o in rank.order)])
        part_cols, order_cols = cols[: len(rank.partition)], cols[len(rank.partition):]
        ends = [f for f in rel.fields if f.role == "window_end" and f.sql is not None]
        if any(r in ("window_start", "window_end") for r in rank.roles) and ends:
            rel, (end,) = self._ensure_sql(rel, [ends[0].sql])
            time, delay = end, rel.ahead + (ends[0].delay or 0)
        elif rel.interval_keys and set(rel.interval_keys) <= set(part_cols) and (
                ends := [f for f in rel.fields if f.role == "interval_end"]):
            time, delay = ends[0].column, 0
        else:
            raise SpecError(
                "sql: ROW_NUMBER() OVER (PARTITION BY …): a streaming top-k needs partitions that end in event time; "
                "expected PARTITION BY window_start, window_end (a window table) or the key of an interval join"
            )
        order = [f"{c} {'DESC' if o.args.get('desc') else 'ASC'}" for c, o in zip(order_cols, rank.order, strict=True)]
        params: dict[str, Any] = {"partition_by": part_cols[0] if len(part_cols) == 1 else part_cols,
                                  "order_by": order, "k": k, "time": time, "with_ties": rank.with_ties}
        if delay:
            params["watermark_delay"] = delay
        node = self.step("top_k", "top_k", params, rel.node)
        return replace(rel, node=node, columns=(*rel.columns, "rank")), rest

    def _rank_bound(self, c: exp.Expression, name: str) -> int | None:
        ops = {exp.LTE: 0, exp.LT: -1, exp.EQ: 0}
        bounded = type(c) in ops and isinstance(c.this, exp.Column) and c.this.name == name
        if bounded and isinstance(c.expression, exp.Literal) and c.expression.is_int:
            k = int(c.expression.name) + ops[type(c)]
            if isinstance(c, exp.EQ) and k != 1:
                raise SpecError(f"sql: WHERE {render(c)}: expected {name} <= k or {name} = 1")
            if k < 1:
                raise SpecError(f"sql: WHERE {render(c)}: keeps no rows")
            return k
        if any(x.name == name for x in c.find_all(exp.Column)):
            raise SpecError(f"sql: WHERE {render(c)}: expected {name} <= k, {name} < k or {name} = 1")
        return None

    # SELECT, GROUP BY, window functions
    def select(self, rel: Rel, q: exp.Select) -> Rel:
        items = list(q.expressions)
        group = list(q.args["group"].expressions) if q.args.get("group") else []
        distinct = bool(q.args.get("distinct"))
        aggs = [a for it in items for a in it.find_all(exp.AggFunc) if not a.find_ancestor(exp.Window)]
        if q.args.get("having") and not (group or aggs):
            raise SpecError("sql: HAVING without GROUP BY or aggregates")
        if rel.window and not (group or distinct) and rel.window.kind != "TUMBLE":
            raise SpecError(f"sql: FROM TABLE({rel.window.kind}(…)): expected GROUP BY window_start, window_end (rows of a "
                            f"{rel.window.kind} window are known only per window)")
        if distinct:
            if group or aggs:
                raise SpecError("sql: SELECT DISTINCT with GROUP BY or aggregates is not supported")
            group = [it.this if isinstance(it, exp.Alias) else it for it in items]
        if group or aggs:
            return self.group_by(rel, q, items, group)
        ranks = [it for it in items if isinstance(it.unalias(), exp.Window) and isinstance(it.unalias().this, exp.RowNumber | exp.Rank)]
        overs = [it for it in items if isinstance(it.unalias(), exp.Window) and it not in ranks]
        if overs:
            rel, items = self.over(rel, items, overs)
        rank = None
        if ranks:
            if len(ranks) > 1:
                raise SpecError("sql: more than one ROW_NUMBER() in a SELECT")
            w = ranks[0].unalias()
            if not isinstance(ranks[0], exp.Alias):
                raise SpecError("sql: ROW_NUMBER() OVER (…): expected a name (AS rn) to bound in the enclosing query")
            if not w.args.get("partition_by") or not w.args.get("order"):
                raise SpecError("sql: ROW_NUMBER() OVER (…): expected PARTITION BY … ORDER BY …")
            clause = "ROW_NUMBER() OVER"
            partition = list(w.args["partition_by"])
            roles = tuple(self._field_of(rel, p).role if isinstance(p, exp.Column) else None for p in partition)
            order = []
            for o in w.args["order"].expressions:
                o = o.copy()
                o.set("this", self.resolve(rel, o.this, f"{clause} (ORDER BY)"))
                order.append(o)
            rank = Rank(ranks[0].alias, tuple(self.resolve(rel, p, f"{clause} (PARTITION BY)") for p in partition), roles,
                        tuple(order), isinstance(w.this, exp.Rank))
            items = [it for it in items if it is not ranks[0]]
        fields = self.project(rel, items)
        return replace(rel, fields=fields, rank=rank, window=None if rank is None and not rel.window else rel.window)

    def project(self, rel: Rel, items: list[exp.Expression]) -> tuple[Field, ...]:
        out: list[Field] = []
        for i, it in enumerate(items):
            if isinstance(it, exp.Star) or (isinstance(it, exp.Column) and isinstance(it.this, exp.Star)):
                qual = it.table if isinstance(it, exp.Column) else ""
                chosen = [f for f in rel.fields if not qual or qual in f.quals]
                if not chosen:
                    raise SpecError(f"sql: SELECT {qual}.*: unknown table '{qual}'")
                out += [f for f in chosen if f.sql is not None or rel.window is not None]
                continue
            inner = it.unalias()
            if isinstance(inner, exp.Window):
                raise SpecError(f"sql: SELECT {render(it)}: expected ROW_NUMBER() or an aggregate over ROWS n PRECEDING")
            name = it.alias if isinstance(it, exp.Alias) else inner.name if isinstance(inner, exp.Column) else f"_c{i}"
            sql = self.resolve(rel, inner, "SELECT")
            source = self._field_of(rel, inner) if isinstance(inner, exp.Column) else None
            out.append(Field(name, source.quals if source else frozenset(), sql,
                             source.delay if source else None, source.role if source else None))
        return tuple(out)

    def over(self, rel: Rel, items: list[exp.Expression], overs: list[exp.Expression]) -> tuple[Rel, list[exp.Expression]]:
        """``AGG(x) OVER (PARTITION BY k ORDER BY t ROWS BETWEEN n PRECEDING AND CURRENT ROW)``."""
        windows = {render(o.unalias()).split(" OVER ", 1)[-1] for o in overs}
        if len(windows) > 1:
            raise SpecError("sql: OVER: all aggregates over rows of one SELECT need the same window")
        w = overs[0].unalias()
        spec = w.args.get("spec")
        order = w.args["order"].expressions if w.args.get("order") else []
        if not w.args.get("partition_by") or len(order) != 1 or spec is None or str(spec.args.get("kind", "")).upper() != "ROWS":
            raise SpecError("sql: OVER: expected (PARTITION BY k ORDER BY time ROWS BETWEEN n PRECEDING AND CURRENT ROW)")
        start, end = spec.args.get("start"), spec.args.get("end")
        if str(spec.args.get("start_side", "")).upper() != "PRECEDING" or not (isinstance(start, exp.Literal) and start.is_int) \
                or str(end).upper() != "CURRENT ROW":
            raise SpecError("sql: OVER: expected ROWS BETWEEN n PRECEDING AND CURRENT ROW")
        # the kernel orders rows of equal time by their content: it sees the query's columns only
        rel = self.materialize(rel)
        time_field = self.resolve_field(rel, order[0].this, "OVER (ORDER BY)")
        rel, keys = self._ensure(rel, list(w.args["partition_by"]), "OVER (PARTITION BY)")
        aggs: dict[str, str] = {}
        new_items = []
        for it in items:
            if it in overs:
                name = it.alias if isinstance(it, exp.Alias) else f"_c{items.index(it)}"
                if name in rel.columns:
                    raise SpecError(f"sql: OVER: the name '{name}' is a column already; expected another AS name")
                aggs[name] = self._agg_text(rel, it.unalias().this, "OVER")
                new_items.append(exp.alias_(exp.Column(this=exp.to_identifier(name), table=exp.to_identifier("__over")), name))
            else:
                new_items.append(it)
        params = {"key": keys[0] if len(keys) == 1 else keys, "time": self._plain(rel, time_field, "OVER (ORDER BY)"),
                  "preceding": int(start.name), "aggregates": aggs}
        if time_field.delay:
            params["watermark_delay"] = time_field.delay
        node = self.step("over", "over_aggregate", params, rel.node)
        fields = (*rel.fields, *(Field(n, frozenset({"__over"}), col(n)) for n in aggs))
        return replace(rel, node=node, columns=(*rel.columns, *aggs), fields=fields), new_items

    def _agg_text(self, rel: Rel, a: exp.Expression, clause: str) -> str:
        funcs = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}
        func = funcs.get(type(a))
        if func is None:
            raise SpecError(f"sql: {clause}: {render(a)}: expected count, sum, min, max or avg")
        arg = a.this
        if isinstance(arg, exp.Distinct):
            raise SpecError(f"sql: {clause}: {render(a)}: DISTINCT aggregates are not supported")
        if isinstance(arg, exp.Star):
            if func != "count":
                raise SpecError(f"sql: {clause}: {render(a)}: expected a column")
            return "count(*)"
        resolved = self.resolve(rel, arg, clause)
        if not isinstance(resolved, exp.Column):
            raise SpecError(f"sql: {clause}: {render(a)}: expected an aggregate of a column; compute it in a subquery first")
        return f"{func}({resolved.name})"

    def group_by(self, rel: Rel, q: exp.Select, items: list[exp.Expression], group: list[exp.Expression]) -> Rel:
        # the window: a window table's bounds among the keys, or a legacy group window function
        legacy = [g for g in group if _fn(g) in WINDOW_TVFS]
        window = rel.window
        if legacy:
            if len(legacy) > 1 or window:
                raise SpecError("sql: GROUP BY: expected one window")
            window = self._legacy_window(rel, legacy[0])
        keys_in = [g for g in group if g not in legacy]
        key_fields = [self._field_of(rel, g) if isinstance(g, exp.Column) else None for g in keys_in]
        bounds = [f for f in key_fields if f is not None and f.role in ("window_start", "window_end")]
        if rel.window and not bounds:
            raise SpecError("sql: GROUP BY over a window table: expected window_start and window_end among the keys")
        plain = [g for g, f in zip(keys_in, key_fields, strict=True) if f is None or f.role not in ("window_start", "window_end")]
        having = q.args["having"].this if q.args.get("having") else None
        # aggregates → named columns of the step's output
        aggs: dict[str, str] = {}
        named: dict[str, str] = {}

        def take(a: exp.Expression, alias: str | None) -> exp.Expression:
            text = self._agg_text(rel, a, "SELECT")
            name = named.get(text) if alias is None else None
            if name is None:
                name = alias or f"_a{len(aggs)}"
                aggs[name] = text
                named.setdefault(text, name)
            return exp.Column(this=exp.to_identifier(name), table=exp.to_identifier("__agg"))

        new_items = []
        for it in items:
            if isinstance(it, exp.Alias) and isinstance(it.this, exp.AggFunc):
                new_items.append(exp.alias_(take(it.this, it.alias), it.alias))
            else:
                new_items.append(it.transform(lambda n: take(n, None) if isinstance(n, exp.AggFunc) else n))
        having = having.transform(lambda n: take(n, None) if isinstance(n, exp.AggFunc) else n) if having is not None else None
        rel2, key_cols = self._ensure(rel, plain, "GROUP BY")
        key_param: Any = key_cols[0] if len(key_cols) == 1 else key_cols
        roles = {"window_start": "window_start", "window_end": "window_end"}
        extra_fields: list[Field] = []
        if window is not None and aggs:
            params: dict[str, Any] = {"key": key_param} if key_cols else {}
            if window.kind == "SESSION":
                if not set(window.keys) <= set(key_cols):
                    raise SpecError("sql: GROUP BY over a SESSION table: expected its PARTITION BY columns among the keys")
                params.update(time=window.time, gap=window.size, aggregates=aggs)
                kind, roles = "session_window", {"window_start": "session_start", "window_end": "session_end"}
            else:
                w = {"size": window.size, **({"slide": window.slide} if window.slide and window.slide != window.size else {}),
                     **({"step": window.step} if window.step else {})}
                params.update(time=window.time, window=w, aggregates=aggs)
                kind = "window_aggregate"
            if window.delay:
                params["watermark_delay"] = window.delay
            if not params.get("key"):
                params.pop("key", None)
            node = self.step("window" if kind == "window_aggregate" else "session", kind, params, rel2.node)
            columns = (*key_cols, roles["window_start"], roles["window_end"], *aggs)
            size = window.size if window.kind != "SESSION" else None
        elif bounds and aggs:
            # rows grouped per window already (a window aggregate's output), grouped again per window
            return self._per_window(rel, group, key_fields, plain, aggs, new_items, having)
        elif window is not None or bounds:
            # GROUP BY without aggregates over windowed rows: a distinct per window
            if window is not None and window.kind != "TUMBLE" or (window is None and rel.window_size is None):
                raise SpecError("sql: GROUP BY without aggregates over a window: expected a TUMBLE window")
            size = window.size if window is not None else rel.window_size
            assert size is not None
            starts = [f for f in bounds if f.role == "window_start"]
            if not starts:
                raise SpecError("sql: GROUP BY without aggregates over a window: expected window_start among the keys")
            ends = [f for f in rel.fields if f.role == "window_end"]
            rel2, (start_col, end_col) = self._ensure(rel2, [self._ref(starts[0]), self._ref(ends[0])], "GROUP BY")
            dkeys = [*key_cols, start_col]
            params = {"key": dkeys, "time": end_col, "ttl": size}
            delay = rel.ahead + (ends[0].delay or 0)
            if delay:
                params["watermark_delay"] = delay
            node = self.step("distinct", "dedup", params, rel2.node)
            out = replace(rel2, node=node, window=None, rank=None, ahead=0, window_size=size,
                          windowed=window or rel.windowed)
            fields = self.project(out, new_items)
            return replace(out, fields=fields)
        else:
            if not aggs:
                raise SpecError("sql: GROUP BY without aggregates and without a window is not supported (it would keep every key forever)")
            if not key_cols:
                raise SpecError("sql: an aggregate without GROUP BY over an unbounded stream: expected GROUP BY a key or a window")
            params = {"key": key_param, "aggregates": aggs}
            node = self.step("aggregate", "aggregate", params, rel2.node)
            columns, size = (*key_cols, *aggs), None
        # the step's output, seen through the group keys and the aggregates
        fields: list[Field] = []
        for f in key_fields:
            if f is not None and f.role in roles:
                fields.append(replace(f, sql=col(roles[f.role]), delay=None))
        for g, c in zip(plain, key_cols[len(key_cols) - len(plain):], strict=True):
            f = self._field_of(rel, g) if isinstance(g, exp.Column) else None
            fields.append(Field(f.name if f else c, f.quals if f else frozenset(), col(c)))
        fields += [Field(n, frozenset({"__agg"}), col(n)) for n in aggs]
        fields += extra_fields
        out = Rel(node, tuple(columns), tuple(fields), window_size=size,
                  windowed=window if window is not None and window.kind != "SESSION" else None)
        out = self._legacy_bounds(out, legacy[0] if legacy else None, roles)
        if having is not None:
            out = self.filter(out, [having], "HAVING")
        return replace(out, fields=self.project(out, new_items))

    def _per_window(self, rel: Rel, group: list[exp.Expression], key_fields: list[Field | None], plain: list[exp.Expression],
                    aggs: dict[str, str], items: list[exp.Expression], having: exp.Expression | None) -> Rel:
        """``SELECT MAX(c) AS m, window_start, window_end FROM <a window aggregate's rows> GROUP BY
        window_start, window_end``: the per-window maximum, kept as a :class:`PerWindow` for the
        join that makes it a top-1 (:meth:`top_rows_join`); anything else is refused."""
        clause = f"GROUP BY {', '.join(render(g) for g in group)}"
        step = self._step_of(rel.node)
        agg = step.get("window_aggregate") if step else None
        name, text = next(iter(aggs.items()))
        m = re.fullmatch(r"(max|min)\((\w+)\)", text)
        roles = {f.role for f in key_fields if f is not None}

        def shown(it: exp.Expression) -> bool:  # a bound or the aggregate, as it is
            inner = it.unalias()
            return isinstance(inner, exp.Column) and (
                inner.table == "__agg" or self._field_of(rel, inner).role in ("window_start", "window_end"))

        if not (agg is not None and m and m.group(2) in agg["aggregates"] and len(aggs) == 1 and not plain and having is None
                and roles == {"window_start", "window_end"} and all(shown(it) for it in items)):
            raise SpecError(
                f"sql: {clause}: aggregates over rows already grouped per window (a window over a window) are not supported, "
                "except the MAX (or MIN) per window of one aggregate of a window aggregate, joined back to its rows "
                "ON both window bounds AND c >= the maximum (the top rows per window, as Nexmark q5); "
                "expected a Window Top-N: RANK() OVER (PARTITION BY window_start, window_end ORDER BY c DESC) … <= k"
            )
        func, column = m.group(1), m.group(2)
        fields = [f for f in key_fields if f is not None]
        fields.append(Field(name, frozenset({"__agg"}), col(column), role="window_max"))
        out = Rel(rel.node, rel.columns, tuple(fields), window_size=rel.window_size, windowed=rel.windowed,
                  pending=PerWindow(func, column, f"{func.upper()}({column}) … {clause}"))
        return replace(out, fields=self.project(out, items))

    def top_rows_join(self, left: Rel, right: Rel, conds: list[exp.Expression], made: list[str]) -> tuple[Rel, list[exp.Expression]]:
        """A window aggregate's rows joined to the per-window maximum of one of its aggregates::

            a JOIN (SELECT MAX(c) AS m, window_start, window_end FROM a' GROUP BY window_start, window_end) w
              ON a.window_start = w.window_start AND a.window_end = w.window_end AND a.c >= w.m

        where ``a'`` is the same window aggregate as ``a`` (same input, keys, window and aggregate
        ``c``; checked on the compiled steps) are the rows of ``a`` ranked first, with ties, in
        their window: a ``top_k`` (k 1, with ties) over ``a``'s step, as ``RANK() OVER (PARTITION BY
        window_start, window_end ORDER BY c DESC) <= 1``. On every such row ``w.m`` is ``a.c`` and
        ``w``'s bounds are ``a``'s, so ``w``'s columns are read from ``a``'s and the other
        conditions filter the top rows. ``=`` for ``>=`` is the same (``c`` is never above its
        maximum); MIN with ``<=`` is the bottom rows. The steps compiled for ``a'`` (``made``) are
        dropped. Anything else — another window, keys, input or aggregate in ``a'``, a join on one
        bound, ``>`` — is refused, naming the clause."""
        if left.pending and right.pending:
            raise SpecError(f"sql: JOIN of two per-window aggregates ({left.pending.clause}; {right.pending.clause}): "
                            "expected one of them joined to the window aggregate's rows")
        m_left = left.pending is not None
        w, a = (left, right) if m_left else (right, left)
        p = w.pending
        assert p is not None
        step = self._step_of(a.node)
        if step is None or "window_aggregate" not in step or a.rank is not None:
            raise SpecError(
                f"sql: JOIN with {p.clause}: expected the other table to be the rows of the window aggregate the "
                f"{p.func.upper()} is over (… GROUP BY k, window_start, window_end), with no WHERE or HAVING after it"
            )
        ops = {exp.EQ: "=", exp.GTE: ">=", exp.LTE: "<=", exp.GT: ">", exp.LT: "<", exp.NEQ: "<>"}
        flip = {">=": "<=", "<=": ">=", ">": "<", "<": ">"}
        bounds: set[str | None] = set()
        top: tuple[Field, Field, exp.Expression] | None = None
        rest: list[exp.Expression] = []
        for c in conds:
            cols = (c.this, c.expression) if type(c) in ops else ()
            sides = [self._side(a, w, x) if isinstance(x, exp.Column) else None for x in cols]
            if sorted(s or "" for s in sides) != ["l", "r"]:
                rest.append(c)
                continue
            op = ops[type(c)]
            x, y = cols if sides[0] == "l" else (cols[1], cols[0])
            op = op if sides[0] == "l" else flip.get(op, op)
            fa, fw = self._field_of(a, x), self._field_of(w, y)
            if {fa.role, fw.role} & {"window_start", "window_end"}:
                if op != "=" or fa.role != fw.role:
                    raise SpecError(f"sql: JOIN ON {render(c)}: expected a.window_start = w.window_start and a.window_end = w.window_end")
                bounds.add(fw.role)
            elif fw.role == "window_max" and top is None:
                if op not in ("=", ">=" if p.func == "max" else "<="):
                    best = "maximum" if p.func == "max" else "minimum"
                    raise SpecError(
                        f"sql: JOIN ON {render(c)}: expected {x.sql()} {'>=' if p.func == 'max' else '<='} {y.sql()} (the rows whose "
                        f"{x.name} is the window's {best}, ties included) or {x.sql()} = {y.sql()}; {op} is not a top-1"
                    )
                top = (fa, fw, c)
            else:
                rest.append(c)
        if bounds != {"window_start", "window_end"}:
            got = f"got only {next(iter(bounds))}" if bounds else "got neither"
            raise SpecError(f"sql: JOIN with {p.clause}: expected ON both window bounds, a.window_start = w.window_start "
                            f"AND a.window_end = w.window_end; {got}")
        over = self._step_of(w.node)  # the window aggregate the maximum is over (see _per_window)
        assert over is not None
        mine, theirs = step["window_aggregate"], over["window_aggregate"]
        if top is None:
            named = lambda f: f"{min(f.quals)}.{f.name}" if f.quals else f.name  # noqa: E731
            ours = [named(f) for f in a.fields if mine["aggregates"].get(f.column or "") == theirs["aggregates"][p.column]]
            best = next(named(f) for f in w.fields if f.role == "window_max")
            raise SpecError(f"sql: JOIN with {p.clause}: expected ON … AND {ours[0] if ours else 'a.c'} "
                            f"{'>=' if p.func == 'max' else '<='} {best} (the rows whose {theirs['aggregates'][p.column]} is the "
                            f"window's {'maximum' if p.func == 'max' else 'minimum'}, ties included)")
        fa, fw, c = top
        column = fa.column
        if column is None or column not in mine["aggregates"]:
            raise SpecError(f"sql: JOIN ON {render(c)}: {fa.name} is not an aggregate of the window aggregate; "
                            f"expected the aggregate the {p.func.upper()} is over ({theirs['aggregates'][p.column]})")
        if mine["aggregates"][column] != theirs["aggregates"][p.column]:
            raise SpecError(f"sql: JOIN ON {render(c)}: {fa.name} is {mine['aggregates'][column]} but {fw.name} is the "
                            f"{p.func.upper()} of {theirs['aggregates'][p.column]}; expected the same aggregate")
        differ = [k for k in sorted({*mine, *theirs} - {"aggregates"}) if mine.get(k) != theirs.get(k)]
        shown = [f"{k} {_param_text(k, theirs.get(k))} vs {_param_text(k, mine.get(k))}" for k in differ]
        if not self._same_node(step["input"], over["input"]):
            shown.insert(0, "another input (table or WHERE)")
        if shown:
            raise SpecError(
                f"sql: JOIN with {p.clause}: the {p.func.upper()} is over another window aggregate than the rows it is joined to "
                f"({'; '.join(shown)}); expected the same input, window, GROUP BY keys and aggregate"
            )
        self._drop(made)
        rank = Rank("__top", (col("window_start"), col("window_end")), ("window_start", "window_end"),
                    (exp.Ordered(this=col(column), desc=p.func == "max"),), with_ties=True)
        out, _ = self.top_k(replace(a, rank=rank), [exp.LTE(this=col("__top"), expression=exp.Literal.number(1))])
        same = {"window_start": "window_start", "window_end": "window_end", "window_max": column}
        mapped = tuple(replace(f, sql=col(same[f.role or ""])) for f in w.fields)
        return replace(out, fields=(*mapped, *out.fields) if m_left else (*out.fields, *mapped)), rest

    def _refuse_pending(self, rel: Rel) -> None:
        if rel.pending is not None:
            p = rel.pending
            raise SpecError(
                f"sql: {p.clause}: the {p.func.upper()} per window of a window aggregate's rows (a window over a window) "
                "is supported only joined back to those rows ON a.window_start = w.window_start AND a.window_end = "
                f"w.window_end AND a.{p.column} {'>=' if p.func == 'max' else '<='} w.<the {p.func.upper()}> (the top rows "
                "per window, as Nexmark q5); expected that join, or a Window Top-N: RANK() OVER (PARTITION BY window_start, "
                f"window_end ORDER BY {p.column} {'DESC' if p.func == 'max' else 'ASC'}) … <= 1"
            )

    def _step_of(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.steps if s["name"] == name), None)

    def _same_node(self, a: str, b: str) -> bool:
        """Whether two nodes compute the same rows: the same node, or steps of the same kind and
        parameters over the same nodes (compared down to the sources)."""
        if a == b:
            return True
        sa, sb = self._step_of(a), self._step_of(b)
        if sa is None or sb is None:
            return False
        ka, kb = (next(k for k in s if k in STEPS) for s in (sa, sb))
        if ka != kb:
            return False
        pa, pb = sa[ka], sb[kb]
        if ka == "join":
            return ({k: v for k, v in pa.items() if k not in ("left", "right")} == {k: v for k, v in pb.items() if k not in ("left", "right")}
                    and self._same_node(pa["left"], pb["left"]) and self._same_node(pa["right"], pb["right"]))
        if ka == "union":
            return len(pa) == len(pb) and all(self._same_node(x, y) for x, y in zip(pa, pb, strict=True))
        return pa == pb and self._same_node(sa.get("input", ""), sb.get("input", ""))

    def _drop(self, names: list[str]) -> None:
        """Drops the steps ``names`` but those still read (by another step or a view)."""
        def reads(s: dict[str, Any]) -> list[str]:
            if "join" in s:
                return [s["join"]["left"], s["join"]["right"]]
            return list(s["union"]) if "union" in s else [s["input"]] if "input" in s else []

        gone = set(names)
        keep = {v.node for v in self.views.values()} | {r for s in self.steps if s["name"] not in gone for r in reads(s)}
        todo = [n for n in keep if n in gone]
        while todo:
            s = self._step_of(todo.pop())
            for r in reads(s) if s else []:
                if r in gone and r not in keep:
                    keep.add(r)
                    todo.append(r)
        self.steps = [s for s in self.steps if s["name"] not in gone or s["name"] in keep]

    def _ref(self, f: Field) -> exp.Column:
        q = min(f.quals) if f.quals else None
        return exp.Column(this=exp.to_identifier(f.name), table=exp.to_identifier(q) if q else None)

    def _legacy_window(self, rel: Rel, g: exp.Expression) -> Window:
        name = _fn(g)
        args = list(g.expressions) if isinstance(g, exp.Anonymous) else [g.this, *g.expressions]
        if name == "CUMULATE":
            raise SpecError("sql: GROUP BY CUMULATE(…): Flink has no such group window; expected "
                            "FROM TABLE(CUMULATE(TABLE t, DESCRIPTOR(col), step, size))")
        want = 3 if name == "HOP" else 2
        if len(args) != want:
            raise SpecError(f"sql: GROUP BY {name}(…): expected {name}(time column, interval{', interval' if want == 3 else ''})")
        time = self.resolve_field(rel, args[0], f"GROUP BY {name}")
        sizes = [_duration(a, f"GROUP BY {name}") for a in args[1:]]
        size, slide = (sizes[1], sizes[0]) if name == "HOP" else (sizes[0], None)
        return Window(name, self._plain(rel, time, f"GROUP BY {name}"), size, slide, time.delay or 0)

    def _legacy_bounds(self, rel: Rel, g: exp.Expression | None, roles: dict[str, str]) -> Rel:
        """``SESSION_START(t, gap)`` and friends: the window bounds of a legacy group window."""
        if g is None:
            return rel
        name = _fn(g)
        bounds = {f"{name}_START": roles["window_start"], f"{name}_END": roles["window_end"]}
        return replace(rel, fields=(*rel.fields, *(Field(k, frozenset({"__win"}), col(v)) for k, v in bounds.items())))


def _params_for(table: Table) -> Any:
    """The source kind's parameters, validated (for asking the kind about its columns)."""
    try:
        return SOURCES.get(table.kind).adapter.validate_python(table.params)
    except Exception:
        return None


def _legacy_calls(e: exp.Expression) -> exp.Expression:
    """``SESSION_START(t, gap)`` → a column the group window fills in (see _legacy_bounds)."""

    def sub(n: exp.Expression) -> exp.Expression:
        fn = _fn(n)
        if fn.endswith(("_START", "_END")) and fn.rsplit("_", 1)[0] in ("TUMBLE", "HOP", "SESSION"):
            return exp.Column(this=exp.to_identifier(fn), table=exp.to_identifier("__win"))
        return n

    return e.transform(sub)


def compile_sql(text: str, name: str = "sql", nodes: dict[str, tuple[str, ...] | None] | None = None) -> dict[str, Any]:
    """A SQL script → a network's spec dict (``name``, ``sources``, ``steps``, ``sinks`` and the
    settings ``SET 'pipeline.name'``, ``SET 'eddyline.<field>'`` give). ``nodes``: nodes of the
    network around it (YAML), which its queries may read, with their columns."""
    c = Compiler(nodes)
    for statement in parse(text):
        c.statement(_legacy_calls(statement))
    if not c.sinks and not nodes:
        raise SpecError("sql: no INSERT INTO; expected at least one INSERT INTO <table> SELECT …")
    raw: dict[str, Any] = {"name": c.settings.pop("pipeline.name", name), "sources": c.sources, "steps": c.steps, "sinks": c.sinks}
    c.settings.pop("table.exec.state.ttl", None)
    for key, value in c.settings.items():
        if not key.startswith("eddyline."):
            raise SpecError(f"sql: SET '{key}': unknown setting; expected 'pipeline.name', 'table.exec.state.ttl' or 'eddyline.<network field>'")
        raw[key.removeprefix("eddyline.")] = value
    return raw


def sql_name(stem: str) -> str:
    """A network name from a file name."""
    out = re.sub(r"[^A-Za-z0-9_\-]", "_", stem)[:64]
    return out if out and (out[0].isalpha() or out[0] == "_") else f"q_{out}"[:64]


def expand(raw: dict[str, Any]) -> dict[str, Any]:
    """A YAML network with ``sql:`` (for the whole network, or for a step) → one without.

    ``sql:`` at the top: a script whose tables and inserts add sources, steps and sinks; its
    queries may read the YAML's sources and steps by name. ``sql:`` in a step: one query (a
    SELECT) reading other nodes by name; it becomes steps, the last one named as the step."""
    has_steps = any(isinstance(s, dict) and "sql" in s for s in raw.get("steps") or [])
    if "sql" not in raw and not has_steps:
        return raw
    out = {k: v for k, v in raw.items() if k != "sql"}
    columns: dict[str, tuple[str, ...] | None] = {}
    for s in raw.get("sources") or []:
        if isinstance(s, dict):
            kind = next((k for k in s if k in SOURCES), None)
            params = None
            if kind is not None:
                try:
                    params = SOURCES.get(kind).adapter.validate_python(s[kind])
                except Exception:
                    params = None
            info = SOURCES.get(kind) if kind else None
            columns[s.get("name", "")] = info.columns(params) if info is not None and params is not None else None
    steps: list[dict[str, Any]] = []
    for s in raw.get("steps") or []:
        if isinstance(s, dict) and "sql" in s:
            extra = set(s) - {"name", "sql"}
            if extra:
                raise SpecError(f"step '{s.get('name')}': sql: a SQL step names its inputs in FROM; unexpected {', '.join(sorted(extra))}")
            steps += _sql_step(s["name"], s["sql"], columns)
        else:
            steps.append(s)
        if isinstance(steps[-1], dict):
            columns[steps[-1].get("name", "")] = _output_columns(steps[-1], columns)
    out["steps"] = steps
    if "sql" in raw:
        compiled = compile_sql(str(raw["sql"]), str(raw.get("name", "sql")), columns)
        out["sources"] = [*(raw.get("sources") or []), *compiled["sources"]]
        out["steps"] = [*steps, *compiled["steps"]]
        out["sinks"] = [*(raw.get("sinks") or []), *compiled["sinks"]]
        for key, value in compiled.items():
            if key not in ("name", "sources", "steps", "sinks"):
                out.setdefault(key, value)
    return out


def _sql_step(name: str, text: str, columns: dict[str, tuple[str, ...] | None]) -> list[dict[str, Any]]:
    statements = parse(str(text))
    if len(statements) != 1 or not isinstance(statements[0], exp.Select | exp.Union | exp.Subquery):
        raise SpecError(f"step '{name}': sql: expected one SELECT query")
    c = Compiler(columns)
    c.prefix = name
    try:
        rel = c.materialize(c.query(_legacy_calls(statements[0])))
    except SpecError as e:
        raise SpecError([f"step '{name}': {p}" for p in e.problems]) from None
    if not c.steps or c.steps[-1]["name"] != rel.node:
        c.steps.append({"name": name, "input": rel.node, "select": ["*"]})
    else:
        last = c.steps[-1]
        for s in c.steps:  # the last step takes the step's name; its readers follow
            for key in ("input",):
                if s.get(key) == last["name"]:
                    s[key] = name
        last["name"] = name
    if c.sources:
        raise SpecError(f"step '{name}': sql: reads tables only; CREATE TABLE belongs in the network's sql")
    return c.steps
