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

from eddyline.control.policies.balancing import (
    Balancer,
    balance,
    one_way,
    pair_lanes,
    since_shift,
    two_way,
)
from eddyline.control.policies.common import (
    METHODS,
    Move,
    correlation,
    lane_loads,
    makespan,
    predicted_lane_loads,
)
from eddyline.control.policies.placement import (
    correlation_placement,
    feasible_fraction,
    greedy_placement,
    place_by,
    resilient_placement,
)
from eddyline.control.policies.scaling import Scaler, ds2_lanes, rescale_assignment

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
    "place_by",
    "resilient_placement",
    "since_shift",
    "two_way",
]
