"""The network a SQL script builds and the names its queries can use."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlglot import exp

from eddyline.api.sql.relations import (
    Field,
    Rel,
    Table,
    and_all,
    col,
    render,
)
from eddyline.api.steps import STEPS
from eddyline.errors import SpecError


class Scope:
    """The network being built (its sources, steps and sinks as spec dicts) and name resolution:
    a query's column against a :class:`Rel`, a step added, computed fields materialized by a
    select step."""

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

    def step(self, what: str, kind: str, params: Any, input: str | None = None) -> str:
        taken = {s["name"] for s in (*self.sources, *self.steps)} | set(self.tables) | set(self.nodes)
        base = f"{self.prefix}_{what}"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        self.steps.append({"name": name, **({"input": input} if input else {}), kind: params})
        return name

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
        text = render(self.resolve(rel, and_all(conds), clause))
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
