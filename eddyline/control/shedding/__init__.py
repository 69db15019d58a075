"""Coordinated load shedding as a linear program (pure Python, no Spark).

The model follows Tatbul, Çetintemel and Zdonik, "Staying FIT: efficient load shedding techniques
for distributed stream processing" (VLDB 2007). A query network is a DAG of *steps* placed on
*nodes*; for Eddyline a node is a Spark stage or a lane group, and its capacity is the cost it
can spend per second. Sources arrive at rates ``r_k``; a step costs ``cost`` per input tuple and
emits ``selectivity`` tuples per input tuple. Shedding happens on *arcs* (``"tail->head"``): the
arc lets through a keep fraction ``x`` of what arrives on it and drops the rest. A step's input
rate is the sum of its input arcs' rates (multi-input steps are unions or merges; a join, whose
output is not linear in its input rates, is outside this model). The value of a plan is
``sum_q w_q * throughput_q`` over the query outputs ``q`` named in ``utilities``.

**Formulation.** Keep fractions multiply along a path, so with several shed points on one path
the rates are products of variables. FIT sidesteps that by allowing at most one shed point per
path. Here the variables are instead the *admitted rates* ``y_a`` on the shed arcs. In that
variable every rate in the network is affine (walk the DAG in topological order: a shed arc
contributes ``y_a``, any other arc the output of its tail, a step multiplies its summed input by
its selectivity), and the only thing a keep fraction in ``[0, 1]`` requires is

    0 <= y_a <= offered_a(y)

where ``offered_a(y)`` is what reaches the tail of ``a``, itself affine in the ``y`` of the shed
arcs upstream of ``a``. Every feasible ``y`` is produced by exactly one choice of keep fractions
(``x_a = y_a / offered_a(y)``, taken as 1 where nothing arrives), and vice versa, so the LP

    maximise   sum_q w_q out_q(y)
    subject to load_n(y) <= capacity_n          for every node n
               y_a - offered_a(y) <= 0          for every shed arc with shed arcs upstream
               0 <= y_a <= offered_a            for every other shed arc (offered is constant)

is exact for any DAG and any set of shed points: chains, fan-out (one source feeding several
queries), fan-in and several shed points on one path. Its assumptions are the usual ones of the
fluid model: steady rates, costs linear in the input rate, and selectivities that shedding does
not change (true for random shedding; semantic shedding changes the mix, which the model
ignores).

**Tie-break.** Several plans often reach the same utility, e.g. dropping tuples at a source or
dropping the same tuples later at the overloaded node. Among the utility-optimal plans
:func:`solve` takes the one of least total utilisation ``sum_n load_n / capacity_n`` (by
re-solving with the objective perturbed by a tiny multiple of the utilisation, and keeping the
result only if its utility is still optimal). That puts every drop as early as it can go, so
upstream nodes do not spend capacity on tuples that are dropped downstream; a branch that feeds
no query output of positive utility is shed entirely. The shadow prices reported are those of
the unperturbed LP.

**Default shed points.** With ``shed_points=None`` drops are allowed on every arc that leaves a
source (input-side shedding) and on every arc whose tail is a step on another node than its head
(the neighbourhood arcs between nodes, where one node can shed on behalf of its downstream
neighbour). Arcs inside one node are not shed points by default; name them explicitly to allow
them.

**Overload.** :func:`evaluate` reports each node's *offered* load. When a node's offered load
exceeds its capacity, the node is assumed to process only ``capacity / load`` of what enters it
from outside (sources or other nodes) and nothing of the rest, so its outputs shrink by that
factor; downstream nodes see the shrunken rates. That is the behaviour of an overloaded node in
the seed example below, and it needs the graph of nodes to be acyclic when some node is
overloaded. ``scale_overloaded=False`` evaluates the plain fluid model instead.

Seed example (two sources at 1 tuple/s, node A with boxes of cost 1 and 2, node B with boxes of
cost 3 and 1 after them, both capacities 1): no shedding loads A at 3 and, A processing a third,
B at 4/3; the LP keeps ``(1/5, 2/5)`` of the inputs, loads both nodes at exactly 1 and delivers a
throughput of 3/5.

The LP is solved with SciPy's HiGHS (``scipy.optimize.linprog(method="highs")``); the problems
have one variable per shed arc, so it is instantaneous.
"""

from __future__ import annotations

from eddyline.control.shedding.evaluation import evaluate, is_feasible, uniform_plan
from eddyline.control.shedding.linear import solve
from eddyline.control.shedding.problem import (
    ARC_SEPARATOR,
    FEASIBILITY_TOL,
    ShedPlan,
    ShedProblem,
    StepLoad,
    arc,
)

__all__ = [
    "ARC_SEPARATOR",
    "FEASIBILITY_TOL",
    "ShedPlan",
    "ShedProblem",
    "StepLoad",
    "arc",
    "evaluate",
    "is_feasible",
    "solve",
    "uniform_plan",
]
