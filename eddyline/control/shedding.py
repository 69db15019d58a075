"""Coordinated load shedding as a linear program (pure Python, no Spark).

The model follows Tatbul, Çetintemel and Zdonik, "Staying FIT: efficient load shedding techniques
for distributed stream processing" (VLDB 2007). A query network is a DAG of *steps* placed on
*nodes*; for Eddyline a node is a Spark stage or a lane group, and its capacity is the cost it
can spend per second. Sources arrive at rates ``r_k``; a step costs ``cost`` per input tuple and
emits ``selectivity`` tuples per input tuple. Shedding happens on *arcs* (``"tail->head"``): the
arc lets through a keep fraction ``x`` of what arrives on it and drops the rest. A step's input
rate is the sum of its input arcs' rates (multi-input steps are unions or merges; a join, whose
output is not linear in its input rates, is outside this model). The value of a plan is
``sum_q w_q * throughput_q`` over the query outputs ``q`` named in ``utilities``.

**Formulation.** Keep fractions multiply along a path, so with several shed points on one path
the rates are products of variables. FIT sidesteps that by allowing at most one shed point per
path. Here the variables are instead the *admitted rates* ``y_a`` on the shed arcs. In that
variable every rate in the network is affine (walk the DAG in topological order: a shed arc
contributes ``y_a``, any other arc the output of its tail, a step multiplies its summed input by
its selectivity), and the only thing a keep fraction in ``[0, 1]`` requires is

    0 <= y_a <= offered_a(y)

where ``offered_a(y)`` is what reaches the tail of ``a``, itself affine in the ``y`` of the shed
arcs upstream of ``a``. Every feasible ``y`` is produced by exactly one choice of keep fractions
(``x_a = y_a / offered_a(y)``, taken as 1 where nothing arrives), and vice versa, so the LP

    maximise   sum_q w_q out_q(y)
    subject to load_n(y) <= capacity_n          for every node n
               y_a - offered_a(y) <= 0          for every shed arc with shed arcs upstream
               0 <= y_a <= offered_a            for every other shed arc (offered is constant)

is exact for any DAG and any set of shed points: chains, fan-out (one source feeding several
queries), fan-in and several shed points on one path. Its assumptions are the usual ones of the
fluid model: steady rates, costs linear in the input rate, and selectivities that shedding does
not change (true for random shedding; semantic shedding changes the mix, which the model
ignores).

**Tie-break.** Several plans often reach the same utility, e.g. dropping tuples at a source or
dropping the same tuples later at the overloaded node. Among the utility-optimal plans
:func:`solve` takes the one of least total utilisation ``sum_n load_n / capacity_n`` (by
re-solving with the objective perturbed by a tiny multiple of the utilisation, and keeping the
result only if its utility is still optimal). That puts every drop as early as it can go, so
upstream nodes do not spend capacity on tuples that are dropped downstream; a branch that feeds
no query output of positive utility is shed entirely. The shadow prices reported are those of
the unperturbed LP.

**Default shed points.** With ``shed_points=None`` drops are allowed on every arc that leaves a
source (input-side shedding) and on every arc whose tail is a step on another node than its head
(the neighbourhood arcs between nodes, where one node can shed on behalf of its downstream
neighbour). Arcs inside one node are not shed points by default; name them explicitly to allow
them.

**Overload.** :func:`evaluate` reports each node's *offered* load. When a node's offered load
exceeds its capacity, the node is assumed to process only ``capacity / load`` of what enters it
from outside (sources or other nodes) and nothing of the rest, so its outputs shrink by that
factor; downstream nodes see the shrunken rates. That is the behaviour of an overloaded node in
the seed example below, and it needs the graph of nodes to be acyclic when some node is
overloaded. ``scale_overloaded=False`` evaluates the plain fluid model instead.

Seed example (two sources at 1 tuple/s, node A with boxes of cost 1 and 2, node B with boxes of
cost 3 and 1 after them, both capacities 1): no shedding loads A at 3 and, A processing a third,
B at 4/3; the LP keeps ``(1/5, 2/5)`` of the inputs, loads both nodes at exactly 1 and delivers a
throughput of 3/5.

The LP is solved with SciPy's HiGHS (``scipy.optimize.linprog(method="highs")``); the problems
have one variable per shed arc, so it is instantaneous.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = [
    "ARC_SEPARATOR",
    "FEASIBILITY_TOL",
    "ShedPlan",
    "ShedProblem",
    "StepLoad",
    "arc",
    "evaluate",
    "is_feasible",
    "solve",
    "uniform_plan",
]

#: Separator between the tail and the head of an arc name: ``"source_or_step->step"``.
ARC_SEPARATOR = "->"

#: A node counts as overloaded when its load exceeds ``capacity + FEASIBILITY_TOL * max(1, capacity)``.
FEASIBILITY_TOL = 1e-9


def arc(tail: str, head: str) -> str:
    """The name of the arc from ``tail`` (a source or a step) into step ``head``."""
    return f"{tail}{ARC_SEPARATOR}{head}"


@dataclass(frozen=True)
class StepLoad:
    """One step of the query network, as the shedding model sees it.

    ``cost`` is in capacity units per input tuple, ``selectivity`` is output tuples per input
    tuple, and ``inputs`` names sources or other steps (their rates are summed).
    """

    name: str
    node: str
    cost: float
    selectivity: float
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class ShedProblem:
    """A query network with its input rates, node capacities and query-output utilities.

    ``utilities`` maps the names of steps whose output is a query output to the value of one
    output tuple (any finite number). ``shed_points`` lists the arcs where tuples may be dropped,
    as ``"tail->head"``; ``None`` means every arc leaving a source plus every arc between two
    nodes (see the module docstring).
    """

    rates: dict[str, float]
    steps: tuple[StepLoad, ...]
    capacities: dict[str, float]
    utilities: dict[str, float]
    shed_points: tuple[str, ...] | None = None
    #: optional upper bounds on the rate admitted through a shed arc (e.g. no more than a step
    #: has ever been measured at); the LP spends the capacity this leaves elsewhere
    max_admitted: dict[str, float] | None = None


@dataclass(frozen=True)
class ShedPlan:
    """Keep fractions on arcs and what they lead to.

    ``keep`` maps arcs to the fraction of arriving tuples let through (arcs not listed keep
    everything); ``node_load`` is the offered load per node in capacity units per second;
    ``throughput`` is the output rate of each query output; ``utility`` is
    ``sum_q utilities[q] * throughput[q]``. ``status`` is ``"optimal"`` or ``"infeasible"``
    (:func:`solve`), ``"feasible"`` or ``"overloaded"`` (:func:`evaluate`), or ``"uniform"``
    (:func:`uniform_plan`). ``explanation`` holds the inputs and diagnostics as plain JSON data.
    """

    keep: dict[str, float]
    node_load: dict[str, float]
    throughput: dict[str, float]
    utility: float
    status: str
    explanation: dict[str, Any]


# --------------------------------------------------------------------------- network compilation


@dataclass(frozen=True)
class _Arc:
    name: str
    tail: str
    head: str


@dataclass(frozen=True)
class _Network:
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


def _check_number(what: str, value: object, *, nonnegative: bool = True) -> float:
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


def _compile(problem: ShedProblem) -> _Network:
    """Validate ``problem`` and derive arcs, orders and the effective shed points."""
    for name, rate in problem.rates.items():
        _check_name("source", name)
        _check_number(f"rate of source {name!r}", rate)
    for node, cap in problem.capacities.items():
        _check_name("node", node)
        _check_number(f"capacity of node {node!r}", cap)

    steps: dict[str, StepLoad] = {}
    for step in problem.steps:
        _check_name("step", step.name)
        if step.name in steps or step.name in problem.rates:
            raise ValueError(
                f"step name {step.name!r} is used twice (steps and sources share names)"
            )
        if step.node not in problem.capacities:
            raise ValueError(f"step {step.name!r} is on node {step.node!r}, which has no capacity")
        _check_number(f"cost of step {step.name!r}", step.cost)
        _check_number(f"selectivity of step {step.name!r}", step.selectivity)
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
        _check_number(f"utility of {name!r}", weight, nonnegative=False)

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

    return _Network(
        problem=problem,
        order=order,
        arcs=arcs,
        source_arcs=source_arcs,
        shed_points=shed,
        node_order=None if node_topo is None else tuple(node_topo),
    )


def _overloaded(load: float, capacity: float) -> bool:
    return load > capacity + FEASIBILITY_TOL * max(1.0, capacity)


# --------------------------------------------------------------------------- evaluation


def _check_keep(net: _Network, keep: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in keep.items():
        if name not in net.arcs:
            raise ValueError(f"keep fraction given for {name!r}, which is not an arc")
        fraction = _check_number(f"keep fraction of {name!r}", value)
        if fraction > 1.0:
            raise ValueError(f"keep fraction of {name!r} must be in [0, 1], got {value!r}")
        out[name] = fraction
    return out


def _flows(
    net: _Network, keep: Mapping[str, float], scale_overloaded: bool
) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, float]]:
    """Step input rates, step output rates, offered node loads and node processing fractions."""
    problem = net.problem
    out: dict[str, float] = {k: float(v) for k, v in problem.rates.items()}
    step_in: dict[str, float] = {}

    def run(step: StepLoad) -> None:
        rate = sum(keep.get(arc(t, step.name), 1.0) * out[t] for t in step.inputs)
        step_in[step.name] = rate
        out[step.name] = step.selectivity * rate

    def load_of(node: str) -> float:
        return sum(s.cost * step_in[s.name] for s in net.order if s.node == node)

    fraction = {node: 1.0 for node in problem.capacities}
    for step in net.order:
        run(step)
    loads = {node: load_of(node) for node in problem.capacities}
    overloaded = [n for n in problem.capacities if _overloaded(loads[n], problem.capacities[n])]
    if scale_overloaded and overloaded:
        if net.node_order is None:
            raise ValueError(
                "an overloaded node can only be scaled when the nodes form a DAG; "
                "evaluate with scale_overloaded=False"
            )
        # Node by node, upstream first: a node's inputs from other nodes are final; within the
        # node every rate is linear in what enters it, so scaling the entry scales them all.
        for node in net.node_order:
            here = [s for s in net.order if s.node == node]
            for step in here:
                run(step)
            loads[node] = load_of(node)
            cap = problem.capacities[node]
            if _overloaded(loads[node], cap):
                fraction[node] = cap / loads[node]
                for step in here:
                    step_in[step.name] *= fraction[node]
                    out[step.name] *= fraction[node]
    step_out = {s.name: out[s.name] for s in net.order}
    return step_in, step_out, loads, fraction


def _plan_from_flows(
    net: _Network,
    keep: dict[str, float],
    *,
    scale_overloaded: bool,
    status: str | None,
    explanation: dict[str, Any],
) -> ShedPlan:
    problem = net.problem
    step_in, step_out, loads, fraction = _flows(net, keep, scale_overloaded)
    throughput = {q: step_out[q] for q in problem.utilities}
    utility = float(sum(float(w) * throughput[q] for q, w in problem.utilities.items()))
    overloaded = sorted(n for n, cap in problem.capacities.items() if _overloaded(loads[n], cap))
    explanation = {
        **explanation,
        "scale_overloaded": scale_overloaded,
        "overloaded_nodes": overloaded,
        "node_fraction_processed": fraction,
        "step_input": step_in,
        "step_output": step_out,
        "capacities": {n: float(c) for n, c in problem.capacities.items()},
    }
    return ShedPlan(
        keep=keep,
        node_load=loads,
        throughput=throughput,
        utility=utility,
        status=status if status is not None else ("overloaded" if overloaded else "feasible"),
        explanation=explanation,
    )


def evaluate(
    problem: ShedProblem, keep: Mapping[str, float], *, scale_overloaded: bool = True
) -> ShedPlan:
    """Loads, throughputs and utility of the given keep fractions, without optimising.

    ``keep`` may name any arc of the network; arcs it does not name keep everything. The returned
    plan lists every shed point of ``problem`` (1.0 where not given) plus the arcs in ``keep``.
    With ``scale_overloaded`` (the default) an overloaded node processes ``capacity / load`` of
    its input and passes on correspondingly less; ``node_load`` is always the offered load.
    ``status`` is ``"overloaded"`` if any node's offered load exceeds its capacity (beyond
    :data:`FEASIBILITY_TOL`), else ``"feasible"``. The explanation adds the per-step input and
    output rates and each node's processed fraction.
    """
    net = _compile(problem)
    given = _check_keep(net, keep)
    full = {a: 1.0 for a in net.shed_points}
    full.update(given)
    return _plan_from_flows(
        net,
        full,
        scale_overloaded=scale_overloaded,
        status=None,
        explanation={"method": "evaluate"},
    )


def is_feasible(problem: ShedProblem, plan: ShedPlan, *, tol: float = FEASIBILITY_TOL) -> bool:
    """Whether every node's load in ``plan`` is within its capacity (``tol`` relative to max(1, cap))."""
    return all(
        plan.node_load.get(node, 0.0) <= cap + tol * max(1.0, cap)
        for node, cap in problem.capacities.items()
    )


def uniform_plan(problem: ShedProblem) -> ShedPlan:
    """Baseline: the largest common keep fraction on every source arc that no node overloads.

    Every rate in the network is proportional to the source rates, so keeping a fraction ``x``
    of every source scales every node's load by ``x``: the answer is
    ``min(1, min_n capacity_n / load_n)`` over the nodes with a positive unshed load. The plan
    sheds at all source arcs whatever ``problem.shed_points`` says (it is a baseline, not a
    constrained optimum).
    """
    net = _compile(problem)
    _, _, full_load, _ = _flows(net, {}, scale_overloaded=False)
    x = 1.0
    for node, load in full_load.items():
        if load > 0:
            x = min(x, float(problem.capacities[node]) / load)
    binding = sorted(
        n for n, load in full_load.items() if load > 0 and problem.capacities[n] / load <= x
    )
    keep = {a: x for a in net.source_arcs}
    return _plan_from_flows(
        net,
        keep,
        scale_overloaded=False,
        status="uniform",
        explanation={
            "method": "uniform",
            "keep_fraction": x,
            "binding_nodes": binding if x < 1.0 else [],
            "unshed_load": full_load,
        },
    )


# --------------------------------------------------------------------------- the linear program


@dataclass(frozen=True)
class _LinearModel:
    """Everything in the network as affine functions ``v[0] + v[1:] @ y`` of the admitted rates."""

    variables: tuple[str, ...]
    offered: dict[str, np.ndarray]  # per shed arc: what reaches its tail
    loads: dict[str, np.ndarray]  # per node
    objective: np.ndarray  # sum_q w_q out_q
    capacities: dict[str, float]
    max_admitted: dict[str, float]

    def rows(self) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]], np.ndarray]:
        """``A_ub``, ``b_ub`` and a description of each row, plus the variables' upper bounds."""
        m = len(self.variables)
        a_rows: list[np.ndarray] = []
        b_rows: list[float] = []
        meta: list[dict[str, Any]] = []
        for node, load in self.loads.items():
            a_rows.append(load[1:])
            b_rows.append(self.capacities[node] - load[0])
            meta.append({"kind": "capacity", "node": node})
        upper = np.full(m, np.inf)
        for i, name in enumerate(self.variables):
            offered = self.offered[name]
            if np.any(offered[1:] != 0):
                row = -offered[1:].copy()
                row[i] += 1.0
                a_rows.append(row)
                b_rows.append(float(offered[0]))
                meta.append({"kind": "flow", "arc": name})
            else:
                upper[i] = float(offered[0])
            if name in self.max_admitted:
                upper[i] = min(upper[i], max(0.0, float(self.max_admitted[name])))
        a_ub = np.array(a_rows, dtype=float).reshape(len(a_rows), m)
        return a_ub, np.array(b_rows, dtype=float), meta, upper


def _linear_model(net: _Network) -> _LinearModel:
    problem = net.problem
    variables = net.shed_points
    index = {a: i + 1 for i, a in enumerate(variables)}
    size = len(variables) + 1

    def constant(value: float) -> np.ndarray:
        v = np.zeros(size)
        v[0] = value
        return v

    out: dict[str, np.ndarray] = {k: constant(float(r)) for k, r in problem.rates.items()}
    step_in: dict[str, np.ndarray] = {}
    offered: dict[str, np.ndarray] = {}
    for step in net.order:
        total = np.zeros(size)
        for tail in step.inputs:
            name = arc(tail, step.name)
            if name in index:
                offered[name] = out[tail]
                total[index[name]] += 1.0
            else:
                total += out[tail]
        step_in[step.name] = total
        out[step.name] = float(step.selectivity) * total
    loads = {node: np.zeros(size) for node in problem.capacities}
    for step in net.order:
        loads[step.node] = loads[step.node] + float(step.cost) * step_in[step.name]
    objective = np.zeros(size)
    for q, w in problem.utilities.items():
        objective = objective + float(w) * out[q]
    return _LinearModel(
        variables=variables,
        offered=offered,
        loads=loads,
        objective=objective,
        capacities={n: float(c) for n, c in problem.capacities.items()},
        max_admitted=dict(problem.max_admitted or {}),
    )


@dataclass(frozen=True)
class _LPResult:
    status: Literal["optimal", "infeasible", "error"]
    x: np.ndarray | None
    duals: np.ndarray | None  # shadow prices of the A_ub rows for the maximisation, >= 0
    message: str
    solver: str


def _maximise(c: np.ndarray, a_ub: np.ndarray, b_ub: np.ndarray, upper: np.ndarray) -> _LPResult:
    """``max c @ x`` subject to ``a_ub @ x <= b_ub`` and ``0 <= x <= upper``, by HiGHS."""
    if c.size == 0:  # no shed points: the only question is whether the fixed loads fit
        solver = "none (no variables)"
        if np.all(b_ub >= -FEASIBILITY_TOL * np.maximum(1.0, np.abs(b_ub))):
            return _LPResult("optimal", np.zeros(0), np.zeros(b_ub.size), "optimal", solver)
        return _LPResult("infeasible", None, None, "the fixed loads exceed a capacity", solver)
    # imported here: SciPy's optimizer takes half a second to import, which every driver start
    # (and every crash test's restart) would pay for a solver only overload control calls
    from scipy.optimize import linprog

    bounds = [(0.0, None if math.isinf(u) else float(u)) for u in upper]
    rows = a_ub.shape[0] > 0
    res = linprog(
        -c,
        A_ub=a_ub if rows else None,
        b_ub=b_ub if rows else None,
        bounds=bounds,
        method="highs",
    )
    if res.status == 0:
        marginals = np.asarray(res.ineqlin.marginals, dtype=float) if rows else np.zeros(0)
        return _LPResult(
            "optimal", np.asarray(res.x, dtype=float), -marginals, res.message, "highs"
        )
    status: Literal["infeasible", "error"] = "infeasible" if res.status == 2 else "error"
    return _LPResult(status, None, None, str(res.message), "highs")


def _coefficients(variables: tuple[str, ...], vector: np.ndarray) -> dict[str, float]:
    return {v: float(c) for v, c in zip(variables, vector, strict=True) if c != 0.0}


def solve(problem: ShedProblem) -> ShedPlan:
    """The shedding plan of maximum utility that loads no node beyond its capacity.

    Among the utility-optimal plans it picks the one of least total utilisation (see the module
    docstring). The LP is solved by HiGHS (``scipy.optimize.linprog(method="highs")``). The plan's
    ``keep`` covers every shed point; ``status`` is ``"optimal"``, or ``"infeasible"`` when load
    that no shed point can remove already exceeds some capacity (the plan then keeps nothing at
    any shed point and is evaluated without scaling). ``explanation`` carries the LP (variables,
    objective, rows with their slack and shadow price) as JSON data.
    """
    net = _compile(problem)
    model = _linear_model(net)
    a_ub, b_ub, meta, upper = model.rows()
    variables = model.variables
    base: dict[str, Any] = {
        "method": "lp",
        "model": "admitted rates on shed arcs (Tatbul et al., VLDB 2007, fluid model)",
        "shed_points": list(variables),
        "objective": {
            "constant": float(model.objective[0]),
            "coefficients": _coefficients(variables, model.objective[1:]),
        },
        "upper_bounds": {
            v: float(u) for v, u in zip(variables, upper, strict=True) if np.isfinite(u)
        },
    }

    first = _maximise(model.objective[1:], a_ub, b_ub, upper)
    if first.status != "optimal" or first.x is None:
        unsheddable = {
            node: float(load[0])
            for node, load in model.loads.items()
            if _overloaded(float(load[0]), float(problem.capacities[node]))
        }
        return _plan_from_flows(
            net,
            {a: 0.0 for a in variables},
            scale_overloaded=False,
            status="infeasible" if first.status == "infeasible" else f"error: {first.message}",
            explanation={
                **base,
                "solver": first.solver,
                "message": first.message,
                "unsheddable_load": unsheddable,
            },
        )

    best = float(model.objective[1:] @ first.x)
    y = first.x
    # Tie-break: among the utility-optimal plans, the one of least total utilisation. A second
    # LP with the utility pinned at ``best`` would need a tolerance that the solver then trades
    # against utilisation; instead the objective is perturbed by ``-eps * utilisation``. The
    # perturbed optimum is a vertex of the same polytope (so exact), and if its utility is still
    # ``best`` it has the least utilisation of all plans of utility ``best`` (any other would
    # score higher on the perturbed objective). Otherwise ``eps`` was too large: try a smaller.
    weights = np.zeros(len(variables))
    for node, load in model.loads.items():
        cap = float(problem.capacities[node])
        weights += load[1:] / cap if cap > 0 else load[1:]
    tie_break = "none needed"
    if len(variables) and np.any(weights != 0):
        tie_break = "skipped (no perturbation kept the optimal utility)"
        scale = (abs(best) if best != 0 else 1.0) / max(1, len(problem.capacities))
        # The perturbation costs at most ``relative * |best|`` of utility; it has to stay well
        # above the solver's optimality tolerance (1e-7 for HiGHS) to be acted on at all.
        for relative in (1e-3, 1e-5, 1e-7):
            second = _maximise(model.objective[1:] - relative * scale * weights, a_ub, b_ub, upper)
            if second.x is None:
                continue
            if float(model.objective[1:] @ second.x) >= best - (1e-9 * abs(best) + 1e-15):
                y = second.x
                tie_break = "least total utilisation among utility-optimal plans"
                break

    y = np.maximum(y, 0.0)
    keep: dict[str, float] = {}
    for i, name in enumerate(variables):
        offered = float(model.offered[name][0] + model.offered[name][1:] @ y)
        keep[name] = 1.0 if offered <= 1e-12 else min(1.0, max(0.0, float(y[i]) / offered))

    nodes: dict[str, dict[str, Any]] = {}
    flows: list[dict[str, Any]] = []
    duals = first.duals if first.duals is not None else np.zeros(len(meta))
    for row, info, rhs, dual in zip(a_ub, meta, b_ub, duals, strict=True):
        slack = float(rhs - row @ y)
        if info["kind"] == "capacity":
            node = info["node"]
            cap = float(problem.capacities[node])
            nodes[node] = {
                "capacity": cap,
                "load": cap - slack,
                "slack": slack,
                "utilisation": (cap - slack) / cap if cap > 0 else None,
                "shadow_price": float(dual),
                "constant_load": float(model.loads[node][0]),
                "coefficients": _coefficients(variables, row),
            }
        else:
            flows.append(
                {
                    "arc": info["arc"],
                    "coefficients": _coefficients(variables, row),
                    "rhs": float(rhs),
                    "slack": slack,
                    "shadow_price": float(dual),
                }
            )
    return _plan_from_flows(
        net,
        keep,
        scale_overloaded=False,
        status="optimal",
        explanation={
            **base,
            "solver": first.solver,
            "message": first.message,
            "optimal_utility": best,
            "tie_break": tie_break,
            "admitted_rates": {v: float(r) for v, r in zip(variables, y, strict=True)},
            "nodes": nodes,
            "flow_constraints": flows,
        },
    )
