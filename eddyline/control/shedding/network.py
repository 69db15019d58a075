"""A problem compiled into a checked network: arcs in topological order, loads per node."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eddyline.control.shedding.problem import (
    ARC_SEPARATOR,
    FEASIBILITY_TOL,
    ShedProblem,
    StepLoad,
    arc,
)


@dataclass(frozen=True)
class _Arc:
    name: str
    tail: str
    head: str


@dataclass(frozen=True)
class Network:
    """A validated :class:`ShedProblem` with its derived structure."""

    problem: ShedProblem
    order: tuple[StepLoad, ...]  # steps in topological order
    arcs: dict[str, _Arc]
    source_arcs: tuple[str, ...]
    shed_points: tuple[str, ...]
    node_order: tuple[str, ...] | None  # topological order of nodes; None if they form a cycle


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} names must be non-empty strings, got {name!r}")
    if ARC_SEPARATOR in name:
        raise ValueError(f"{kind} name {name!r} must not contain {ARC_SEPARATOR!r}")
    return name


def check_number(what: str, value: object, *, nonnegative: bool = True) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number) or (nonnegative and number < 0):
        kind = "a finite non-negative" if nonnegative else "a finite"
        raise ValueError(f"{what} must be {kind} number, got {value!r}")
    return number


def _topological(names: list[str], edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """Kahn's algorithm, stable in the order of ``names``; ``None`` if there is a cycle.

    ``edges[n]`` lists the predecessors of ``n`` (only names in ``names`` count).
    """
    known = set(names)
    preds = {n: {p for p in edges.get(n, ()) if p in known and p != n} for n in names}
    if any(n in edges.get(n, ()) for n in names):
        return None
    succs: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for p in preds[n]:
            succs[p].append(n)
    waiting = {n: len(preds[n]) for n in names}
    position = {n: i for i, n in enumerate(names)}
    ready = sorted((n for n in names if waiting[n] == 0), key=position.__getitem__)
    out: list[str] = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for s in succs[n]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
                ready.sort(key=position.__getitem__)
    return out if len(out) == len(names) else None


def compile_problem(problem: ShedProblem) -> Network:
    """Validate ``problem`` and derive arcs, orders and the effective shed points."""
    for name, rate in problem.rates.items():
        _check_name("source", name)
        check_number(f"rate of source {name!r}", rate)
    for node, cap in problem.capacities.items():
        _check_name("node", node)
        check_number(f"capacity of node {node!r}", cap)

    steps: dict[str, StepLoad] = {}
    for step in problem.steps:
        _check_name("step", step.name)
        if step.name in steps or step.name in problem.rates:
            raise ValueError(
                f"step name {step.name!r} is used twice (steps and sources share names)"
            )
        if step.node not in problem.capacities:
            raise ValueError(f"step {step.name!r} is on node {step.node!r}, which has no capacity")
        check_number(f"cost of step {step.name!r}", step.cost)
        check_number(f"selectivity of step {step.name!r}", step.selectivity)
        if not step.inputs:
            raise ValueError(f"step {step.name!r} has no inputs")
        if len(set(step.inputs)) != len(step.inputs):
            raise ValueError(f"step {step.name!r} lists an input twice: {step.inputs}")
        steps[step.name] = step
    for step in problem.steps:
        for tail in step.inputs:
            if tail not in steps and tail not in problem.rates:
                raise ValueError(f"step {step.name!r} reads {tail!r}, which is no source or step")

    for name, weight in problem.utilities.items():
        if name not in steps:
            raise ValueError(f"utility given for {name!r}, which is not a step")
        check_number(f"utility of {name!r}", weight, nonnegative=False)

    topo = _topological(list(steps), {s.name: s.inputs for s in problem.steps})
    if topo is None:
        raise ValueError("the steps form a cycle; the query network must be a DAG")
    order = tuple(steps[n] for n in topo)

    arcs: dict[str, _Arc] = {}
    for step in order:
        for tail in step.inputs:
            a = _Arc(arc(tail, step.name), tail, step.name)
            arcs[a.name] = a
    source_arcs = tuple(a.name for a in arcs.values() if a.tail in problem.rates)

    if problem.shed_points is None:
        shed = tuple(
            a.name
            for a in arcs.values()
            if a.tail in problem.rates or steps[a.tail].node != steps[a.head].node
        )
    else:
        shed = tuple(problem.shed_points)
        unknown = [a for a in shed if a not in arcs]
        if unknown:
            raise ValueError(f"shed points {unknown} are not arcs of the network")
        if len(set(shed)) != len(shed):
            raise ValueError(f"shed points listed twice: {shed}")

    node_preds: dict[str, set[str]] = {n: set() for n in problem.capacities}
    for a in arcs.values():
        if a.tail in steps and steps[a.tail].node != steps[a.head].node:
            node_preds[steps[a.head].node].add(steps[a.tail].node)
    node_topo = _topological(list(problem.capacities), node_preds)

    return Network(
        problem=problem,
        order=order,
        arcs=arcs,
        source_arcs=source_arcs,
        shed_points=shed,
        node_order=None if node_topo is None else tuple(node_topo),
    )


def is_overloaded(load: float, capacity: float) -> bool:
    return load > capacity + FEASIBILITY_TOL * max(1.0, capacity)
