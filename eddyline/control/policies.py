"""Placement, balancing and scaling policies: pure numpy, no Spark.

Model. A stateful step hashes its keys into ``K`` key groups, the *items* here. A routing table
maps every item to a *lane* (a parallel task, what Borealis calls a node). An **assignment** is an
int array of length ``items`` with values in ``[0, lanes)``. Statistics arrive as a **series**: a
non-negative float matrix of shape ``(items, T)`` holding the load of each item (for example its
busy milliseconds) in each of the last ``T >= 1`` epochs. An item's *average load* is its row
mean; a lane's load series is the sum of its items' rows.

Policies:

* initial placement: :func:`greedy_placement` (LPT on average loads),
  :func:`correlation_placement` (Borealis, Xing et al., ICDE 2005: keep lanes' load series
  flat by co-locating anti-correlated items) and :func:`resilient_placement` (ROD, Xing et al.,
  VLDB 2006: keep every lane's share of every input close to its share of the capacity, so the
  plan stays feasible under the widest set of input rates; judged by :func:`feasible_fraction`);
* dynamic balancing between pairs of lanes: :func:`one_way` and :func:`two_way` (Borealis),
  combined by :func:`balance` and wrapped with hysteresis by :class:`Balancer`;
* elasticity: :func:`ds2_lanes` (DS2, Kalavri et al., OSDI 2018), wrapped with hysteresis by
  :class:`Scaler`, and :func:`rescale_assignment` to change the lane count moving little load.

Every function is deterministic (remaining ties go to the lower item or lane index) and never
modifies its arguments. Score comparisons treat values closer than ``1e-9`` as equal, so that
floating-point noise in correlations does not decide a tie.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "METHODS",
    "Balancer",
    "Move",
    "Scaler",
    "balance",
    "correlation",
    "correlation_placement",
    "ds2_lanes",
    "feasible_fraction",
    "greedy_placement",
    "lane_loads",
    "makespan",
    "one_way",
    "pair_lanes",
    "predicted_lane_loads",
    "rescale_assignment",
    "resilient_placement",
    "two_way",
]

#: Balancing methods accepted by :func:`balance` and :class:`Balancer`.
METHODS = ("one_way", "two_way", "global")

#: Scores closer than this are ties (broken by load or index, never by rounding noise).
_SCORE_QUANTUM = 1e-9
#: Relative tolerance of load comparisons (budgets, capacity checks, "not worse" checks).
_REL_TOL = 1e-9


@dataclass(frozen=True)
class Move:
    """Relocation of one item (key group) from lane ``src`` to lane ``dst``."""

    item: int
    src: int
    dst: int
    #: the item's average load over the series the decision was based on
    load: float
    #: the score that ranked the item (0.0 where the policy has none)
    score: float


# ---------------------------------------------------------------------------------------------
# validation helpers


def _as_series(series: Any) -> np.ndarray:
    """A float copy of ``series`` as a 2-D ``(items, T)`` array; a 1-D array means ``T = 1``."""
    s = np.array(series, dtype=float)
    if s.ndim == 1:
        s = s.reshape(-1, 1)
    if s.ndim != 2:
        raise ValueError(f"series must have shape (items, T), got {s.shape}")
    if s.shape[0] and s.shape[1] == 0:
        raise ValueError("series needs at least one epoch (T >= 1)")
    if not np.all(np.isfinite(s)):
        raise ValueError("series holds non-finite values")
    if np.any(s < 0):
        raise ValueError("series holds negative loads")
    return s


def _as_loads(loads: Any) -> np.ndarray:
    w = np.array(loads, dtype=float)
    if w.ndim != 1:
        raise ValueError(f"loads must be 1-D (one average per item), got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("loads hold non-finite values")
    if np.any(w < 0):
        raise ValueError("loads hold negative values")
    return w


def _check_lanes(lanes: int, name: str = "lanes") -> int:
    if isinstance(lanes, bool) or int(lanes) != lanes or lanes < 1:
        raise ValueError(f"{name} must be a positive integer, got {lanes!r}")
    return int(lanes)


def _as_assignment(assignment: Any, items: int, lanes: int | None) -> np.ndarray:
    """An int64 copy of ``assignment``, checked against ``items`` and (if given) ``lanes``."""
    a = np.array(assignment)
    if a.ndim != 1 or a.shape[0] != items:
        raise ValueError(f"assignment must have shape ({items},), got {a.shape}")
    integral = a.dtype.kind in "iu" or (a.dtype.kind == "f" and bool(np.all(np.mod(a, 1) == 0)))
    if a.size and not integral:
        raise ValueError("assignment must hold integer lane numbers")
    a = a.astype(np.int64)
    if a.size and a.min() < 0:
        raise ValueError("assignment holds negative lane numbers")
    if lanes is not None and a.size and a.max() >= lanes:
        raise ValueError(f"assignment holds lane {int(a.max())}, outside [0, {lanes})")
    return a


def _check_lane(lane: int, lanes: int, name: str) -> int:
    if int(lane) != lane or not 0 <= lane < lanes:
        raise ValueError(f"{name} = {lane!r} is not a lane in [0, {lanes})")
    return int(lane)


def _quantize(x: np.ndarray) -> np.ndarray:
    """Scores rounded to :data:`_SCORE_QUANTUM`, so near-equal scores compare as ties."""
    return np.round(np.asarray(x, dtype=float) / _SCORE_QUANTUM) * _SCORE_QUANTUM


def _tol(*values: float) -> float:
    """An absolute tolerance for comparing loads of the magnitude of ``values``."""
    return _REL_TOL * max([1.0, *(abs(v) for v in values)])


# ---------------------------------------------------------------------------------------------
# basic quantities


def lane_loads(series: Any, assignment: Any, lanes: int) -> np.ndarray:
    """Load series of every lane: shape ``(lanes, T)``, row ``i`` = sum of lane ``i``'s items."""
    s = _as_series(series)
    lanes = _check_lanes(lanes)
    a = _as_assignment(assignment, s.shape[0], lanes)
    out = np.zeros((lanes, s.shape[1]))
    np.add.at(out, a, s)
    return out


def _unit_centered(rows: np.ndarray) -> np.ndarray:
    """Each row minus its mean, scaled to unit length; all zeros for a constant row or ``T < 2``.

    The dot product of two such rows is their Pearson coefficient. A row counts as constant
    when its spread around the mean is within rounding noise of its magnitude (a sum of exactly
    anti-correlated series is constant even if rounding says otherwise).
    """
    rows = np.atleast_2d(np.asarray(rows, dtype=float))
    t = rows.shape[1]
    out = np.zeros_like(rows)
    if t < 2 or rows.shape[0] == 0:
        return out
    centered = rows - rows.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(centered, axis=1)
    varying = norm > 1e-12 * math.sqrt(t) * np.abs(rows).max(axis=1)
    out[varying] = centered[varying] / norm[varying, None]
    return out


def _row_correlations(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Pearson coefficient of ``x`` with each row of ``rows``; ``x`` is one series or one per row.

    0.0 where either side is constant (see :func:`_unit_centered`) or ``T < 2``.
    """
    ux = _unit_centered(x)
    ur = _unit_centered(rows)
    ux, ur = np.broadcast_arrays(ux, ur)
    return np.clip(np.einsum("ij,ij->i", ux, ur), -1.0, 1.0)


def correlation(a: Any, b: Any) -> float:
    """Pearson correlation coefficient of two load series of equal length.

    0.0 when either series is constant or has fewer than two points (no evidence either way).
    """
    x = np.asarray(a, dtype=float).ravel()
    y = np.asarray(b, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"series lengths differ: {x.shape[0]} vs {y.shape[0]}")
    return float(_row_correlations(x, y[None, :])[0])


def makespan(avg_lane_loads: Any) -> float:
    """The largest lane load (the stage finishes when its slowest lane does); 0.0 if no lanes."""
    x = np.asarray(avg_lane_loads, dtype=float)
    return float(x.max()) if x.size else 0.0


def predicted_lane_loads(series: Any, assignment: Any, lanes: int, moves: Iterable[Move]) -> np.ndarray:
    """Average load of every lane once ``moves`` are applied (in order) to ``assignment``.

    Raises ``ValueError`` if a move's ``src`` is not the item's lane at that point: a stale move
    would otherwise predict a state that cannot happen.
    """
    s = _as_series(series)
    lanes = _check_lanes(lanes)
    a = _as_assignment(assignment, s.shape[0], lanes)
    for m in moves:
        if not 0 <= m.item < a.shape[0]:
            raise ValueError(f"move of unknown item {m.item}")
        if a[m.item] != m.src:
            raise ValueError(f"move of item {m.item} from lane {m.src}, but it is on lane {int(a[m.item])}")
        a[m.item] = _check_lane(m.dst, lanes, "move destination")
    out = np.zeros(lanes)
    np.add.at(out, a, s.mean(axis=1))
    return out


def _least_loaded(load: np.ndarray, count: np.ndarray, candidates: np.ndarray | None = None) -> int:
    """The lane with the least load, then the fewest items, then the lowest index."""
    idx = np.arange(load.shape[0]) if candidates is None else np.asarray(candidates)
    best = np.lexsort((idx, count[idx], load[idx]))[0]
    return int(idx[best])


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


# ---------------------------------------------------------------------------------------------
# dynamic balancing between pairs of lanes


def _pair_loads(avg: np.ndarray, a: np.ndarray, x: int, y: int) -> tuple[float, float]:
    return float(avg[a == x].sum()), float(avg[a == y].sum())


def _one_way_plan(
    s: np.ndarray,
    avg: np.ndarray,
    a: np.ndarray,
    x: int,
    y: int,
    target: float | None,
    frozen: frozenset[int] | set[int],
) -> list[Move]:
    load_x, load_y = _pair_loads(avg, a, x, y)
    src, dst = (x, y) if load_x >= load_y else (y, x)
    excess = abs(load_x - load_y)
    if excess <= _tol(load_x, load_y):
        return []
    budget = excess / 2.0 if target is None else min(max(float(target), 0.0), excess)
    members = np.flatnonzero(a == src)
    cand = np.array([i for i in members if avg[i] > 0 and int(i) not in frozen], dtype=np.int64)
    if cand.size == 0 or budget <= 0:
        return []
    src_series = s[members].sum(axis=0)
    dst_series = s[a == dst].sum(axis=0)
    rest = src_series[None, :] - s[cand]
    score = _row_correlations(s[cand], rest) - _row_correlations(s[cand], dst_series[None, :])
    order = np.lexsort((cand, -avg[cand], -_quantize(score)))  # ties: the larger item, then the lower index
    moves: list[Move] = []
    left = budget
    slack = _tol(budget)
    for k in order:
        i = int(cand[k])
        if avg[i] <= left + slack:
            moves.append(Move(i, src, dst, float(avg[i]), float(score[k])))
            left -= avg[i]
    return moves


def one_way(series: Any, assignment: Any, a: int, b: int, *, target: float | None = None) -> list[Move]:
    """One-way correlation-based load moving between lanes ``a`` and ``b`` (Borealis).

    The more loaded lane of the pair (call it A; equal loads: no moves) sends load to the other
    (B). A's items are ranked by ``score(o) = corr(o, A - o) - corr(o, B)``: an item that rises
    and falls with the rest of A but not with B flattens both lanes by moving. In that order
    (ties: the larger item first, so a bounded number of moves carries as much load as it can
    when the series is too short to correlate; then the lower index), items are moved while the
    moved total stays within the budget; an item larger than what is left of the budget is
    skipped and the next one tried. Items with zero
    load are never moved (moving them changes nothing but costs a migration).

    ``target`` is the average load to move; by default half of the difference between A and B,
    which equalises them. It is clipped to ``[0, difference]`` so that the moves never leave the
    pair more imbalanced than before. Moves come in the order taken; each one, applied after
    the ones before, does not widen the pair's difference (with the default target it narrows
    it).
    """
    s = _as_series(series)
    a_ = _as_assignment(assignment, s.shape[0], None)
    lanes = max(int(a_.max()) + 1 if a_.size else 0, int(a) + 1, int(b) + 1)
    x, y = _check_lane(a, lanes, "a"), _check_lane(b, lanes, "b")
    if x == y:
        raise ValueError("one_way needs two different lanes")
    return _one_way_plan(s, s.mean(axis=1), a_, x, y, target, frozenset())


def _two_way_plan(
    s: np.ndarray, avg: np.ndarray, a: np.ndarray, x: int, y: int, frozen: frozenset[int] | set[int]
) -> list[Move]:
    members = np.flatnonzero((a == x) | (a == y))
    fixed = [int(i) for i in members if avg[i] <= 0 or int(i) in frozen]
    free = [int(i) for i in members if avg[i] > 0 and int(i) not in frozen]
    if not free:
        return []
    lanes = (x, y) if x < y else (y, x)  # equal loads: the lower lane picks first
    series = {ln: np.zeros(s.shape[1]) for ln in lanes}
    load = dict.fromkeys(lanes, 0.0)
    for i in fixed:
        series[int(a[i])] += s[i]
        load[int(a[i])] += avg[i]
    place: dict[int, int] = {}
    score_of: dict[int, float] = {}
    items = np.array(free, dtype=np.int64)
    unit = _unit_centered(s[items])  # row k: item items[k], centred and normalised once
    open_ = np.ones(items.shape[0], dtype=bool)
    lo, hi = lanes
    for _ in range(items.shape[0]):
        pick, other = (lo, hi) if load[lo] <= load[hi] else (hi, lo)
        u = _unit_centered(np.stack([series[other], series[pick]]))
        score = np.clip(unit @ u[0], -1.0, 1.0) - np.clip(unit @ u[1], -1.0, 1.0)
        q = np.where(open_, _quantize(score), -np.inf)
        tied = np.flatnonzero(q == q.max())
        k = int(tied[np.lexsort((items[tied], -avg[items[tied]]))[0]])
        i = int(items[k])
        place[i] = pick
        score_of[i] = float(score[k])
        series[pick] += s[i]
        load[pick] += avg[i]
        open_[k] = False
    if not fixed:
        # both lanes started empty, so which group ends up on which lane is arbitrary: take the
        # labelling that moves less load (then fewer items; then the one computed)
        def cost(mapping: Mapping[int, int]) -> tuple[float, int]:
            moved = [i for i in free if mapping[i] != a[i]]
            return float(avg[moved].sum()), len(moved)

        mirrored = {i: (y if ln == x else x) for i, ln in place.items()}
        if cost(mirrored) < cost(place):
            place = mirrored
    return [
        Move(i, int(a[i]), place[i], float(avg[i]), score_of[i])
        for i in sorted(place)
        if place[i] != a[i]
    ]


def two_way(series: Any, assignment: Any, a: int, b: int) -> list[Move]:
    """Two-way correlation-based redistribution of the items of lanes ``a`` and ``b`` (Borealis).

    Both lanes start empty. Repeatedly the less loaded lane X (ties: the lower lane) takes the
    unplaced item with the highest ``score(o) = corr(o, other lane so far) - corr(o, X so far)``
    (ties: larger load, then lower index), so each lane collects items that offset its own
    fluctuations. Items with zero load stay where they are (their load series counts from the
    start). When nothing is pinned the two groups are interchangeable, and the labelling that
    moves less load is returned.

    Returns a move for every item whose lane changed, by item index. The plan optimises both
    lanes' load series jointly; it is not guaranteed to shrink the difference of the lanes'
    averages. :func:`balance` keeps only moves that do.
    """
    s = _as_series(series)
    a_ = _as_assignment(assignment, s.shape[0], None)
    lanes = max(int(a_.max()) + 1 if a_.size else 0, int(a) + 1, int(b) + 1)
    x, y = _check_lane(a, lanes, "a"), _check_lane(b, lanes, "b")
    if x == y:
        raise ValueError("two_way needs two different lanes")
    return _two_way_plan(s, s.mean(axis=1), a_, x, y, frozenset())


def pair_lanes(avg_lane_loads: Any) -> list[tuple[int, int]]:
    """Pair the most loaded lane with the least loaded, the second most with the second least...

    Lanes are ranked by average load, descending (ties: lower index first). Returns
    ``(heavier, lighter)`` tuples; with an odd number of lanes the median lane is left out.
    """
    x = np.asarray(avg_lane_loads, dtype=float).ravel()
    order = np.lexsort((np.arange(x.shape[0]), -x))
    n = order.shape[0]
    return [(int(order[i]), int(order[n - 1 - i])) for i in range(n // 2)]


def _select_improving(
    plan: list[Move], load: dict[int, float], limit: int
) -> list[Move]:
    """At most ``limit`` moves of ``plan`` (between two lanes) that leave the pair better off.

    Repeatedly accepts the largest-load remaining move (ties: lower item) that does not widen
    the current difference of the pair, rescanning after each acceptance (a move back may only
    fit once load went the other way). The accepted moves, in acceptance order, each keep or
    reduce the difference; the set is returned only if it strictly reduces it.
    """
    if limit <= 0 or not plan:
        return []
    lanes = list(load)
    state = dict(load)
    start = abs(state[lanes[0]] - state[lanes[1]])
    tol = _tol(*state.values())
    pending = sorted(plan, key=lambda m: (-m.load, m.item))
    taken: list[Move] = []
    progress = True
    while pending and len(taken) < limit and progress:
        progress = False
        diff = abs(state[lanes[0]] - state[lanes[1]])
        for k, m in enumerate(pending):
            after = dict(state)
            after[m.src] -= m.load
            after[m.dst] += m.load
            if abs(after[lanes[0]] - after[lanes[1]]) <= diff + tol:
                state = after
                taken.append(m)
                del pending[k]
                progress = True
                break
    end = abs(state[lanes[0]] - state[lanes[1]])
    return taken if end < start - tol else []


def since_shift(series: Any, threshold: float = 0.2) -> int:
    """Epochs (columns) at the end of ``series`` that come after its latest load shift.

    A shift is an epoch whose load *distribution* over the items (each item's share of the
    epoch's total) is at total-variation distance ``threshold`` or more from the average share
    of the epochs before it: the hot keys moved, not just the rate. Averaging over a window that
    straddles a shift would balance for a mix of the old and the new load and take several rounds
    to catch up; the epochs since the shift describe the load that will come. Without a shift
    the whole series counts."""
    s = _as_series(series)
    t = s.shape[1]
    totals = s.sum(axis=0)
    shares = np.divide(s, totals, out=np.zeros_like(s), where=totals > 0)
    for j in range(t - 1, 0, -1):
        if totals[j] <= 0 or not np.any(totals[:j] > 0):
            continue
        before = shares[:, :j][:, totals[:j] > 0].mean(axis=1)
        if 0.5 * float(np.abs(shares[:, j] - before).sum()) >= threshold:
            return t - j
    return t


def _imbalance(avg_lane: np.ndarray) -> float:
    """(max - min) / mean of the lanes' average loads; 0.0 without load or with one lane."""
    if avg_lane.size < 2:
        return 0.0
    mean = float(avg_lane.mean())
    return float((avg_lane.max() - avg_lane.min()) / mean) if mean > 0 else 0.0


def balance(
    series: Any,
    assignment: Any,
    lanes: int,
    *,
    threshold: float,
    max_moves: int,
    method: str = "one_way",
    frozen: Iterable[int] = frozenset(),
) -> list[Move]:
    """One balancing round over all lanes.

    Lanes are paired by :func:`pair_lanes`; every pair whose average loads differ by at least
    ``threshold`` times the mean lane load (and by more than nothing) is handled, the most
    imbalanced pair first, by:

    * ``"one_way"``: :func:`one_way` from the heavier lane to the lighter;
    * ``"two_way"``: :func:`two_way`, keeping the largest-load moves of its plan that, applied
      one after another, never widen the pair's difference and together narrow it;
    * ``"global"``: ``"one_way"`` repeated, re-pairing on the updated assignment, until no pair
      reaches the threshold, a round moves nothing, or the budget is spent (at most ``lanes``
      rounds).

    Items in ``frozen`` (cooling down after an earlier move) never move, but their load counts.
    At most ``max_moves`` moves are returned; one_way plans are cut in score order, two_way
    plans keep their largest-load moves. An item moved more than once appears once, from its
    original lane to its final one, with the score of its last move (an item that ends where it
    started does not appear).

    Guarantees: every handled pair's difference shrinks and its total stays the same, so the
    makespan never grows and the spread of lane loads shrinks.
    """
    s = _as_series(series)
    lanes = _check_lanes(lanes)
    original = _as_assignment(assignment, s.shape[0], lanes)
    if method not in METHODS:
        raise ValueError(f"unknown balancing method {method!r}; expected one of {METHODS}")
    if threshold < 0 or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite non-negative number, got {threshold!r}")
    if max_moves < 0:
        raise ValueError(f"max_moves must be non-negative, got {max_moves}")
    pinned = frozenset(int(i) for i in frozen)
    avg = s.mean(axis=1)
    current = original.copy()
    mean = float(avg.sum()) / lanes
    if mean <= 0 or max_moves == 0 or lanes < 2:
        return []
    limit = mean * threshold
    last: dict[int, Move] = {}  # item -> its latest move, in first-move order
    rounds = lanes if method == "global" else 1
    for _ in range(rounds):
        lane_avg = np.zeros(lanes)
        np.add.at(lane_avg, current, avg)
        pairs = [
            (hi, lo)
            for hi, lo in pair_lanes(lane_avg)
            if lane_avg[hi] - lane_avg[lo] >= limit and lane_avg[hi] - lane_avg[lo] > _tol(mean)
        ]
        pairs.sort(key=lambda p: -(lane_avg[p[0]] - lane_avg[p[1]]))
        moved_this_round = False
        for hi, lo in pairs:
            budget = max_moves - int(np.count_nonzero(current != original))
            if budget <= 0:
                break
            if method == "two_way":
                plan = _two_way_plan(s, avg, current, hi, lo, pinned)
                plan = _select_improving(plan, {hi: lane_avg[hi], lo: lane_avg[lo]}, budget)
            else:
                plan = _one_way_plan(s, avg, current, hi, lo, None, pinned)[:budget]
            for m in plan:
                current[m.item] = m.dst
                last[m.item] = m
            moved_this_round = moved_this_round or bool(plan)
        if not moved_this_round or int(np.count_nonzero(current != original)) >= max_moves:
            break
    return [
        Move(i, int(original[i]), int(current[i]), m.load, m.score)
        for i, m in last.items()
        if current[i] != original[i]
    ]


class Balancer:
    """:func:`balance` with hysteresis, for the runtime to call once per epoch.

    * evaluates at most every ``period`` epochs (the first call always evaluates);
    * acts only after the imbalance ``(max - min) / mean`` of the lanes' average loads has
      reached ``threshold`` at ``patience`` consecutive evaluations; acting starts the count
      again, so the next action needs fresh evidence about the new placement;
    * items it moved are frozen for the next ``cooldown`` evaluations.

    A series that is balanced on average but noisy therefore moves nothing, and a real
    imbalance is acted on after ``(patience - 1) * period`` epochs. The state (not the
    statistics) round-trips through :meth:`state` / :meth:`from_state` as a JSON-able dict.
    """

    def __init__(
        self,
        *,
        threshold: float = 0.2,
        period: int = 2,
        max_moves: int = 4,
        method: str = "one_way",
        cooldown: int = 3,
        patience: int = 2,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown balancing method {method!r}; expected one of {METHODS}")
        if threshold < 0 or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite non-negative number, got {threshold!r}")
        if period < 1 or patience < 1:
            raise ValueError("period and patience must be at least 1")
        if max_moves < 0 or cooldown < 0:
            raise ValueError("max_moves and cooldown must be non-negative")
        self.threshold = float(threshold)
        self.period = int(period)
        self.max_moves = int(max_moves)
        self.method = method
        self.cooldown = int(cooldown)
        self.patience = int(patience)
        self._last_eval: int | None = None
        self._streak = 0
        self._frozen: dict[int, int] = {}  # item -> evaluations it stays frozen

    @property
    def frozen(self) -> frozenset[int]:
        """Items that the next evaluation will not move."""
        return frozenset(i for i, left in self._frozen.items() if left > 0)

    def decide(self, epoch: int, series: Any, assignment: Any, lanes: int) -> list[Move]:
        """The moves to make before ``epoch`` (usually none)."""
        if self._last_eval is not None and epoch < self._last_eval + self.period:
            return []
        self._last_eval = int(epoch)
        frozen = self.frozen
        self._frozen = {i: left - 1 for i, left in self._frozen.items() if left > 1}
        lane_avg = lane_loads(series, assignment, lanes).mean(axis=1)
        if lanes > 1 and _imbalance(lane_avg) >= self.threshold and float(lane_avg.max() - lane_avg.min()) > 0:
            self._streak += 1
        else:
            self._streak = 0
        if self._streak < self.patience:
            return []
        moves = balance(
            series,
            assignment,
            lanes,
            threshold=self.threshold,
            max_moves=self.max_moves,
            method=self.method,
            frozen=frozen,
        )
        if moves:
            self._streak = 0
            if self.cooldown > 0:
                for m in moves:
                    self._frozen[m.item] = self.cooldown
        return moves

    def state(self) -> dict[str, Any]:
        """Configuration and hysteresis state as a JSON-able dict."""
        return {
            "version": 1,
            "config": {
                "threshold": self.threshold,
                "period": self.period,
                "max_moves": self.max_moves,
                "method": self.method,
                "cooldown": self.cooldown,
                "patience": self.patience,
            },
            "last_eval": self._last_eval,
            "streak": self._streak,
            "frozen": [[i, left] for i, left in sorted(self._frozen.items())],
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> Balancer:
        """Rebuild a balancer from :meth:`state` output."""
        out = cls(**dict(data["config"]))
        out._last_eval = None if data.get("last_eval") is None else int(data["last_eval"])
        out._streak = int(data.get("streak", 0))
        out._frozen = {int(i): int(left) for i, left in data.get("frozen", ()) if int(left) > 0}
        return out


# ---------------------------------------------------------------------------------------------
# elasticity


def ds2_lanes(
    arrival_rate: float,
    true_rate_per_lane: float,
    *,
    target_utilization: float = 0.7,
    min_lanes: int = 1,
    max_lanes: int,
) -> int:
    """DS2's lane count (Kalavri et al., OSDI 2018): the fewest lanes that keep up at the target.

    ``ceil(arrival_rate / (true_rate_per_lane * target_utilization))`` clamped to
    ``[min_lanes, max_lanes]``, where the *true* rate is the rows one lane processes per second
    of its busy time (so it does not depend on how idle the lanes are now). Without a measured
    true rate (``<= 0``) the answer is ``min_lanes``. A quotient within rounding noise of an
    integer is taken as that integer.
    """
    _check_bounds(min_lanes, max_lanes, target_utilization)
    if not true_rate_per_lane > 0 or not math.isfinite(true_rate_per_lane):
        return int(min_lanes)
    need = max(float(arrival_rate), 0.0) / (true_rate_per_lane * target_utilization)
    if not math.isfinite(need):
        return int(max_lanes)
    lanes = math.ceil(need - 1e-9 * max(1.0, need))
    return int(min(max(lanes, min_lanes), max_lanes))


def _check_bounds(min_lanes: int, max_lanes: int, target_utilization: float) -> None:
    _check_lanes(min_lanes, "min_lanes")
    _check_lanes(max_lanes, "max_lanes")
    if max_lanes < min_lanes:
        raise ValueError(f"max_lanes ({max_lanes}) is below min_lanes ({min_lanes})")
    if not 0 < target_utilization <= 1:
        raise ValueError(f"target_utilization must be in (0, 1], got {target_utilization!r}")


class Scaler:
    """DS2 rescaling with hysteresis, for the runtime to call once per epoch.

    With utilisation ``u = arrival / (true_rate * lanes_now)`` and target ``t``:

    * **scale out** when ``u > t * (1 + tolerance)``, to the DS2 size (utilisation <= ``t``);
    * **scale in** when a smaller size still has headroom, i.e. to the smallest size whose
      utilisation is at most ``t * (1 - tolerance)``, if that is below ``lanes_now``;
    * otherwise, and during the ``cooldown`` epochs after a change, stay (``None``).

    Scale-in lands below ``t * (1 - tolerance)`` rather than just below ``t`` so that after a
    change the arrival rate must move by a factor ``(1 + tolerance) / (1 - tolerance)`` to undo
    it: noise narrower than that does not make the size flap. Sizes stay in
    ``[min_lanes, max_lanes]``; a current size outside those bounds is corrected at once. Without
    a measured true rate nothing is decided.
    """

    def __init__(
        self,
        *,
        target_utilization: float = 0.7,
        min_lanes: int = 1,
        max_lanes: int,
        cooldown: int = 3,
        tolerance: float = 0.15,
    ) -> None:
        _check_bounds(min_lanes, max_lanes, target_utilization)
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        if cooldown < 0:
            raise ValueError(f"cooldown must be non-negative, got {cooldown}")
        self.target_utilization = float(target_utilization)
        self.min_lanes = int(min_lanes)
        self.max_lanes = int(max_lanes)
        self.cooldown = int(cooldown)
        self.tolerance = float(tolerance)
        self._last_change: int | None = None

    def decide(self, epoch: int, lanes_now: int, arrival_rate: float, true_rate_per_lane: float) -> int | None:
        """The new lane count to run ``epoch`` with, or ``None`` to keep ``lanes_now``."""
        lanes_now = _check_lanes(lanes_now, "lanes_now")
        if not self.min_lanes <= lanes_now <= self.max_lanes:
            return self._change(epoch, min(max(lanes_now, self.min_lanes), self.max_lanes))
        if self._last_change is not None and epoch - self._last_change <= self.cooldown:
            return None
        rate = float(true_rate_per_lane)
        arrival = max(float(arrival_rate), 0.0)
        if not rate > 0 or not math.isfinite(rate) or not math.isfinite(arrival):
            return None
        t = self.target_utilization
        if arrival / (rate * lanes_now) > t * (1 + self.tolerance):
            out = ds2_lanes(arrival, rate, target_utilization=t, min_lanes=self.min_lanes, max_lanes=self.max_lanes)
            return self._change(epoch, out) if out > lanes_now else None
        smaller = ds2_lanes(
            arrival, rate, target_utilization=t * (1 - self.tolerance), min_lanes=self.min_lanes, max_lanes=self.max_lanes
        )
        return self._change(epoch, smaller) if smaller < lanes_now else None

    def _change(self, epoch: int, lanes: int) -> int:
        self._last_change = int(epoch)
        return int(lanes)

    def state(self) -> dict[str, Any]:
        """Configuration and hysteresis state as a JSON-able dict."""
        return {
            "version": 1,
            "config": {
                "target_utilization": self.target_utilization,
                "min_lanes": self.min_lanes,
                "max_lanes": self.max_lanes,
                "cooldown": self.cooldown,
                "tolerance": self.tolerance,
            },
            "last_change": self._last_change,
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> Scaler:
        """Rebuild a scaler from :meth:`state` output."""
        out = cls(**dict(data["config"]))
        out._last_change = None if data.get("last_change") is None else int(data["last_change"])
        return out


def rescale_assignment(loads: Any, assignment: Any, new_lanes: int) -> np.ndarray:
    """Re-place items for ``new_lanes`` lanes, moving as little as possible.

    * Items on lanes ``< new_lanes`` stay, unless taken to fill an empty lane (below).
    * Items on removed lanes (scale in) go, largest first (ties: lower index), to the lane with
      the least load (then fewest items, then lowest index).
    * Lanes still empty afterwards (scale out, or lanes that had no items) are filled: the
      emptiest such lane repeatedly takes, from the most loaded lane that has one, the largest
      item that brings it closer to the mean lane load and is smaller than the gap between the
      two lanes (so the donor never ends below the receiver). A lane is done when no item fits.
      No item moves twice.

    With all-zero loads the same procedure balances item *counts*. Moving items only to fill
    new lanes moves about ``1 - old/new`` of the load on scale out, against ``1 - 1/new`` of the
    items for a uniform re-hash.
    """
    w = _as_loads(loads)
    new_lanes = _check_lanes(new_lanes, "new_lanes")
    out = _as_assignment(assignment, w.shape[0], None)
    if w.size and w.sum() <= 0:
        w = np.ones_like(w)
    kept = out < new_lanes
    load = np.zeros(new_lanes)
    count = np.zeros(new_lanes, dtype=np.int64)
    np.add.at(load, out[kept], w[kept])
    np.add.at(count, out[kept], 1)
    orphans = np.flatnonzero(~kept)
    for j in orphans[np.lexsort((orphans, -w[orphans]))]:
        lane = _least_loaded(load, count)
        out[j] = lane
        load[lane] += w[j]
        count[lane] += 1
    # an item moves at most once (which also bounds the loop below), and items too light to
    # change any lane's load beyond rounding never move to fill a lane
    movable = kept & (w > _REL_TOL * float(w.sum()))
    receivers = {int(i) for i in np.flatnonzero(count == 0)}
    mean = float(load.sum()) / new_lanes
    lane_idx = np.arange(new_lanes)
    while receivers:
        r = min(receivers, key=lambda i: (load[i], i))
        took = False
        for d in np.lexsort((lane_idx, -load)):
            d = int(d)
            gap = load[d] - load[r] - _tol(load[d])  # an item the size of the gap only swaps them
            if d == r or gap <= 0:
                break
            on_d = np.flatnonzero((out == d) & movable)
            fit = on_d[(w[on_d] < gap) & (w[on_d] < 2.0 * (mean - load[r]))]
            if fit.size:
                j = int(fit[np.lexsort((fit, -w[fit]))[0]])
                out[j] = r
                movable[j] = False
                load[d] -= w[j]
                load[r] += w[j]
                count[d] -= 1
                count[r] += 1
                took = True
                break
        if not took:
            receivers.discard(r)
    return out
