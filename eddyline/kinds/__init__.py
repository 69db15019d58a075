"""The built-in step kinds, one module each: its parameters, its Spark compile function and,
for a stateful kind, its kernel factory. Importing this package registers them.

+--------------------+-----------+------------------------------------------------------------+
| kind               | module    | what it does                                               |
+====================+===========+============================================================+
| ``filter``         | filter    | keeps rows where a Spark SQL condition holds               |
| ``select``         | select    | Spark SQL expressions                                      |
| ``union``          | union     | rows of several inputs with the same columns               |
| ``udf``            | udf       | a vectorized Python function per batch                     |
| ``lookup``         | lookup    | enrich rows from a versioned table in files                |
| ``window_aggregate`` | window  | tumbling / sliding event-time windows                      |
| ``join``           | join      | unbounded, window and interval joins of two streams        |
| ``dedup``          | dedup     | the first row per key                                      |
| ``top_k``          | topk      | the top rows of each partition                             |
| ``session_window`` | session   | event-time sessions per key                                |
| ``aggregate``      | aggregate | an unbounded aggregate per key, as a changelog             |
| ``combine``        | combine   | partial aggregates per key before the shuffle (the local   |
|                    |           | half of a local/global split)                              |
| ``over_aggregate`` | over      | aggregates over each row's preceding rows                  |
| ``pattern``        | pattern   | complex event patterns per key                             |
+--------------------+-----------+------------------------------------------------------------+
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from eddyline.kinds import (  # noqa: F401  (each module registers its kind)
    aggregate,
    combine,
    dedup,
    filter,
    join,
    lookup,
    over,
    pattern,
    select,
    session,
    topk,
    udf,
    union,
    window,
)
from eddyline.kinds.base import StepKind

if TYPE_CHECKING:
    from eddyline.api.steps import StepSpec


def step_kind(step: StepSpec) -> StepKind:
    """The full kind (compile and kernel included) of a step."""
    return cast(StepKind, step.info)
