"""``JOIN … ON``: unbounded, interval and window joins, and the join with a per-window maximum that
is a top-1 (Nexmark q5)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sqlglot import exp

from eddyline.api.sql.grouping import Grouping
from eddyline.api.sql.relations import (
    Field,
    Rank,
    Rel,
    Window,
    col,
    duration,
    param_text,
    render,
    window_text,
)
from eddyline.columns import join_right_names
from eddyline.errors import SpecError


@dataclass
class JoinOn:
    """A join's ON and WHERE conjuncts by role."""

    keys: list[tuple[Field, Field]] = field(default_factory=list)  # (left, right) equal columns
    interval: tuple[exp.Expression, exp.Expression, exp.Expression] | None = None  # low, high, point
    bounds: list[exp.Expression] = field(default_factory=list)  # equating window bounds
    pushed: dict[str, list[exp.Expression]] = field(default_factory=lambda: {"l": [], "r": []})  # one table's alone
    rest: list[exp.Expression] = field(default_factory=list)


class Joins(Grouping):
    """Compiles joins into join (or top_k) steps, pushing each WHERE conjunct to the side it reads."""

    def join(self, left: Rel, right: Rel, conds: list[exp.Expression]) -> tuple[Rel, list[exp.Expression]]:
        if left.rank or right.rank:
            raise SpecError("sql: JOIN of a ROW_NUMBER() query: expected its WHERE rn <= k in the query that defines it")
        on = self._on(left, right, conds)
        if not isinstance(on, JoinOn):  # the tables or the BETWEEN turned round: start again
            return self.join(*on)
        if not on.keys:
            raise SpecError("sql: JOIN: expected an equality between a column of each table (an equi-join), e.g. ON a.id = b.id")
        left = self.filter(left, on.pushed["l"], "WHERE") if on.pushed["l"] else left
        right = self.filter(right, on.pushed["r"], "WHERE") if on.pushed["r"] else right
        tables = bool(left.window or right.window)  # a join of window tables (not grouped rows)
        left, right, params, delay, windowed = self._join_kind(left, right, on, tables)
        # the kernel joins whole rows; columns computed by a query are computed first
        left = left if all(f.column for f in left.fields) else self.materialize(left)
        right = right if all(f.column for f in right.fields) else self.materialize(right)
        end: Field | None = None
        if on.interval is not None:
            left, right, params, delay, end = self._interval_join(left, right, on.interval)
        if delay:
            params["watermark_delay"] = delay
        lk = [self._plain(left, a, "JOIN ON") for a, _ in on.keys]
        rk = [self._plain(right, b, "JOIN ON") for _, b in on.keys]
        out = self._join_step(left, right, lk, rk, params, windowed)
        if tables:
            # two window tables: their bounds are the join's
            quals = frozenset().union(*(f.quals for f in (*left.fields, *right.fields)))
            extra = (Field("window_start", quals, col("window_start"), delay, "window_start"),
                     Field("window_end", quals, col("window_end"), delay, "window_end"))
            out = replace(out, fields=(*out.fields, *extra))
        if on.interval is not None:
            out = replace(out, interval_keys=tuple(lk))
            if end is not None and end.column is not None:
                out = replace(out, fields=tuple(
                    replace(f, role="interval_end") if f.column == end.column and f.quals == end.quals else f for f in out.fields))
        return out, on.rest

    def _on(self, left: Rel, right: Rel, conds: list[exp.Expression]) -> JoinOn | tuple[Rel, Rel, list[exp.Expression]]:
        """The ON and WHERE conjuncts by role: the keys, an interval, equal window bounds, those
        one table's rows alone decide, the rest. Or the join to compile instead, when the
        interval's holder must be the left table or a grouped query's rows must be the points."""
        on = JoinOn()
        for c in conds:
            sides = self._sides(left, right, c)
            if sides <= {"l"} or sides <= {"r"}:
                side = next(iter(sides), "l")
                table = left if side == "l" else right
                roles = {self._field_of(table, x).role for x in c.find_all(exp.Column)}
                if roles & {"window_start", "window_end"} and table.window is not None:
                    raise SpecError(f"sql: WHERE {render(c)}: a condition on a window's bounds before GROUP BY is not supported")
                on.pushed[side].append(c)
                continue
            if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column):
                a, b = c.this, c.expression
                if self._side(left, right, a) == "r":
                    a, b = b, a
                fa, fb = self._field_of(left, a), self._field_of(right, b)
                if fa.role in ("window_start", "window_end") or fb.role in ("window_start", "window_end"):
                    if fa.role != fb.role:
                        raise SpecError(f"sql: JOIN ON {render(c)}: expected window_start = window_start and window_end = window_end")
                    on.bounds.append(c)
                else:
                    on.keys.append((fa, fb))
                continue
            if isinstance(c, exp.Between) and on.interval is None:
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
                        return left, right, [flipped if x is c else x for x in conds]
                    if ls == {"r"}:  # the interval is on the left in Eddyline's join: swap sides
                        return right, left, conds
                    on.interval = (low, high, point)
                    continue
            on.rest.append(c)
        return on

    def _join_kind(self, left: Rel, right: Rel, on: JoinOn, tables: bool) -> tuple[Rel, Rel, dict[str, Any], int, Window | None]:
        """A window join (of two TUMBLE tables, or of rows grouped per window on equal bounds) or
        an unbounded join with a state TTL: its parameters, watermark delay and output window."""
        if tables:
            lw, rw = left.window, right.window
            if not (lw and rw and lw.kind == rw.kind == "TUMBLE" and lw.size == rw.size
                    and self._bound_roles(left, right, on.bounds) == {"window_start", "window_end"}):
                raise SpecError(
                    "sql: JOIN of window tables: expected two TUMBLE tables of one size, joined ON their keys "
                    "AND a.window_start = b.window_start AND a.window_end = b.window_end"
                )
            delay = max(lw.delay, rw.delay)
            left = replace(left, fields=tuple(f for f in left.fields if not f.role), window=None)
            right = replace(right, fields=tuple(f for f in right.fields if not f.role), window=None)
            params = {"kind": "window", "size": lw.size, "left_time": lw.time, "right_time": rw.time}
            return left, right, params, delay, replace(lw, delay=delay)
        if on.bounds:
            # rows grouped per window on both sides, equal bounds: a window join on their starts
            left, right, params = self._grouped_window_join(left, right, on.bounds)
            return left, right, params, 0, replace(left.windowed, time=params["left_time"]) if left.windowed else None
        if on.interval is None and "table.exec.state.ttl" in self.settings:
            times = [f for f in left.fields if f.delay is not None], [f for f in right.fields if f.delay is not None]
            if not (times[0] and times[1]):
                raise SpecError("sql: JOIN with a state TTL: expected a WATERMARK on both tables (the TTL is in event time)")
            params = {"ttl": self.settings["table.exec.state.ttl"].replace(" ", ""),
                      "left_time": times[0][0].column, "right_time": times[1][0].column}
            return left, right, params, 0, None
        return left, right, {}, 0, None

    def _interval_join(self, left: Rel, right: Rel, interval: tuple[exp.Expression, exp.Expression, exp.Expression]
                       ) -> tuple[Rel, Rel, dict[str, Any], int, Field | None]:
        """An interval join's parameters: the left rows' interval, the right rows' point, each
        computed by a select before the join where it is not a column."""
        low, high, point = interval
        clause = "JOIN … BETWEEN"
        delay = max((self._field_of(rel, x).delay or 0 for rel, e in ((left, low), (right, point))
                     for x in e.find_all(exp.Column)), default=0)
        end = self._field_of(left, high) if isinstance(high, exp.Column) else None
        left, (lo, hi) = self._ensure(left, [low, high], clause)
        right, (at,) = self._ensure(right, [point], clause)
        return left, right, {"kind": "interval", "left_time": lo, "left_end": hi, "right_time": at}, delay, end

    def _join_step(self, left: Rel, right: Rel, lk: list[str], rk: list[str], params: dict[str, Any],
                   windowed: Window | None) -> Rel:
        """The join step and its rows: the left's columns, then the right's (renamed where a name
        is taken), then a window join's bounds."""
        renamed = dict(zip(right.columns, join_right_names(left.columns, right.columns), strict=True))
        out_cols = (*left.columns, *renamed.values(), *(("window_start", "window_end") if params.get("kind") == "window" else ()))
        node = self.step("join", "join", {
            "left": left.node, "right": right.node,
            "left_key": lk[0] if len(lk) == 1 else lk, "right_key": rk[0] if len(rk) == 1 else rk, **params,
        })
        fields = [replace(f, sql=col(f.column)) for f in left.fields]
        fields += [replace(f, sql=col(renamed[f.column])) for f in right.fields]
        out = Rel(node, out_cols, tuple(fields), windowed=windowed)
        return replace(out, window_size=params["size"]) if params.get("kind") == "window" else out

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
            duration(low.expression, f"JOIN … {render(c)}")
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
                f"sql: JOIN ON {on}: expected two TUMBLE windows of one size; got {window_text(lw)} and {window_text(rw)}"
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
        shown = [f"{k} {param_text(k, theirs.get(k))} vs {param_text(k, mine.get(k))}" for k in differ]
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
