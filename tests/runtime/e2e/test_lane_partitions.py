"""The invariant the lanes rest on (``eddyline.plan.keygroups``): shuffled on the routing
expression, every row of a key group — a spread fragment's virtual key group too — lands in the
Spark partition numbered as its lane, and each lane's heartbeat in its own; for any number of
lanes and any assignment, not only the uniform one."""

from __future__ import annotations

import random

import pytest

from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.shuffle import routing_expression


def tables() -> list[RoutingTable]:
    rng = random.Random(7)
    out = [RoutingTable.uniform(128, lanes) for lanes in (1, 2, 3, 7)]
    for lanes in (2, 5, 8):
        table = RoutingTable(lanes, tuple(rng.randrange(lanes) for _ in range(64)))
        out.append(table.with_spread({3: (lanes - 1,), 10: tuple(range(min(lanes, 3)))}))
    return out


@pytest.mark.parametrize("routing", tables(), ids=lambda t: f"{t.lanes}lanes-{t.key_groups}kg-{len(t.spread)}spread")
def test_lane_i_is_partition_i(spark, routing: RoutingTable) -> None:
    from pyspark.sql import functions as F

    virtual = routing.key_groups * routing.fragments
    kgs = list(range(virtual)) + [-1 - lane for lane in range(routing.lanes)]
    rows = spark.createDataFrame([(kg,) for kg in kgs], "_kg int")
    placed = (rows.repartition(routing.lanes, F.expr(routing_expression(routing)))
              .select("_kg", F.spark_partition_id().alias("partition")).collect())
    got = {r["_kg"]: r["partition"] for r in placed}
    owners = routing.owners()
    wrong = {kg: (got[kg], int(owners[kg])) for kg in range(virtual) if got[kg] != owners[kg]}
    assert wrong == {}, f"key group: (partition, lane) {dict(list(wrong.items())[:5])}"
    assert [got[-1 - lane] for lane in range(routing.lanes)] == list(range(routing.lanes))
