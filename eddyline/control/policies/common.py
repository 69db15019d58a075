"""What the policies share: moves, array checks, lane loads, correlations, tolerances."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

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


def predicted_lane_loads(
    series: Any, assignment: Any, lanes: int, moves: Iterable[Move]
) -> np.ndarray:
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
            raise ValueError(
                f"move of item {m.item} from lane {m.src}, but it is on lane {int(a[m.item])}"
            )
        a[m.item] = _check_lane(m.dst, lanes, "move destination")
    out = np.zeros(lanes)
    np.add.at(out, a, s.mean(axis=1))
    return out


def _least_loaded(load: np.ndarray, count: np.ndarray, candidates: np.ndarray | None = None) -> int:
    """The lane with the least load, then the fewest items, then the lowest index."""
    idx = np.arange(load.shape[0]) if candidates is None else np.asarray(candidates)
    best = np.lexsort((idx, count[idx], load[idx]))[0]
    return int(idx[best])
