"""The compiler's front: statements (``CREATE TABLE``, ``CREATE VIEW``, ``SET``, ``INSERT INTO``)
and a query's structure (``FROM``, ``WHERE``, ``SELECT``, ``UNION``), each clause handed to the
layer that compiles it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import sqlglot
from sqlglot import exp

from eddyline.api.sources import SOURCES
from eddyline.api.sql.dialect import parse
from eddyline.api.sql.joins import Joins
from eddyline.api.sql.relations import (
    CONNECTORS,
    NODE_FIELDS,
    Field,
    Rank,
    Rel,
    Table,
    Window,
    col,
    conjuncts,
    duration,
    fn_name,
    params_for,
    render,
)
from eddyline.errors import SpecError


class Compiler(Joins):
    """Compiles statements into ``sources``, ``steps`` and ``sinks`` (spec dicts).

    Built in layers, each a module: :class:`~eddyline.api.sql.scope.Scope` (the network and
    names), :class:`~eddyline.api.sql.grouping.Grouping`, :class:`~eddyline.api.sql.joins.Joins`,
    then the statements and queries here."""

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
                    delay, expr = duration(expr.expression, f"{clause}: WATERMARK"), expr.this
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
        params = params_for(table) if kind is not None else None
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
        where = conjuncts(q.args["where"].this) if q.args.get("where") else []
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
            conds = conjuncts(j.args["on"]) + where if j.args.get("on") else where
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
        name = fn_name(call) if call is not None else ""
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
        if fn_name(descriptor) != "DESCRIPTOR" or len(descriptor.expressions) != 1:
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
        sizes = [duration(i, name) for i in intervals]
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
