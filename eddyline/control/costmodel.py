"""The overload controller's cost model: what an epoch costs, and how it is fitted.

An epoch takes ``D = F + a * N + sum_S c_S * K_S`` milliseconds (see
:mod:`eddyline.control.overload`). :func:`fit` estimates the terms from the recent epochs'
:class:`EpochCost` (or takes the ones a spec declares); :class:`CostModel` holds them, named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from eddyline.api.control import CostModel as CostModelSpec
    from eddyline.api.network import NetworkSpec
    from eddyline.api.steps import StepSpec


@dataclass(frozen=True)
class EpochCost:
    """What one epoch measured, for the cost model."""

    epoch: int
    duration_ms: float
    read_rows: dict[str, int]  # per source
    offered: dict[str, list[int]]  # per stateful step, per input: rows reaching it
    kept: dict[str, list[int]]  # per stateful step, per input: rows it kept
    makespan_ms: dict[str, float]  # per stateful step: its slowest lane's busy time
    busy_ms: dict[str, float]  # per stateful step: all lanes' busy time
    lanes: dict[str, int]
    out_rows: dict[str, int]  # per stateful step
    sink_rows: dict[str, int]
    wall_s: float


@dataclass(frozen=True)
class CostModel:
    """The terms of ``D = F + a * N + sum_S c_S * K_S``, per stateful step where they are per step."""

    fixed_ms: float  # F: an epoch with no rows (Spark jobs, planning, commit, lanes' start)
    read_ms_per_row: float  # a: reading and routing one source row in the JVM
    step_ms_per_row: dict[str, float]  # c_S: one row kept by step S, at its slowest lane
    selectivity: dict[str, float]  # rows out per row kept, per step
    input_fraction: dict[str, list[float]]  # per step and input: its share of the rows read
    sink_selectivity: dict[str, float]  # per sink: what a row of its step (or source) is worth
    #: per step: the JVM's work per kept row behind its shed point, once shedding told it apart
    #: from reading (included in ``step_ms_per_row``)
    jvm_ms_per_row: dict[str, float] = field(default_factory=dict)

    def predicted_ms(self, read_rows: float, kept: dict[str, float]) -> float:
        return self.fixed_ms + self.read_ms_per_row * read_rows + sum(
            c * kept.get(k, 0.0) for k, c in self.step_ms_per_row.items()
        )

    def to_json(self) -> dict[str, Any]:
        """As decisions and progress records show it (the paper's symbols)."""
        return {
            "F": self.fixed_ms,
            "a": self.read_ms_per_row,
            "cost": self.step_ms_per_row,
            "selectivity": self.selectivity,
            "input_fraction": self.input_fraction,
            "sink_selectivity": self.sink_selectivity,
            **({"jvm": self.jvm_ms_per_row} if self.jvm_ms_per_row else {}),
        }


def fit(
    history: list[EpochCost],
    stateful: list[StepSpec],
    spec: NetworkSpec,
    declared: CostModelSpec | None,
    producer: Callable[[str], str],
) -> CostModel | None:
    """F, a and per-step c_S, selectivities and input fractions, from the recent epochs.

    Fixed costs are taken at their smallest over the history (a slow epoch is slow for
    reasons a row count does not explain, e.g. a cold JVM; the fastest shows what an epoch
    costs at least), per-row costs as medians of what is left per row. A lane's fixed
    cost (start, state files) is part of F: shedding rows cannot remove it.

    ``declared``: the cost model the spec declares, when it is in force; ``producer``: the
    stateful step (or source) a node's rows come from."""
    hist = list(history)
    if len([h for h in hist if sum(h.read_rows.values()) > 0]) < 2:
        return None
    recent = hist[-4:]
    cost: dict[str, float] = {}
    sel: dict[str, float] = {}
    frac: dict[str, list[float]] = {}
    for s in stateful:
        spans = [h.makespan_ms.get(s.name, 0.0) for h in hist]
        line = _line([float(sum(h.kept.get(s.name, []))) for h in hist], spans)
        if line is not None:
            cost[s.name] = line[1]
        else:
            fixed = min(spans) if spans else 0.0
            per_row = [
                (h.makespan_ms.get(s.name, 0.0) - fixed) / sum(h.kept.get(s.name, []))
                for h in recent
                if sum(h.kept.get(s.name, [])) > 0
            ]
            cost[s.name] = max(0.0, float(np.median(per_row))) if per_row else 0.0
        kept = sum(sum(h.kept.get(s.name, [])) for h in recent)
        sel[s.name] = sum(h.out_rows.get(s.name, 0) for h in recent) / kept if kept else 1.0
        read = sum(sum(h.read_rows.values()) for h in recent)
        offered = np.sum([h.offered.get(s.name, [0] * len(s.inputs)) for h in recent], axis=0)
        frac[s.name] = [float(x) / read if read else 0.0 for x in np.atleast_1d(offered)]
    jvm: dict[str, float] = {}
    if declared is not None:
        cost = {k: float(declared.step_ms_per_row.get(k, 0.0)) for k in cost}
        f, a = declared.fixed_ms, declared.read_ms_per_row
    else:
        n = np.array([sum(h.read_rows.values()) for h in hist], dtype=float)
        rest = np.array(
            [h.duration_ms - sum(cost[k] * sum(h.kept.get(k, [])) for k in cost) for h in hist]
        )
        line = _line(n.tolist(), rest.tolist())
        if line is not None:
            f, a = line
        else:
            f = max(0.0, float(rest.min()))
            slopes = [(r - f) / x for r, x in zip(rest[-4:], n[-4:], strict=True) if x > 0]
            a = max(0.0, float(np.median(slopes))) if slopes else 0.0
        split = _split_jvm([s.name for s in stateful], hist, rest)
        if split is not None:
            f, a, jvm = split
            cost = {k: cost[k] + jvm.get(k, 0.0) for k in cost}
    sink_sel = {}
    for q in spec.sinks:
        up = producer(q.input)
        base = (
            sum(h.out_rows.get(up, 0) for h in recent)
            if up in cost
            else sum(sum(h.read_rows.values()) for h in recent)
        )
        if up in cost:
            # A query is worth its utility per *input* row its step keeps, not per output
            # row: a window emits one row per key and window however many rows it kept.
            sink_sel[q.name] = 1.0 / sel[up] if sel[up] > 0 else 0.0
        else:
            sink_sel[q.name] = (
                sum(h.sink_rows.get(q.name, 0) for h in recent) / base if base else 0.0
            )
    return CostModel(f, a, cost, sel, frac, sink_sel, jvm)


def _split_jvm(
    names: list[str], hist: list[EpochCost], rest: np.ndarray
) -> tuple[float, float, dict[str, float]] | None:
    """Separate the JVM's work per *kept* row of each stateful step from the cost of reading.

    The part of an epoch the lanes do not explain, ``rest = F + a·N + Σ j_S·K_S``, mixes
    reading a row with the step's own JVM work behind its shed point (the window's partial
    aggregation, the shuffle of a dedup's rows). While nothing is shed ``K_S`` is a fixed
    share of ``N`` and the two cannot be told apart, so all of it counts as reading (the
    cautious side: shedding looks less effective than it is). Once the history holds an epoch
    that shed (two, unless the other epochs' row counts spread enough to pin ``F`` and ``a``),
    ``K_S`` varies apart from ``N`` and a non-negative least-squares fit tells them apart."""
    shed_epochs = [
        h
        for h in hist
        if any(sum(h.kept.get(k, [])) < 0.95 * sum(h.offered.get(k, [])) for k in names)
    ]
    unshed = [sum(h.read_rows.values()) for h in hist if h not in shed_epochs]
    spread = bool(unshed) and min(unshed) > 0 and max(unshed) >= 1.5 * min(unshed)
    # one shedding epoch suffices when the others pin F and a (their row counts spread)
    if not shed_epochs or (len(shed_epochs) < 2 and not spread) or len(hist) < 4:
        return None
    cols = [
        np.ones(len(hist)),
        np.array([sum(h.read_rows.values()) for h in hist], dtype=float),
    ]
    cols += [np.array([sum(h.kept.get(k, [])) for h in hist], dtype=float) for k in names]
    coef = _nnls(np.column_stack(cols), rest)
    return (
        float(coef[0]),
        float(coef[1]),
        {k: float(c) for k, c in zip(names, coef[2:], strict=True) if c > 0},
    )


def _line(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """``y ≈ intercept + slope·x`` with both non-negative (least squares), when the epochs' row
    counts spread enough (largest ≥ 1.5× smallest) to tell a fixed cost from a per-row one;
    otherwise None and the caller falls back to smallest-epoch / median estimates."""
    xs = np.asarray(x, dtype=float)
    if xs.size < 3 or xs.min() <= 0 or xs.max() < 1.5 * xs.min():
        return None
    coef = _nnls(np.column_stack([np.ones_like(xs), xs]), np.asarray(y, dtype=float))
    return float(coef[0]), float(coef[1])


def _nnls(design: np.ndarray, y: Any) -> np.ndarray:
    """Non-negative least squares with each column scaled to at most 1 first (row counts are
    ~1e6, an intercept column is 1: unscaled, the fit is badly conditioned)."""
    from scipy.optimize import nnls

    scale = np.maximum(design.max(axis=0), 1.0)
    return nnls(design / scale, np.asarray(y, dtype=float))[0] / scale
