"""From a step's spec to its kernel: the one place that knows every stateful kind.

Each builder gets the step spec and the Arrow schema(s) of its input(s) (without ``_kg``) and
returns a :class:`~eddyline.operators.base.Kernel`. Constructors raise ``ValueError`` for
parameters that do not fit the input; the compiler turns that into a spec error naming the step.
"""

from __future__ import annotations

import importlib
from typing import Any

import pyarrow as pa

from eddyline.api.spec import StepSpec, parse_aggregate
from eddyline.operators.base import Kernel


def _tuple(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def build_join(step: StepSpec, left: pa.Schema, right: pa.Schema) -> Kernel:
    from eddyline.operators.join import IntervalJoinKernel, UnboundedJoinKernel, WindowJoinKernel

    j = step.join
    assert j is not None
    lk, rk = _tuple(j.left_key), _tuple(j.right_key)
    if j.kind == "window":
        assert j.left_time and j.right_time and j.size
        return WindowJoinKernel(left, right, lk, rk, left_time=j.left_time, right_time=j.right_time, size_ms=j.size)
    if j.kind == "interval":
        assert j.left_time and j.left_end and j.right_time
        return IntervalJoinKernel(left, right, lk, rk, left_start=j.left_time, left_end=j.left_end, right_time=j.right_time)
    return UnboundedJoinKernel(left, right, lk, rk, ttl_ms=j.ttl, left_time=j.left_time, right_time=j.right_time)


def build(step: StepSpec, schema: pa.Schema) -> Kernel:
    """The kernel of a single-input stateful step."""
    if step.dedup is not None:
        from eddyline.operators.dedup import DedupKernel

        d = step.dedup
        return DedupKernel(schema, _tuple(d.key), d.time, d.ttl)
    if step.top_k is not None:
        from eddyline.operators.topk import TopKKernel

        t = step.top_k
        return TopKKernel(schema, _tuple(t.partition_by), list(t.ordering), t.k, t.time, t.with_ties)
    if step.session_window is not None:
        from eddyline.operators.session import SessionWindowKernel

        sw = step.session_window
        return SessionWindowKernel(schema, _tuple(sw.key), sw.time, sw.gap, sw.parsed_aggregates)
    if step.aggregate is not None:
        return _keyed_aggregate(step, schema)
    if step.over_aggregate is not None:
        from eddyline.operators.over import OverAggregateKernel

        o = step.over_aggregate
        return OverAggregateKernel(schema, _tuple(o.key), o.time, o.preceding, o.parsed_aggregates)
    if step.pattern is not None:
        from eddyline.operators.pattern import PatternKernel, Split

        p = step.pattern
        factory = _resolve(p.factory)
        pattern = factory(**p.args)
        split = None
        if p.split is not None:
            names = [e.name for e in pattern.elements]
            if p.split.at not in names:
                raise ValueError(f"split.at: unknown element {p.split.at!r}; the pattern has {', '.join(names)}")
            split = Split(p.split.stage, names.index(p.split.at))
        return PatternKernel(schema, _tuple(p.key), p.time, pattern, p.within, dict(p.measures), split=split)
    raise KeyError(f"no kernel for step kind {step.kind!r}")


def _keyed_aggregate(step: StepSpec, schema: pa.Schema) -> Kernel:
    from eddyline.operators.keyed import KeyedAggregateKernel, KeyedAggregateSpec

    a = step.aggregate
    assert a is not None
    specs: list[Any] = []
    for name, text in a.aggregates.items():
        specs.append(KeyedAggregateSpec.parse(name, text) if hasattr(KeyedAggregateSpec, "parse") else (name, *parse_aggregate(text)))
    return KeyedAggregateKernel(schema, _tuple(a.key), specs, a.time)


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"factory: cannot load {path!r}: {e}") from e
