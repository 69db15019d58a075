"""The linear program: keep fractions that maximise utility with every node within capacity (HiGHS)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from eddyline.control.shedding.evaluation import plan_from_flows
from eddyline.control.shedding.network import Network, compile_problem, is_overloaded
from eddyline.control.shedding.problem import FEASIBILITY_TOL, ShedPlan, ShedProblem, arc


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


def _linear_model(net: Network) -> _LinearModel:
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
    net = compile_problem(problem)
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
            if is_overloaded(float(load[0]), float(problem.capacities[node]))
        }
        return plan_from_flows(
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
    y, tie_break = _least_utilisation(model, problem, a_ub, b_ub, upper, best, first.x)

    y = np.maximum(y, 0.0)
    keep: dict[str, float] = {}
    for i, name in enumerate(variables):
        offered = float(model.offered[name][0] + model.offered[name][1:] @ y)
        keep[name] = 1.0 if offered <= 1e-12 else min(1.0, max(0.0, float(y[i]) / offered))

    duals = first.duals if first.duals is not None else np.zeros(len(meta))
    nodes, flows = _rows_report(model, problem, a_ub, b_ub, meta, duals, y)
    return plan_from_flows(
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


def _least_utilisation(
    model: _LinearModel,
    problem: ShedProblem,
    a_ub: np.ndarray,
    b_ub: np.ndarray,
    upper: np.ndarray,
    best: float,
    y: np.ndarray,
) -> tuple[np.ndarray, str]:
    """Of the plans of utility ``best`` (``y`` one of them), the one of least total utilisation,
    and how it was found."""
    variables = model.variables
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
                return second.x, "least total utilisation among utility-optimal plans"
    return y, tie_break


def _rows_report(
    model: _LinearModel,
    problem: ShedProblem,
    a_ub: np.ndarray,
    b_ub: np.ndarray,
    meta: list[dict[str, Any]],
    duals: np.ndarray,
    y: np.ndarray,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Each LP row at the plan ``y``: capacity rows per node, flow rows as a list."""
    variables = model.variables
    nodes: dict[str, dict[str, Any]] = {}
    flows: list[dict[str, Any]] = []
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
    return nodes, flows
