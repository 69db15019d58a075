"""The shedding problem as the controller states it, and the plan an answer gives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Separator between the tail and the head of an arc name: ``"source_or_step->step"``.
ARC_SEPARATOR = "->"

#: A node counts as overloaded when its load exceeds ``capacity + FEASIBILITY_TOL * max(1, capacity)``.
FEASIBILITY_TOL = 1e-9


def arc(tail: str, head: str) -> str:
    """The name of the arc from ``tail`` (a source or a step) into step ``head``."""
    return f"{tail}{ARC_SEPARATOR}{head}"


@dataclass(frozen=True)
class StepLoad:
    """One step of the query network, as the shedding model sees it.

    ``cost`` is in capacity units per input tuple, ``selectivity`` is output tuples per input
    tuple, and ``inputs`` names sources or other steps (their rates are summed).
    """

    name: str
    node: str
    cost: float
    selectivity: float
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class ShedProblem:
    """A query network with its input rates, node capacities and query-output utilities.

    ``utilities`` maps the names of steps whose output is a query output to the value of one
    output tuple (any finite number). ``shed_points`` lists the arcs where tuples may be dropped,
    as ``"tail->head"``; ``None`` means every arc leaving a source plus every arc between two
    nodes (see the module docstring).
    """

    rates: dict[str, float]
    steps: tuple[StepLoad, ...]
    capacities: dict[str, float]
    utilities: dict[str, float]
    shed_points: tuple[str, ...] | None = None
    #: optional upper bounds on the rate admitted through a shed arc (e.g. no more than a step
    #: has ever been measured at); the LP spends the capacity this leaves elsewhere
    max_admitted: dict[str, float] | None = None


@dataclass(frozen=True)
class ShedPlan:
    """Keep fractions on arcs and what they lead to.

    ``keep`` maps arcs to the fraction of arriving tuples let through (arcs not listed keep
    everything); ``node_load`` is the offered load per node in capacity units per second;
    ``throughput`` is the output rate of each query output; ``utility`` is
    ``sum_q utilities[q] * throughput[q]``. ``status`` is ``"optimal"`` or ``"infeasible"``
    (:func:`solve`), ``"feasible"`` or ``"overloaded"`` (:func:`evaluate`), or ``"uniform"``
    (:func:`uniform_plan`). ``explanation`` holds the inputs and diagnostics as plain JSON data.
    """

    keep: dict[str, float]
    node_load: dict[str, float]
    throughput: dict[str, float]
    utility: float
    status: str
    explanation: dict[str, Any]
