"""What the compiler passes between clauses: a :class:`Rel` (rows of a network node seen through
the fields a query can name), the window and rank waiting for the clause that compiles them, a
``CREATE TABLE``, and small helpers over sqlglot expressions."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from sqlglot import exp

from eddyline.api.sources import SOURCES
from eddyline.errors import SpecError


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
    window bounds AND ``c >= max`` (:meth:`Joins.top_rows_join`)."""

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


def duration(e: exp.Expression, clause: str) -> int:
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


def window_text(w: Window) -> str:
    """``TUMBLE 10 s``, ``HOP 10 s every 2 s``: a window for messages."""
    sec = lambda ms: f"{ms / 1000:g} s"  # noqa: E731
    every = w.slide or w.step
    return f"{w.kind} {sec(w.size)}" + (f" every {sec(every)}" if every and every != w.size else "")


def param_text(key: str, value: Any) -> str:
    """A window aggregate's parameter as the compiler wrote it, for messages (windows in seconds)."""
    if key == "window" and isinstance(value, dict):
        every = value.get("slide") or value.get("step")
        return f"{value['size'] / 1000:g} s" + (f" every {every / 1000:g} s" if every else "")
    if key == "watermark_delay" and isinstance(value, int):
        return f"{value / 1000:g} s"
    return "none" if value is None else ", ".join(value) if isinstance(value, list) else str(value)


def conjuncts(e: exp.Expression | None) -> list[exp.Expression]:
    if e is None:
        return []
    if isinstance(e, exp.Paren):
        return conjuncts(e.this)
    if isinstance(e, exp.And):
        return conjuncts(e.left) + conjuncts(e.right)
    return [e]


def and_all(parts: list[exp.Expression]) -> exp.Expression:
    out = parts[0]
    for p in parts[1:]:
        out = exp.And(this=out, expression=p)
    return out


def fn_name(e: exp.Expression) -> str:
    """The upper-case name of a function call (``TUMBLE``, ``SESSION_START``), else ''."""
    if isinstance(e, exp.Anonymous):
        return str(e.this).upper()
    if isinstance(e, exp.Func):
        return e.sql_name().upper()
    return ""


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


def params_for(table: Table) -> Any:
    """The source kind's parameters, validated (for asking the kind about its columns)."""
    try:
        return SOURCES.get(table.kind).adapter.validate_python(table.params)
    except Exception:
        return None


def legacy_calls(e: exp.Expression) -> exp.Expression:
    """``SESSION_START(t, gap)`` → a column the group window fills in (see _legacy_bounds)."""

    def sub(n: exp.Expression) -> exp.Expression:
        fn = fn_name(n)
        if fn.endswith(("_START", "_END")) and fn.rsplit("_", 1)[0] in ("TUMBLE", "HOP", "SESSION"):
            return exp.Column(this=exp.to_identifier(fn), table=exp.to_identifier("__win"))
        return n

    return e.transform(sub)


#: Flink connector names for Eddyline's kinds
CONNECTORS = {"blackhole": "discard", "print": "console", "filesystem": "files"}

NODE_FIELDS = {"limit", "max_rows_per_epoch", "qos"}
