"""Elasticity: the DS2 rate model, the :class:`Scaler` that adds hysteresis, and rescaling an
assignment to a new lane count moving little load."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from eddyline.control.policies.common import (
    _REL_TOL,
    _as_assignment,
    _as_loads,
    _check_lanes,
    _least_loaded,
    _tol,
)

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

    def decide(
        self, epoch: int, lanes_now: int, arrival_rate: float, true_rate_per_lane: float
    ) -> int | None:
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
            out = ds2_lanes(
                arrival,
                rate,
                target_utilization=t,
                min_lanes=self.min_lanes,
                max_lanes=self.max_lanes,
            )
            return self._change(epoch, out) if out > lanes_now else None
        smaller = ds2_lanes(
            arrival,
            rate,
            target_utilization=t * (1 - self.tolerance),
            min_lanes=self.min_lanes,
            max_lanes=self.max_lanes,
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
