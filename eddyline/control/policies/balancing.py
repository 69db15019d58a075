"""Dynamic balancing between pairs of lanes (one-way and two-way moves, Borealis), and the
:class:`Balancer` that adds hysteresis (period, patience, cool-down)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from eddyline.control.policies.common import (
    METHODS,
    Move,
    _as_assignment,
    _as_series,
    _check_lane,
    _check_lanes,
    _quantize,
    _row_correlations,
    _tol,
    _unit_centered,
    lane_loads,
)

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
    # ties: the larger item, then the lower index
    order = np.lexsort((cand, -avg[cand], -_quantize(score)))
    moves: list[Move] = []
    left = budget
    slack = _tol(budget)
    for k in order:
        i = int(cand[k])
        if avg[i] <= left + slack:
            moves.append(Move(i, src, dst, float(avg[i]), float(score[k])))
            left -= avg[i]
    return moves


def one_way(
    series: Any, assignment: Any, a: int, b: int, *, target: float | None = None
) -> list[Move]:
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


def _select_improving(plan: list[Move], load: dict[int, float], limit: int) -> list[Move]:
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
        if (
            lanes > 1
            and _imbalance(lane_avg) >= self.threshold
            and float(lane_avg.max() - lane_avg.min()) > 0
        ):
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
