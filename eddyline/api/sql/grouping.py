"""Clauses that aggregate or rank rows: ``GROUP BY`` (per window, per session, or a changelog per
key), ``SELECT DISTINCT``, ``AGG(…) OVER (…)`` and ``ROW_NUMBER() … WHERE rn <= k``."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from sqlglot import exp

from eddyline.api.sql.dialect import WINDOW_TVFS
from eddyline.api.sql.relations import (
    Field,
    PerWindow,
    Rel,
    Window,
    col,
    duration,
    fn_name,
    render,
)
from eddyline.api.sql.scope import Scope
from eddyline.errors import SpecError


class Grouping(Scope):
    """Compiles the aggregating and ranking clauses into steps."""

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
        legacy = [g for g in group if fn_name(g) in WINDOW_TVFS]
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
        aggs, items, having = self._name_aggregates(rel, items, q.args["having"].this if q.args.get("having") else None)
        rel2, key_cols = self._ensure(rel, plain, "GROUP BY")
        roles = {"window_start": "window_start", "window_end": "window_end"}
        if window is not None and aggs:
            node, roles = self._window_step(rel2, window, key_cols, aggs)
            columns = (*key_cols, roles["window_start"], roles["window_end"], *aggs)
            size = window.size if window.kind != "SESSION" else None
        elif bounds and aggs:
            # rows grouped per window already (a window aggregate's output), grouped again per window
            return self._per_window(rel, group, key_fields, plain, aggs, items, having)
        elif window is not None or bounds:
            return self._distinct_per_window(rel, rel2, window, bounds, key_cols, items)
        else:
            if not aggs:
                raise SpecError("sql: GROUP BY without aggregates and without a window is not supported (it would keep every key forever)")
            if not key_cols:
                raise SpecError("sql: an aggregate without GROUP BY over an unbounded stream: expected GROUP BY a key or a window")
            params = {"key": key_cols[0] if len(key_cols) == 1 else key_cols, "aggregates": aggs}
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
        out = Rel(node, tuple(columns), tuple(fields), window_size=size,
                  windowed=window if window is not None and window.kind != "SESSION" else None)
        out = self._legacy_bounds(out, legacy[0] if legacy else None, roles)
        if having is not None:
            out = self.filter(out, [having], "HAVING")
        return replace(out, fields=self.project(out, items))

    def _name_aggregates(self, rel: Rel, items: list[exp.Expression], having: exp.Expression | None
                         ) -> tuple[dict[str, str], list[exp.Expression], exp.Expression | None]:
        """Each aggregate in the SELECT list and HAVING becomes a named column of the step's
        output (its alias, or ``_aN``; the same aggregate written twice is one column): the
        aggregates by name, and the items and HAVING reading those columns."""
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
        return aggs, new_items, having

    def _window_step(self, rel: Rel, window: Window, key_cols: list[str], aggs: dict[str, str]) -> tuple[str, dict[str, str]]:
        """A window or session aggregate of ``rel``'s rows: its node, and the names of its bounds."""
        params: dict[str, Any] = {"key": key_cols[0] if len(key_cols) == 1 else key_cols} if key_cols else {}
        roles = {"window_start": "window_start", "window_end": "window_end"}
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
        return self.step("window" if kind == "window_aggregate" else "session", kind, params, rel.node), roles

    def _distinct_per_window(self, rel: Rel, keyed: Rel, window: Window | None, bounds: list[Field], key_cols: list[str],
                             items: list[exp.Expression]) -> Rel:
        """GROUP BY without aggregates over windowed rows: a distinct per window (a dedup step
        keyed by the keys and the window's start, forgetting a key when its window ends)."""
        if window is not None and window.kind != "TUMBLE" or (window is None and rel.window_size is None):
            raise SpecError("sql: GROUP BY without aggregates over a window: expected a TUMBLE window")
        size = window.size if window is not None else rel.window_size
        assert size is not None
        starts = [f for f in bounds if f.role == "window_start"]
        if not starts:
            raise SpecError("sql: GROUP BY without aggregates over a window: expected window_start among the keys")
        ends = [f for f in rel.fields if f.role == "window_end"]
        keyed, (start_col, end_col) = self._ensure(keyed, [self._ref(starts[0]), self._ref(ends[0])], "GROUP BY")
        params: dict[str, Any] = {"key": [*key_cols, start_col], "time": end_col, "ttl": size}
        delay = rel.ahead + (ends[0].delay or 0)
        if delay:
            params["watermark_delay"] = delay
        node = self.step("distinct", "dedup", params, keyed.node)
        out = replace(keyed, node=node, window=None, rank=None, ahead=0, window_size=size, windowed=window or rel.windowed)
        return replace(out, fields=self.project(out, items))

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

    def _legacy_window(self, rel: Rel, g: exp.Expression) -> Window:
        name = fn_name(g)
        args = list(g.expressions) if isinstance(g, exp.Anonymous) else [g.this, *g.expressions]
        if name == "CUMULATE":
            raise SpecError("sql: GROUP BY CUMULATE(…): Flink has no such group window; expected "
                            "FROM TABLE(CUMULATE(TABLE t, DESCRIPTOR(col), step, size))")
        want = 3 if name == "HOP" else 2
        if len(args) != want:
            raise SpecError(f"sql: GROUP BY {name}(…): expected {name}(time column, interval{', interval' if want == 3 else ''})")
        time = self.resolve_field(rel, args[0], f"GROUP BY {name}")
        sizes = [duration(a, f"GROUP BY {name}") for a in args[1:]]
        size, slide = (sizes[1], sizes[0]) if name == "HOP" else (sizes[0], None)
        return Window(name, self._plain(rel, time, f"GROUP BY {name}"), size, slide, time.delay or 0)

    def _legacy_bounds(self, rel: Rel, g: exp.Expression | None, roles: dict[str, str]) -> Rel:
        """``SESSION_START(t, gap)`` and friends: the window bounds of a legacy group window."""
        if g is None:
            return rel
        name = fn_name(g)
        bounds = {f"{name}_START": roles["window_start"], f"{name}_END": roles["window_end"]}
        return replace(rel, fields=(*rel.fields, *(Field(k, frozenset({"__win"}), col(v)) for k, v in bounds.items())))
