"""What a plan does: the flows it lets through, the load it puts on each node, and its utility."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eddyline.control.shedding.network import Network, check_number, compile_problem, is_overloaded
from eddyline.control.shedding.problem import FEASIBILITY_TOL, ShedPlan, ShedProblem, StepLoad, arc


def _check_keep(net: Network, keep: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in keep.items():
        if name not in net.arcs:
            raise ValueError(f"keep fraction given for {name!r}, which is not an arc")
        fraction = check_number(f"keep fraction of {name!r}", value)
        if fraction > 1.0:
            raise ValueError(f"keep fraction of {name!r} must be in [0, 1], got {value!r}")
        out[name] = fraction
    return out


def _flows(
    net: Network, keep: Mapping[str, float], scale_overloaded: bool
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
    overloaded = [n for n in problem.capacities if is_overloaded(loads[n], problem.capacities[n])]
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
            if is_overloaded(loads[node], cap):
                fraction[node] = cap / loads[node]
                for step in here:
                    step_in[step.name] *= fraction[node]
                    out[step.name] *= fraction[node]
    step_out = {s.name: out[s.name] for s in net.order}
    return step_in, step_out, loads, fraction


def plan_from_flows(
    net: Network,
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
    overloaded = sorted(n for n, cap in problem.capacities.items() if is_overloaded(loads[n], cap))
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
    net = compile_problem(problem)
    given = _check_keep(net, keep)
    full = {a: 1.0 for a in net.shed_points}
    full.update(given)
    return plan_from_flows(
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
    net = compile_problem(problem)
    _, _, full_load, _ = _flows(net, {}, scale_overloaded=False)
    x = 1.0
    for node, load in full_load.items():
        if load > 0:
            x = min(x, float(problem.capacities[node]) / load)
    binding = sorted(
        n for n, load in full_load.items() if load > 0 and problem.capacities[n] / load <= x
    )
    keep = {a: x for a in net.source_arcs}
    return plan_from_flows(
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
