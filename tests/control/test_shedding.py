"""Coordinated load shedding as an LP (the FIT seed example, neighbourhood shedding, weighted
utilities, random networks against the uniform baseline) and the quality of scaled aggregates."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.control.quality import scaled_estimate
from eddyline.control.shedding import (
    ShedPlan,
    ShedProblem,
    StepLoad,
    arc,
    evaluate,
    is_feasible,
    solve,
    uniform_plan,
)
from eddyline.operators.shed import keep_mask_random

# The seed example: two inputs at 1 tuple/s; node A runs a box of cost 1 on input 1 and a box of
# cost 2 on input 2; node B runs a box of cost 3 after the first and a box of cost 1 after the
# second. Both capacities are 1 and both query outputs are worth 1 per tuple.
IN1, IN2 = arc("in1", "a1"), arc("in2", "a2")
B1, B2 = arc("a1", "b1"), arc("a2", "b2")


def seed_problem(
    cap_a: float = 1.0,
    cap_b: float = 1.0,
    utilities: dict[str, float] | None = None,
    shed_points: tuple[str, ...] | None = None,
) -> ShedProblem:
    return ShedProblem(
        rates={"in1": 1.0, "in2": 1.0},
        steps=(
            StepLoad("a1", "A", 1.0, 1.0, ("in1",)),
            StepLoad("a2", "A", 2.0, 1.0, ("in2",)),
            StepLoad("b1", "B", 3.0, 1.0, ("a1",)),
            StepLoad("b2", "B", 1.0, 1.0, ("a2",)),
        ),
        capacities={"A": cap_a, "B": cap_b},
        utilities=utilities if utilities is not None else {"b1": 1.0, "b2": 1.0},
        shed_points=shed_points,
    )


def approx(value: float | Fraction) -> object:
    return pytest.approx(float(value), abs=1e-9)


F = Fraction
# plan -> (rates admitted at A, A.load, A.throughput, B.load, B.throughput), from the seed table.
SEED_TABLE = {
    0: ((1, 1), 3, (F(1, 3), F(1, 3)), F(4, 3), (F(1, 4), F(1, 4))),
    1: ((1, 0), 1, (1, 0), 3, (F(1, 3), 0)),
    2: ((0, F(1, 2)), 1, (0, F(1, 2)), F(1, 2), (0, F(1, 2))),
    3: ((F(1, 5), F(2, 5)), 1, (F(1, 5), F(2, 5)), 1, (F(1, 5), F(2, 5))),
}


# --------------------------------------------------------------------------- (a) the seed table


@pytest.mark.parametrize("plan", sorted(SEED_TABLE))
def test_evaluate_reproduces_the_seed_table(plan: int) -> None:
    rates, a_load, a_out, b_load, b_out = SEED_TABLE[plan]
    result = evaluate(seed_problem(), {IN1: float(rates[0]), IN2: float(rates[1])})
    assert result.node_load["A"] == approx(a_load)
    assert result.node_load["B"] == approx(b_load)
    out = result.explanation["step_output"]
    # A overloaded (plan 0) processes capacity/load = 1/3 of its input; B then sees 1/3, 1/3,
    # is loaded at 4/3 and processes 3/4 of that, giving 1/4, 1/4.
    assert (out["a1"], out["a2"]) == (approx(a_out[0]), approx(a_out[1]))
    assert (result.throughput["b1"], result.throughput["b2"]) == (
        approx(b_out[0]),
        approx(b_out[1]),
    )
    assert result.utility == approx(b_out[0] + b_out[1])


def test_plain_fluid_model_does_not_scale_an_overloaded_node() -> None:
    result = evaluate(seed_problem(), {}, scale_overloaded=False)
    assert result.status == "overloaded"
    assert result.node_load == {"A": approx(3), "B": approx(4)}
    assert result.throughput == {"b1": approx(1), "b2": approx(1)}
    scaled = evaluate(seed_problem(), {})
    assert scaled.explanation["node_fraction_processed"] == {
        "A": approx(F(1, 3)),
        "B": approx(F(3, 4)),
    }


# --------------------------------------------------------------------------- (b) the LP optimum


def test_solve_finds_the_seed_optimum() -> None:
    problem = seed_problem()
    plan = solve(problem)
    assert plan.status == "optimal"
    assert plan.explanation["solver"] == "highs"
    assert plan.keep[IN1] == approx(F(1, 5))
    assert plan.keep[IN2] == approx(F(2, 5))
    assert plan.keep[B1] == approx(1) and plan.keep[B2] == approx(1)  # nothing shed at B
    assert plan.utility == approx(F(3, 5))
    assert plan.throughput == {"b1": approx(F(1, 5)), "b2": approx(F(2, 5))}
    assert all(load <= 1 + 1e-9 for load in plan.node_load.values())
    assert is_feasible(problem, plan)
    # Both nodes are binding; the shadow prices solve lambda_A + 3 lambda_B = 1 and
    # 2 lambda_A + lambda_B = 1 (the utility of one more unit of capacity on each node).
    nodes = plan.explanation["nodes"]
    assert nodes["A"]["shadow_price"] == approx(F(2, 5))
    assert nodes["B"]["shadow_price"] == approx(F(1, 5))
    assert nodes["A"]["slack"] == approx(0) and nodes["B"]["slack"] == approx(0)
    json.dumps(plan.explanation)  # JSON-able


def test_plan_optimal_for_a_alone_is_infeasible_for_b() -> None:
    # With B unconstrained the LP reproduces plan 1 ...
    alone = solve(seed_problem(cap_b=1e9))
    assert (alone.keep[IN1], alone.keep[IN2]) == (approx(1), approx(0))
    assert alone.node_load["A"] == approx(1)
    # ... which overloads B threefold.
    plan1 = evaluate(seed_problem(), {IN1: 1.0, IN2: 0.0})
    assert plan1.status == "overloaded"
    assert plan1.explanation["overloaded_nodes"] == ["B"]
    assert not is_feasible(seed_problem(), plan1)
    # Plan 2 is feasible on both nodes, but worse than the LP's plan 3.
    plan2 = evaluate(seed_problem(), {IN1: 0.0, IN2: 0.5})
    assert plan2.status == "feasible" and is_feasible(seed_problem(), plan2)
    assert plan2.utility == approx(F(1, 2))
    assert plan2.utility < solve(seed_problem()).utility - 0.09


def test_uniform_baseline_on_the_seed_example() -> None:
    # Without shedding B would be loaded at 4, so every input keeps 1/4.
    plan = uniform_plan(seed_problem())
    assert plan.status == "uniform"
    assert plan.keep == {IN1: approx(F(1, 4)), IN2: approx(F(1, 4))}
    assert plan.node_load == {"A": approx(F(3, 4)), "B": approx(1)}
    assert plan.utility == approx(F(1, 2))
    assert plan.explanation["binding_nodes"] == ["B"]


# --------------------------------------------------------------------------- (c) neighbourhood


def test_neighbourhood_shedding_drops_upstream_of_the_overloaded_node() -> None:
    # Only B is overloaded (A has room to spare). The LP may drop at A's inputs or at B's; it
    # drops at A's inputs, so A does not spend capacity on tuples that B would drop.
    problem = seed_problem(cap_a=10.0)
    plan = solve(problem)
    assert plan.utility == approx(1)
    assert (plan.keep[IN1], plan.keep[IN2]) == (approx(0), approx(1))
    assert (plan.keep[B1], plan.keep[B2]) == (approx(1), approx(1))
    assert plan.node_load == {"A": approx(2), "B": approx(1)}

    # The same shedding done at B's inputs only: the same utility, but A does 50 % more work.
    at_b = solve(seed_problem(cap_a=10.0, shed_points=(B1, B2)))
    assert at_b.utility == approx(plan.utility)
    assert (at_b.keep[B1], at_b.keep[B2]) == (approx(0), approx(1))
    assert at_b.node_load["A"] == approx(3)
    assert at_b.node_load["A"] > plan.node_load["A"]


def test_neighbourhood_shedding_when_a_is_also_tight() -> None:
    problem = seed_problem(cap_a=2.0)
    plan = solve(problem)
    assert plan.status == "optimal"
    assert (plan.keep[IN1], plan.keep[IN2]) == (approx(0), approx(1))
    assert plan.utility == approx(1)
    assert plan.node_load == {"A": approx(2), "B": approx(1)}

    # Shedding only at B's inputs cannot relieve A: the LP is infeasible ...
    only_b = seed_problem(cap_a=2.0, shed_points=(B1, B2))
    infeasible = solve(only_b)
    assert infeasible.status == "infeasible"
    assert infeasible.explanation["unsheddable_load"] == {"A": approx(3)}
    # ... and with A overloaded (processing 2/3 of its input) the best B-only plan is worth 7/9.
    best = max(
        evaluate(only_b, {B1: i / 36, B2: j / 36}).utility for i in range(37) for j in range(37)
    )
    assert best == approx(F(7, 9))
    assert evaluate(only_b, {B1: 1 / 6, B2: 1.0}).utility == approx(F(7, 9))
    assert best < plan.utility - 0.2


def test_fan_out_after_the_source_needs_a_downstream_shed_point() -> None:
    # One source feeds step a on A, whose output fans out to a cheap and an expensive query on
    # B. Shedding at the source must starve both; the arcs into B can starve only the expensive.
    problem = ShedProblem(
        rates={"in": 1.0},
        steps=(
            StepLoad("a", "A", 1.0, 1.0, ("in",)),
            StepLoad("cheap", "B", 1.0, 1.0, ("a",)),
            StepLoad("costly", "B", 10.0, 1.0, ("a",)),
        ),
        capacities={"A": 5.0, "B": 2.0},
        utilities={"cheap": 1.0, "costly": 1.0},
    )
    plan = solve(problem)
    assert plan.keep == {
        arc("in", "a"): approx(1),
        arc("a", "cheap"): approx(1),
        arc("a", "costly"): approx(F(1, 10)),
    }
    assert plan.utility == approx(F(11, 10))
    only_source = solve(replace(problem, shed_points=(arc("in", "a"),)))
    assert only_source.utility == approx(F(4, 11))
    assert uniform_plan(problem).utility == approx(F(4, 11))


def test_several_shed_points_on_one_path() -> None:
    # A chain in -> s (A) -> t (B) plus a branch s -> u (B); shed points on every arc, so the
    # path in -> s -> t carries two of them. The admitted-rate LP stays exact.
    problem = ShedProblem(
        rates={"in": 4.0},
        steps=(
            StepLoad("s", "A", 1.0, 0.5, ("in",)),
            StepLoad("t", "B", 2.0, 1.0, ("s",)),
            StepLoad("u", "B", 1.0, 2.0, ("s",)),
        ),
        capacities={"A": 3.0, "B": 2.0},
        utilities={"t": 3.0, "u": 1.0},
        shed_points=(arc("in", "s"), arc("s", "t"), arc("s", "u")),
    )
    plan = solve(problem)
    # A admits 3 of the 4 tuples/s and s emits 1.5. On B, u earns 2 per unit of cost (two
    # outputs of weight 1 for cost 1) and t earns 1.5 (weight 3 for cost 2), so u takes all
    # 1.5 tuples/s (cost 1.5) and t the remaining 0.25 tuples/s (cost 0.5).
    assert plan.node_load == {"A": approx(3), "B": approx(2)}
    assert plan.throughput == {"t": approx(F(1, 4)), "u": approx(3)}
    assert plan.utility == approx(F(3, 4) + 3)
    assert evaluate(problem, plan.keep).utility == approx(plan.utility)


# --------------------------------------------------------------------------- (d) weights


@pytest.mark.parametrize(
    ("weights", "keep", "utility"),
    [
        ({"b1": 1.0, "b2": 1.0}, (F(1, 5), F(2, 5)), F(3, 5)),
        ({"b1": 5.0, "b2": 1.0}, (F(1, 3), 0), F(5, 3)),
        ({"b1": 1.0, "b2": 5.0}, (0, F(1, 2)), F(5, 2)),
    ],
)
def test_weighted_utilities_change_the_choice(
    weights: dict[str, float], keep: tuple[F, F], utility: F
) -> None:
    plan = solve(seed_problem(utilities=weights))
    assert (plan.keep[IN1], plan.keep[IN2]) == (approx(keep[0]), approx(keep[1]))
    assert plan.utility == approx(utility)


def test_output_of_no_value_is_shed_entirely() -> None:
    plan = solve(seed_problem(utilities={"b2": 1.0}))
    assert plan.keep[IN1] == approx(0)
    assert plan.keep[IN2] == approx(F(1, 2))
    assert plan.node_load == {"A": approx(1), "B": approx(F(1, 2))}


# --------------------------------------------------------------------------- validation


def test_invalid_problems_are_rejected() -> None:
    with pytest.raises(ValueError, match="cycle"):
        solve(
            ShedProblem(
                rates={"in": 1.0},
                steps=(
                    StepLoad("x", "A", 1.0, 1.0, ("in", "y")),
                    StepLoad("y", "A", 1.0, 1.0, ("x",)),
                ),
                capacities={"A": 1.0},
                utilities={"y": 1.0},
            )
        )
    with pytest.raises(ValueError, match="no source or step"):
        evaluate(
            ShedProblem({"in": 1.0}, (StepLoad("x", "A", 1, 1, ("nope",)),), {"A": 1.0}, {}), {}
        )
    with pytest.raises(ValueError, match="no capacity"):
        evaluate(ShedProblem({"in": 1.0}, (StepLoad("x", "Z", 1, 1, ("in",)),), {"A": 1.0}, {}), {})
    with pytest.raises(ValueError, match="not arcs"):
        solve(seed_problem(shed_points=("in1->b1",)))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        evaluate(seed_problem(), {IN1: 1.5})
    with pytest.raises(ValueError, match="not an arc"):
        evaluate(seed_problem(), {"in9->a1": 0.5})
    with pytest.raises(ValueError, match="non-negative"):
        evaluate(ShedProblem({"in": -1.0}, (), {}, {}), {})


def test_scaling_needs_acyclic_nodes_only_when_overloaded() -> None:
    # a (A) -> b (B) -> c (A): the nodes form a cycle although the steps do not.
    problem = ShedProblem(
        rates={"in": 1.0},
        steps=(
            StepLoad("a", "A", 1.0, 1.0, ("in",)),
            StepLoad("b", "B", 1.0, 1.0, ("a",)),
            StepLoad("c", "A", 1.0, 1.0, ("b",)),
        ),
        capacities={"A": 1.0, "B": 5.0},
        utilities={"c": 1.0},
    )
    with pytest.raises(ValueError, match="DAG"):
        evaluate(problem, {})
    assert evaluate(problem, {}, scale_overloaded=False).node_load == {"A": 2.0, "B": 1.0}
    plan = solve(problem)
    assert plan.utility == approx(F(1, 2))
    assert evaluate(problem, plan.keep).status == "feasible"


# --------------------------------------------------------------------------- (e) random networks


@st.composite
def networks(draw: st.DrawFn) -> ShedProblem:
    """Small random DAGs: chains, fan-out (several readers of one input) and fan-in (unions)."""
    number = st.floats(0.1, 5.0, allow_nan=False).map(lambda x: round(x, 3))
    n_sources = draw(st.integers(1, 3))
    nodes = ["N0", "N1", "N2"][: draw(st.integers(1, 3))]
    rates = {f"in{i}": draw(number) for i in range(n_sources)}
    names = list(rates)
    steps: list[StepLoad] = []
    for j in range(draw(st.integers(1, 6))):
        inputs = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
        steps.append(
            StepLoad(
                f"s{j}",
                draw(st.sampled_from(nodes)),
                draw(number),
                draw(st.floats(0.1, 2.0).map(lambda x: round(x, 3))),
                tuple(inputs),
            )
        )
        names.append(f"s{j}")
    consumed = {i for s in steps for i in s.inputs}
    sinks = [s.name for s in steps if s.name not in consumed]
    extra = draw(st.lists(st.sampled_from([s.name for s in steps]), max_size=2, unique=True))
    utilities = {q: draw(number) for q in dict.fromkeys(sinks + extra)}
    capacities = {n: draw(st.floats(0.05, 10.0).map(lambda x: round(x, 3))) for n in nodes}
    return ShedProblem(rates, tuple(steps), capacities, utilities)


def random_keeps(plan: ShedPlan, rng: np.random.Generator, count: int) -> list[dict[str, float]]:
    return [{a: float(rng.uniform()) for a in plan.keep} for _ in range(count)]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(networks(), st.integers(0, 2**32 - 1))
def test_solve_is_feasible_and_beats_uniform(problem: ShedProblem, seed: int) -> None:
    plan = solve(problem)
    assert plan.status == "optimal"
    assert is_feasible(problem, plan, tol=1e-7)
    assert all(0.0 <= k <= 1.0 for k in plan.keep.values())
    tol = 1e-7 * max(1.0, abs(plan.utility))
    # Same flows when the plan is replayed through evaluate.
    assert evaluate(problem, plan.keep, scale_overloaded=False).utility == pytest.approx(
        plan.utility, abs=tol
    )
    baseline = uniform_plan(problem)
    assert is_feasible(problem, baseline, tol=1e-7)
    assert plan.utility >= baseline.utility - tol
    # No random feasible plan over the same shed points does better.
    for keep in random_keeps(plan, np.random.default_rng(seed), 10):
        other = evaluate(problem, keep, scale_overloaded=False)
        if is_feasible(problem, other):
            assert other.utility <= plan.utility + tol
    json.dumps(plan.explanation)


# --------------------------------------------------------------------------- quality accounting


def test_scaled_estimate_values() -> None:
    z = NormalDist().inv_cdf(0.975)
    est = scaled_estimate(30, 60.0, 200.0, 0.5)
    assert est["count"] == 60.0 and est["sum"] == 120.0
    assert est["count_error"] == pytest.approx(z * math.sqrt(30 * 0.5 / 0.25))
    assert est["sum_error"] == pytest.approx(z * math.sqrt(200 * 0.5 / 0.25))
    assert est["keep"] == 0.5 and est["confidence"] == 0.95
    assert scaled_estimate(3, None, None, 0.5)["sum"] is None
    assert scaled_estimate(3, 2.0, None, 0.5)["sum_error"] is None
    wider = scaled_estimate(30, 60.0, 200.0, 0.5, confidence=0.99)
    assert wider["count_error"] > est["count_error"]


def test_scaled_estimate_is_exact_without_shedding() -> None:
    est = scaled_estimate(17, 42.5, 300.0, 1.0)
    assert (est["count"], est["sum"]) == (17.0, 42.5)
    assert est["count_error"] == 0.0 and est["sum_error"] == 0.0


def test_scaled_estimate_rejects_bad_input() -> None:
    for args in [(1, None, None, 0.0), (1, None, None, 1.5), (-1, None, None, 0.5)]:
        with pytest.raises(ValueError):
            scaled_estimate(*args)
    with pytest.raises(ValueError):
        scaled_estimate(1, None, None, 0.5, confidence=1.0)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.floats(0.05, 0.95), st.integers(500, 3000))
def test_confidence_intervals_cover_the_truth(keep: float, n: int) -> None:
    ids = np.arange(n, dtype=np.int64)
    values = np.random.default_rng(n).uniform(0.0, 10.0, n)
    true_count, true_sum = n, float(values.sum())
    trials = 300
    count_hits = sum_hits = 0
    for seed in range(trials):
        kept = values[keep_mask_random(ids, keep, seed)]
        est = scaled_estimate(kept.size, float(kept.sum()), float((kept**2).sum()), keep)
        count_hits += abs(est["count"] - true_count) <= est["count_error"]
        sum_hits += abs(est["sum"] - true_sum) <= est["sum_error"]
    # Nominal 95 %: 90 % is about four standard deviations of the hit rate below it.
    assert count_hits >= 0.9 * trials
    assert sum_hits >= 0.9 * trials


def test_an_upper_bound_on_an_arc_sends_the_capacity_it_frees_elsewhere() -> None:
    """Two queries on one node: q1 (utility 3) and q2 (utility 1), each 1 unit per tuple, 1 tuple
    each, capacity 1. The LP keeps all of q1; bounded to half of it, it spends the rest on q2."""
    def problem(bound: dict[str, float] | None) -> ShedProblem:
        return ShedProblem(
            rates={"in1": 1.0, "in2": 1.0},
            steps=(StepLoad("q1", "N", 1.0, 1.0, ("in1",)), StepLoad("q2", "N", 1.0, 1.0, ("in2",))),
            capacities={"N": 1.0},
            utilities={"q1": 3.0, "q2": 1.0},
            shed_points=("in1->q1", "in2->q2"),
            max_admitted=bound,
        )

    free = solve(problem(None))
    assert free.keep["in1->q1"] == pytest.approx(1.0) and free.keep["in2->q2"] == pytest.approx(0.0, abs=1e-9)
    bounded = solve(problem({"in1->q1": 0.5}))
    assert bounded.keep["in1->q1"] == pytest.approx(0.5)
    assert bounded.keep["in2->q2"] == pytest.approx(0.5)  # the freed half of the capacity
    assert bounded.utility == pytest.approx(2.0)
