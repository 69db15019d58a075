"""Initial placement of key groups on lanes: greedy (LPT), correlation-based (Borealis) and
resilient (ROD), and how feasible a placement stays under shifting input rates."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eddyline.control.policies.common import (
    _as_assignment,
    _as_loads,
    _as_series,
    _check_lanes,
    _least_loaded,
    _quantize,
    _tol,
    _unit_centered,
)

# ---------------------------------------------------------------------------------------------
# initial placement


def greedy_placement(loads: Any, lanes: int) -> np.ndarray:
    """Longest-processing-time-first placement of items with average ``loads``.

    The largest item goes first, each onto the lane with the least load so far (ties: fewer
    items, then the lower lane), which keeps the makespan within 4/3 of the optimum. Items of
    equal load are taken in index order; all-zero loads therefore spread the items by count.
    """
    w = _as_loads(loads)
    lanes = _check_lanes(lanes)
    load = np.zeros(lanes)
    count = np.zeros(lanes, dtype=np.int64)
    out = np.zeros(w.shape[0], dtype=np.int64)
    for j in np.argsort(-w, kind="stable"):
        lane = _least_loaded(load, count)
        out[j] = lane
        load[lane] += w[j]
        count[lane] += 1
    return out


def correlation_placement(series: Any, lanes: int, *, slack: float = 0.1) -> np.ndarray:
    """Correlation-based initial distribution (Borealis, Xing et al., ICDE 2005).

    Items are taken by average load, largest first (ties: lower index). An item may join a lane
    only if the lane's average load stays within ``(1 + slack)`` times the ideal mean
    (total / lanes); among those lanes it joins the one whose load series so far is least
    correlated with its own (score = -correlation, highest wins; ties: less loaded, fewer items,
    lower index). If no lane qualifies it joins the least loaded lane. The result balances the
    lanes' means while keeping each lane's load *over time* flat: anti-correlated items end up
    together, positively correlated ones apart.
    """
    s = _as_series(series)
    lanes = _check_lanes(lanes)
    if slack < 0 or not math.isfinite(slack):
        raise ValueError(f"slack must be a finite non-negative number, got {slack!r}")
    avg = s.mean(axis=1)
    cap = (1.0 + slack) * avg.sum() / lanes
    cap_tol = _tol(cap)
    unit = _unit_centered(s)  # correlations become dot products of these rows
    lane_series = np.zeros((lanes, s.shape[1]))
    lane_unit = np.zeros((lanes, s.shape[1]))
    lane_avg = np.zeros(lanes)
    count = np.zeros(lanes, dtype=np.int64)
    idx = np.arange(lanes)
    out = np.zeros(s.shape[0], dtype=np.int64)
    for j in np.argsort(-avg, kind="stable"):
        fits = idx[lane_avg + avg[j] <= cap + cap_tol]
        if fits.size == 0:
            lane = _least_loaded(lane_avg, count)
        else:
            score = _quantize(-np.clip(lane_unit[fits] @ unit[j], -1.0, 1.0))
            lane = int(fits[np.lexsort((fits, count[fits], lane_avg[fits], -score))[0]])
        out[j] = lane
        lane_series[lane] += s[j]
        lane_unit[lane] = _unit_centered(lane_series[lane])[0]
        lane_avg[lane] += avg[j]
        count[lane] += 1
    return out


def _as_coefficients(coefficients: Any) -> np.ndarray:
    c = np.array(coefficients, dtype=float)
    if c.ndim == 1:
        c = c.reshape(-1, 1)
    if c.ndim != 2:
        raise ValueError(f"coefficients must have shape (items, inputs), got {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError("coefficients must be finite and non-negative")
    return c


def _as_capacities(capacities: Any, lanes: int) -> np.ndarray | None:
    if capacities is None:
        return None
    c = np.broadcast_to(np.asarray(capacities, dtype=float), (lanes,)).copy()
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ValueError("capacities must be finite and positive")
    return c


def resilient_placement(coefficients: Any, lanes: int, capacities: Any = None) -> np.ndarray:
    """Resilient operator distribution (ROD, Xing et al., VLDB 2006), greedy heuristic.

    ``coefficients`` has shape ``(items, d)``: item ``j`` costs ``sum_k coefficients[j, k] *
    rate_k`` for input rates ``rate`` (load linear in the ``d`` input rates). Lane ``i`` with
    capacity ``C_i`` (default: all equal) can keep up while ``W_i . rate <= C_i``, ``W_i`` being
    the sum of its items' rows. In normalised rate space (each input scaled by its total
    coefficient ``total_k``) that constraint is a hyperplane at distance ``C_i / ||W~_i||`` from
    the origin, ``W~_i = W_i / total``; the farther every hyperplane, the larger the set of rate
    vectors the plan survives. The ideal plan has ``W~_i = C_i / sum(C)`` in every dimension.

    Items are taken by the norm of their normalised row, largest first (ties: lower index), and
    each goes to the lane that maximises the smallest plane distance over all lanes after the
    placement; ties go to the lane whose own distance stays largest, then to the lower lane.
    Inputs whose total coefficient is zero do not constrain anything and are ignored.
    """
    coef = _as_coefficients(coefficients)
    lanes = _check_lanes(lanes)
    cap = _as_capacities(capacities, lanes)
    cap = np.ones(lanes) if cap is None else cap
    total = coef.sum(axis=0)
    norm = np.divide(coef, total, out=np.zeros_like(coef), where=total > 0)
    weights = np.zeros((lanes, coef.shape[1]))
    idx = np.arange(lanes)

    def distances(w: np.ndarray) -> np.ndarray:
        n = np.linalg.norm(w, axis=1)
        return np.divide(cap, n, out=np.full(lanes, np.inf), where=n > 0)

    current = distances(weights)
    out = np.zeros(coef.shape[0], dtype=np.int64)
    for j in np.argsort(-np.linalg.norm(norm, axis=1), kind="stable"):
        own = distances(weights + norm[j])  # lane i's distance if j joins lane i
        if lanes == 1:
            lane = 0
        else:
            # smallest distance among the *other* lanes, for every candidate lane
            order = np.argsort(current, kind="stable")
            first, second = current[order[0]], current[order[1]]
            others = np.where(idx == order[0], second, first)
            worst = np.minimum(own, others)
            lane = int(np.lexsort((idx, -own, -worst))[0])
        out[j] = lane
        weights[lane] += norm[j]
        current[lane] = own[lane]
    return out


def feasible_fraction(
    coefficients: Any,
    assignment: Any,
    lanes: int,
    rate_box: Any,
    capacities: Any = None,
    samples: int = 20000,
    seed: int = 0,
) -> float:
    """Monte-Carlo estimate of how much of the rate box a placement survives.

    Draws ``samples`` rate vectors uniformly from ``[0, rate_box[k]]`` per input (with
    ``np.random.default_rng(seed)``, so the estimate is deterministic and equal seeds give
    common random numbers across placements) and returns the fraction for which every lane's
    load ``W_i . rate`` is at most its capacity.

    Default capacities: every lane gets ``1/lanes`` of the total load at the *centre* of the box
    (the mean rate vector), i.e. the system is provisioned for its mean load. With that choice
    the ideal plan survives exactly the half of the box below the hyperplane through the centre
    (the box is centrally symmetric), and any plan's feasible set is contained in the ideal
    one's, so results lie in ``[0, 0.5]`` and 0.5 means "as resilient as possible".
    (Provisioning at the box corner instead would make every plan that is balanced at the
    corner score 1.0, hiding exactly the differences ROD is about.)
    """
    coef = _as_coefficients(coefficients)
    lanes = _check_lanes(lanes)
    a = _as_assignment(assignment, coef.shape[0], lanes)
    box = np.asarray(rate_box, dtype=float).ravel()
    if box.shape != (coef.shape[1],) or not np.all(np.isfinite(box)) or np.any(box < 0):
        raise ValueError(f"rate_box must hold {coef.shape[1]} finite non-negative upper rates")
    if samples < 1:
        raise ValueError(f"samples must be positive, got {samples}")
    weights = np.zeros((lanes, coef.shape[1]))
    np.add.at(weights, a, coef)
    cap = _as_capacities(capacities, lanes)
    if cap is None:
        cap = np.full(lanes, float(coef.sum(axis=0) @ (box / 2.0)) / lanes)
    rng = np.random.default_rng(seed)
    feasible = 0
    chunk = 1 << 15
    for start in range(0, samples, chunk):
        n = min(chunk, samples - start)
        rates = rng.random((n, coef.shape[1])) * box
        loads = rates @ weights.T
        feasible += int(np.count_nonzero(np.all(loads <= cap, axis=1)))
    return feasible / samples


def place_by(policy: str, basis: np.ndarray, lanes: int) -> np.ndarray:
    """Key groups placed on ``lanes`` by the named policy, from their load ``basis`` (items x epochs)."""
    if policy == "greedy":
        return greedy_placement(basis.mean(axis=1), lanes)
    if policy == "correlation":
        return correlation_placement(basis, lanes)
    # resilient: every observed epoch is a load condition; its key groups' shares of that
    # epoch's total are the coefficients, so the placement keeps every lane near 1/n of the
    # load under all the mixes seen (ROD's "wide feasible region", over observed mixes)
    totals = basis.sum(axis=0)
    coeff = np.divide(basis, totals, out=np.zeros_like(basis), where=totals > 0)
    return resilient_placement(coeff, lanes)
