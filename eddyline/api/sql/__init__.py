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
from typing import Any

from pydantic import ValidationError
from sqlglot import exp

from eddyline.api.sources import SOURCES
from eddyline.api.sql.compiler import Compiler
from eddyline.api.sql.dialect import parse
from eddyline.api.sql.relations import legacy_calls
from eddyline.api.steps import StepSpec
from eddyline.errors import SpecError

__all__ = ["compile_sql", "expand", "parse", "sql_name"]


def _output_columns(step: dict[str, Any], columns: dict[str, tuple[str, ...] | None]) -> tuple[str, ...] | None:
    """The output columns of a step written in YAML, as its kind tells them; None: not known
    (also for a step that does not validate: validation names its problem later)."""
    try:
        spec = StepSpec.model_validate(step)
    except ValidationError:
        return None
    return spec.info.output_columns(spec, tuple(columns.get(name) for name in spec.inputs))


def compile_sql(text: str, name: str = "sql", nodes: dict[str, tuple[str, ...] | None] | None = None) -> dict[str, Any]:
    """A SQL script → a network's spec dict (``name``, ``sources``, ``steps``, ``sinks`` and the
    settings ``SET 'pipeline.name'``, ``SET 'eddyline.<field>'`` give). ``nodes``: nodes of the
    network around it (YAML), which its queries may read, with their columns."""
    c = Compiler(nodes)
    for statement in parse(text):
        c.statement(legacy_calls(statement))
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
        rel = c.materialize(c.query(legacy_calls(statements[0])))
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
