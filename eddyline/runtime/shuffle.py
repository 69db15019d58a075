"""The shared back half of every stateful step: from keyed rows to one Spark task per lane.

Lane ``i`` must be shuffle partition ``i``: rows are shuffled on a *routing value* that Spark's
hash partitioning sends to their key group's lane (see :mod:`eddyline.plan.keygroups`). Each lane's
task then runs :func:`eddyline.runtime.lanes.run_lane`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from eddyline.columns import KG, PROBE
from eddyline.kinds.base import spark_schema
from eddyline.plan.keygroups import RoutingTable, route_values
from eddyline.runtime.lanes import LaneTask, run_lane

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Heartbeats:
    """One heartbeat row per lane (``_kg = -1 - lane``) rides the lane shuffle: a lane learns its
    number from its data (a task's partition id is shifted when a union follows the lane in the
    same Spark stage), and an empty lane still runs to fire its key groups' timers. The frame
    depends only on the lane count and the columns, so it is built once and reused by later
    epochs (each DataFrame built costs a JVM analysis round)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._frames: dict[tuple[Any, ...], DataFrame] = {}

    def frame(self, lanes: int, columns: list[Any]) -> DataFrame:
        from pyspark.sql import functions as F

        key = (lanes, tuple((f.name, f.dataType.simpleString()) for f in columns))
        beats = self._frames.get(key)
        if beats is None:
            beats = self.spark.range(0, lanes, 1, 1).select(
                *[
                    F.expr("CAST(-1 - id AS INT)").alias(KG) if f.name == KG else F.lit(None).cast(f.dataType).alias(f.name)
                    for f in columns
                ]
            )
            self._frames[key] = beats
        return beats


def spread(rows: DataFrame, routing: RoutingTable) -> DataFrame:
    """SPREADFIRE: a new row of a split key group is *stored* in one fragment (chosen by a
    hash of its content, so a replay chooses the same) and sent as a *probe* copy to every
    other fragment, where it meets the rows those fragments stored earlier. Fragment ``f``
    of group ``g`` is the virtual key group ``g + K*f``."""
    k = routing.key_groups
    cases = " ".join(f"WHEN {g} THEN {1 + len(extra)}" for g, extra in sorted(routing.spread.items()))
    content = ", ".join(f"`{c}`" for c in rows.columns if c != KG)
    cols = [f"`{c}`" for c in rows.columns if c != KG]
    return (
        rows.selectExpr("*", f"CASE {KG} {cases} ELSE 1 END AS _nfrag")
        .selectExpr("*", f"CAST(pmod(xxhash64({content}), _nfrag) AS INT) AS _home", "explode(sequence(0, _nfrag - 1)) AS _frag")
        .selectExpr(f"CAST({KG} + {k} * _frag AS INT) AS {KG}", *cols, f"_frag != _home AS {PROBE}")
    )


def routing_expression(routing: RoutingTable) -> str:
    """The SQL expression whose value Spark's hash partitioning (``repartition(lanes, expr)``)
    sends to partition ``i`` for every row of a key group routed to lane ``i`` (``_kg`` a
    virtual key group), and for lane ``i``'s heartbeat (``_kg = -1 - i``)."""
    routes = ", ".join(f"{v}L" for v in routing.route_values())
    lane_routes = ", ".join(f"{v}L" for v in route_values(routing.lanes))
    return (f"CASE WHEN {KG} >= 0 THEN element_at(array({routes}), {KG} + 1) "
            f"ELSE element_at(array({lane_routes}), -{KG}) END")


def to_lanes(keyed: DataFrame, task: LaneTask, routing: RoutingTable, heartbeats: Heartbeats) -> DataFrame:
    """``keyed`` (``_kg`` and the kernel's input columns) shuffled so that lane i is partition i,
    each lane running ``task``'s kernel against its key groups' state."""
    from pyspark.sql import functions as F

    if routing.spread:
        keyed = spread(keyed, routing)
    lanes = routing.lanes  # each step has its own number of lanes (elastic lanes)
    wanted = [*task.kernel.input_schema.names, *([PROBE] if PROBE in keyed.columns else [])]
    columns = [f for f in keyed.schema if f.name in wanted]
    # Rows are shuffled on their routing value, computed in the shuffle's partitioning
    # expression: a value Spark's hash sends to the key group's lane (a heartbeat: to its
    # lane). No column carries it, so none is handed to Python (every column costs the JVM's
    # Arrow conversion per row), and no projection adds or drops it (each costs an analysis
    # round in the driver).
    route = routing_expression(routing)
    if [f.name for f in columns] != keyed.columns:
        keyed = keyed.select(*[f"`{f.name}`" for f in columns])
    routed = keyed.union(heartbeats.frame(lanes, columns)).repartition(lanes, F.expr(route))
    return routed.mapInArrow(functools.partial(run_lane, task), spark_schema(task.kernel.output_schema))
