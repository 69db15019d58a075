"""Loading and validating a network, before anything runs.

Three layers, cheapest first; each error names the source / step / sink and the field path:

1. structure (pydantic): unknown fields, wrong types, bad durations, one kind per node;
2. graph: duplicate names, unknown inputs, cycles, nodes whose output reaches no sink;
3. expressions: SQL syntax (sqlglot, no Spark), then Spark's analyzer over empty frames of the
   real source schemas (unknown columns, type errors such as a non-boolean filter or ``sum``
   over a string). Layer 3b compiles the network, so it lives with the compiler
   (:func:`eddyline.runtime.compile.analyze`); ``eddyline validate --offline`` skips it.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from eddyline.api.network import NetworkSpec
from eddyline.api.registry import Registry
from eddyline.api.sinks import SINKS, SinkSpec
from eddyline.api.sources import SOURCES, SourceSpec
from eddyline.api.sql import compile_sql, expand, sql_name
from eddyline.api.steps import STEPS, StepSpec
from eddyline.errors import SpecError

_SECTIONS: dict[str, tuple[str, type[BaseModel], Registry[Any]]] = {
    "sources": ("source", SourceSpec, SOURCES),
    "steps": ("step", StepSpec, STEPS),
    "sinks": ("sink", SinkSpec, SINKS),
}


def load_spec(source: str | Path | dict[str, Any]) -> NetworkSpec:
    """Parse YAML (a path, YAML text, or an already-loaded dict) into a validated network; a
    ``.sql`` path is a streaming SQL script (:mod:`eddyline.api.sql`)."""
    if isinstance(source, dict):
        raw = source
    elif str(source).endswith(".sql") and _looks_like_path(source):
        raw = compile_sql(Path(source).read_text(encoding="utf-8"), sql_name(Path(source).stem))
    else:
        try:
            if _looks_like_path(source):
                with open(source, encoding="utf-8") as f:  # (its errors name the file, not '<unicode string>')
                    raw = yaml.safe_load(f)
            else:
                raw = yaml.safe_load(str(source))
        except yaml.YAMLError as e:
            raise SpecError(f"network: not valid YAML: {e}") from e
        if not isinstance(raw, dict):
            raise SpecError(f"network: expected a mapping with name, sources, steps, sinks; got {type(raw).__name__}")
    return spec_from_raw(raw)


def spec_from_raw(raw: dict[str, Any]) -> NetworkSpec:
    """Structure, graph and expression syntax (no Spark); every problem named in one SpecError.
    ``sql:`` (for the network or a step) is compiled into steps first (:func:`eddyline.api.sql.expand`)."""
    raw = expand(raw)
    try:
        spec = NetworkSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_errors(e, raw)) from None
    problems = check_graph(spec) + check_expressions(spec)
    if problems:
        raise SpecError(problems)
    return spec


def _looks_like_path(source: str | Path) -> bool:
    if isinstance(source, Path):
        return True
    return "\n" not in source and (source.endswith((".yaml", ".yml")) or Path(source).exists())


# --------------------------------------------------------------------------- layer 1


def format_errors(err: ValidationError, raw: dict[str, Any]) -> list[str]:
    """pydantic errors → ``"step 'per_auction': window.size: expected …, got …"``."""
    merged: dict[tuple[str, str], list[str]] = {}
    misspelt: set[tuple[str, str]] = set()  # (who, field) a misspelt key was meant to be
    errors = err.errors()
    # an item that failed is left out of its list, which may then be "too short": that follows
    # from the item's own error, said already
    failed = {e["loc"][0] for e in errors if len(e["loc"]) >= 2 and e["loc"][0] in _SECTIONS}
    for e in errors:
        loc = list(e["loc"])
        if len(loc) == 1 and loc[0] in failed and e["type"] == "too_short":
            continue
        who = "network"
        model: type[BaseModel] | None = NetworkSpec
        if loc and loc[0] in _SECTIONS and len(loc) >= 2 and isinstance(loc[1], int):
            what, model, kinds = _SECTIONS[loc[0]]
            items = raw.get(loc[0]) or []
            item = items[loc[1]] if loc[1] < len(items) else None
            name = item.get("name") if isinstance(item, dict) else None
            who = f"{what} '{name}'" if name else f"{what} #{loc[1] + 1}"
            loc = loc[2:]
            if loc and loc[0] in kinds:  # the kind key is implied by the node
                model = _first_model(kinds.get(str(loc[0])).params)
                loc = loc[1:]
        path = [str(p) for p in loc if not _is_type_tag(p)]
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            parent = _model_at(model, path[:-1]) if model else None
            allowed = sorted(f.alias or n for n, f in parent.model_fields.items()) if parent else []
            guess = difflib.get_close_matches(path[-1], allowed, n=1) if path else []
            if guess:
                msg = f"unknown field — did you mean '{guess[0]}'?"
                misspelt.add((who, ".".join([*path[:-1], guess[0]])))
            else:
                msg = f"unknown field; expected one of {', '.join(allowed)}" if allowed else "unknown field"
        elif e["type"] == "missing":
            msg = "field required"
        elif "input" in e and e["type"] not in ("value_error", "assertion_error") and not isinstance(e["input"], dict | list | tuple):
            msg = f"{msg}, got {e['input']!r}"
        merged.setdefault((who, ".".join(path)), []).append(msg)
    out = []
    for (who, path), msgs in merged.items():
        if (who, path) in misspelt and msgs == ["field required"]:
            continue  # the misspelt field is that one: one mistake, one line
        text = " or ".join(dict.fromkeys(msgs))
        out.append(f"{who}: {path}: {text}" if path else f"{who}: {text}")
    return out


def _is_type_tag(part: object) -> bool:
    if isinstance(part, int):
        return False
    s = str(part)
    return "[" in s or s in {"str", "int", "float", "bool", "list", "tuple", "dict", "none", "datetime"}


def _model_at(model: type[BaseModel] | None, path: list[str]) -> type[BaseModel] | None:
    cur = model
    for key in path:
        if cur is None:
            return None
        field = cur.model_fields.get(key) or next((f for f in cur.model_fields.values() if f.alias == key), None)
        if field is None:
            return None
        cur = _first_model(field.annotation)
    return cur


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) or origin is not None:
        for arg in typing.get_args(annotation):
            found = _first_model(arg)
            if found is not None:
                return found
    return None


# --------------------------------------------------------------------------- layer 2


def check_graph(spec: NetworkSpec) -> list[str]:
    problems: list[str] = []
    kinds: dict[str, str] = {}
    for what, nodes in (("source", spec.sources), ("step", spec.steps), ("sink", spec.sinks)):
        for n in nodes:
            if n.name in kinds:
                problems.append(f"{what} '{n.name}': name: already used by a {kinds[n.name]}")
            else:
                kinds[n.name] = what
    producers = [n.name for n in (*spec.sources, *spec.steps)]
    for what, nodes in (("step", spec.steps), ("sink", spec.sinks)):
        for n in nodes:
            pairs = n.input_fields() if isinstance(n, StepSpec) else [("input", n.input)]
            for field, i in pairs:
                if i == n.name:
                    problems.append(f"{what} '{n.name}': {field}: a node cannot read its own output")
                elif kinds.get(i) == "sink":
                    problems.append(f"{what} '{n.name}': {field}: '{i}' is a sink; expected a source or step")
                elif i not in kinds:
                    problems.append(
                        f"{what} '{n.name}': {field}: unknown input '{i}'; expected one of {', '.join(producers)}"
                    )
    if problems:
        return problems
    _, cyclic = spec.ordered()
    for step in cyclic:
        problems.append(f"step '{step.name}': input: part of a cycle ({' → '.join(_cycle_from(spec, step.name))})")
    if problems:
        return problems
    consumed = set().union(*(spec.upstream(s.input) for s in spec.sinks))
    for s in spec.sources:
        if s.name not in consumed:
            problems.append(f"source '{s.name}': its rows reach no sink")
    for st in spec.steps:
        if st.name not in consumed:
            problems.append(f"step '{st.name}': its output reaches no sink")
    return problems + check_control(spec)


def check_control(spec: NetworkSpec) -> list[str]:
    """The control section must name stateful steps and key groups that exist."""
    problems: list[str] = []
    c = spec.control
    stateful = [s.name for s in spec.steps if s.stateful]
    for i, name in enumerate(c.steps or ()):
        if name not in stateful:
            problems.append(
                f"control: steps.{i}: '{name}' is not a stateful step; expected one of {', '.join(stateful) or '(none)'}"
            )
    if c.scale is not None:
        if c.scale.max_lanes is not None and c.scale.max_lanes < c.scale.min_lanes:
            problems.append(f"control: scale.max_lanes: {c.scale.max_lanes} is below min_lanes {c.scale.min_lanes}")
        for epoch, lanes in c.scale.schedule.items():
            if epoch < 1 or lanes < 1:
                problems.append(f"control: scale.schedule.{epoch}: expected epoch >= 1 and lanes >= 1, got {lanes}")
    if c.overload is not None:
        if spec.latency_bound is None:
            problems.append("control: overload: needs a latency bound; give some sink a qos.latency")
        for name in c.overload.utility:
            if name not in stateful:
                problems.append(f"control: overload.utility.{name}: not a stateful step; expected one of {', '.join(stateful)}")
        for name in (c.overload.cost_model.step_ms_per_row if c.overload.cost_model else {}):
            if name not in stateful:
                problems.append(f"control: overload.cost_model.step_ms_per_row.{name}: not a stateful step")
        if c.overload.mode == "semantic" and not c.overload.utility:
            problems.append("control: overload.utility: semantic shedding needs a utility expression per step")
    if c.spread is not None:
        for epoch, groups in c.spread.schedule.items():
            bad = [g for g in groups if not 0 <= g < spec.key_groups]
            if epoch < 1 or bad:
                problems.append(
                    f"control: spread.schedule.{epoch}: expected epoch >= 1 and key groups in [0, {spec.key_groups}), got {list(groups)}"
                )
    if c.rewrite is not None:
        if spec.max_delay is not None:
            problems.append("control: rewrite: a network with max_delay cannot change its network while it runs yet")
        for epoch, names in c.rewrite.schedule.items():
            bad = [n for n in names if n not in stateful]
            if epoch < 1 or bad:
                problems.append(
                    f"control: rewrite.schedule.{epoch}: expected epoch >= 1 and stateful steps ({', '.join(stateful) or 'none'}), "
                    f"got {list(names)}"
                )
    return problems


def _cycle_from(spec: NetworkSpec, start: str) -> list[str]:
    path, cur = [start], start
    for _ in range(len(spec.steps) + 1):
        step = spec.step(cur)
        nxt = next((i for i in step.inputs if any(s.name == i for s in spec.steps)), None)
        if nxt is None:
            break
        path.append(nxt)
        if nxt == start:
            break
        cur = nxt
    return path


# --------------------------------------------------------------------------- layer 3


def check_expressions(spec: NetworkSpec) -> list[str]:
    """What each node's kind checks without Spark (the SQL syntax of filters and selections)."""
    return [f"step '{step.name}': {problem}" for step in spec.steps for problem in step.info.check(step)]


def validate(spec: NetworkSpec) -> NetworkSpec:
    """The checks that need no Spark; raises one :class:`SpecError` naming every problem."""
    problems = check_graph(spec) + check_expressions(spec)
    if problems:
        raise SpecError(problems)
    return spec
