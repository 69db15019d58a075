"""The distribution manager on synthetic statistics (no Spark): what it decides and how it explains it."""

from __future__ import annotations

import numpy as np
import pytest

from eddyline.api.validate import load_spec
from eddyline.control.manager import DistributionManager
from eddyline.control.stats import StepLoad, step_load
from eddyline.plan.keygroups import RoutingTable

from .loads import K, load, spec


def test_balance_moves_load_off_the_hot_lane_and_explains_it() -> None:
    m = DistributionManager(spec({"balance": {"threshold": 0.2, "period": 1, "patience": 1, "max_moves": 2}}), max_lanes=2)
    table = RoutingTable.uniform(K, 2)  # kgs 0-3 on lane 0, 4-7 on lane 1
    made = []
    for epoch in range(1, 6):
        table, made = m.plan(epoch, "s", table)
        if made:
            break
        m.observe("s", load(epoch, table, {0: 40, 1: 30, 2: 20, 3: 10, 4: 5, 5: 5, 6: 5, 7: 5}))
    assert len(made) == 1 and made[0].kind == "balance"
    d = made[0]
    assert 1 <= len(d.action["moves"]) <= 2
    assert all(src == 0 and dst == 1 for _, src, dst in d.action["moves"])
    assert d.expected["makespanMs"] < d.why["makespanMs"]
    # a few epochs later the manager measures what happened
    for epoch in range(d.epoch, d.epoch + 2):
        m.observe("s", load(epoch, table, {0: 40, 1: 30, 2: 20, 3: 10, 4: 5, 5: 5, 6: 5, 7: 5}))
    assert d.measured is not None and d.measured["makespanMs"] == pytest.approx(d.expected["makespanMs"], abs=0.2)


def test_noisy_balanced_load_causes_no_moves() -> None:
    rng = np.random.default_rng(3)
    m = DistributionManager(spec({"balance": {"threshold": 0.2, "period": 1, "patience": 2}}), max_lanes=2)
    table = RoutingTable.uniform(K, 2)
    for epoch in range(1, 40):
        table, made = m.plan(epoch, "s", table)
        assert not made
        m.observe("s", load(epoch, table, {kg: 10 + rng.normal(0, 1.5) for kg in range(K)}))


def test_placement_after_warmup_then_rate_model_rescales() -> None:
    m = DistributionManager(spec({"placement": "greedy", "warmup_epochs": 2,
                                  "scale": {"max_lanes": 4, "cooldown": 1, "target_utilization": 0.5}}), max_lanes=4)
    table = RoutingTable.uniform(K, 2)
    skewed = {0: 50, 1: 40, 2: 5, 3: 5, 4: 5, 5: 5, 6: 5, 7: 5}
    kinds = []
    for epoch in range(1, 8):
        table, made = m.plan(epoch, "s", table)
        kinds += [d.kind for d in made]
        # each lane is busy 1 ms per 10 rows; 1 s of wall time per epoch: utilisation is high
        m.observe("s", load(epoch, table, {kg: v * 10 for kg, v in skewed.items()}, wall_s=0.6))
    assert kinds[0] == "placement"
    assert table.assignment[0] != table.assignment[1]  # the two heavy groups were split up
    assert "rescale" in kinds and table.lanes == 4
    rescale = next(d for d in m.decisions if d.kind == "rescale")
    assert rescale.why["reason"] == "rate model (DS2)" and rescale.why["utilization"] > 0.5


def test_hot_key_group_of_a_join_is_spread_once() -> None:
    m = DistributionManager(spec({"spread": {"hot_share": 0.6, "fanout": 2}}, join=True), max_lanes=2)
    table = RoutingTable.uniform(K, 2)
    hot = {kg: 5.0 for kg in range(K)} | {6: 100.0}
    spreads = []
    for epoch in range(1, 6):
        table, made = m.plan(epoch, "s", table)
        spreads += [d for d in made if d.kind == "spread"]
        m.observe("s", load(epoch, table, hot))
    assert len(spreads) == 1
    assert table.spread == {6: (0,)}  # its new rows also go to the other lane; the state stays on lane 1
    assert spreads[0].why["reason"] == "hot key group"


def test_spread_is_only_for_kernels_that_can_split() -> None:
    m = DistributionManager(spec({"spread": {"schedule": {1: [3]}}}), max_lanes=2)  # a dedup
    table, made = m.plan(1, "s", RoutingTable.uniform(K, 2))
    assert not made and not table.spread


def test_parallelism_one_steps_are_placed_as_whole_boxes() -> None:
    """Two global windows (all rows in key group 0) start on the same lane; after the warm-up
    the placement policy puts the two boxes on different lanes."""
    raw = {
        "name": "t", "key_groups": K, "lanes": 2,
        "sources": [{"name": "a", "generator": {}}],
        "steps": [
            {"name": f"total_{i}", "input": "a", "window_aggregate": {
                "time": "event_time", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"}}}
            for i in range(2)
        ],
        "sinks": [{"name": f"o{i}", "input": f"total_{i}", "memory": {}} for i in range(2)],
        "control": {"placement": "correlation", "warmup_epochs": 3},
    }
    m = DistributionManager(load_spec(raw), max_lanes=2)
    tables = {s: RoutingTable.uniform(K, 2) for s in ("total_0", "total_1")}
    assert tables["total_0"].assignment[0] == tables["total_1"].assignment[0] == 0
    rng = np.random.default_rng(1)
    for epoch in range(1, 6):
        for s in tables:
            tables[s], _ = m.plan(epoch, s, tables[s])
            m.observe(s, load(epoch, tables[s], {0: 50 + rng.normal(0, 5)}))
    assert tables["total_0"].assignment[0] != tables["total_1"].assignment[0]
    assert any(d.kind == "placement" and "parallelism 1" in d.why.get("box", "") for d in m.decisions)


def test_placement_that_would_not_pay_off_moves_nothing() -> None:
    """Evenly loaded key groups: a fresh correlation placement might shuffle half of them for a
    gain below ``min_gain``; it must leave the routing alone."""
    rng = np.random.default_rng(1)
    raw = spec({"placement": "correlation", "warmup_epochs": 2}).model_dump(by_alias=True)  # type: ignore[attr-defined]
    m = DistributionManager(load_spec({**raw, "key_groups": 128}), max_lanes=2)
    table = RoutingTable.uniform(128, 2)
    made = []
    for epoch in range(1, 5):
        table, d = m.plan(epoch, "s", table)
        made += d
        m.observe("s", load(epoch, table, {kg: 10 * rng.normal(1, 0.05) for kg in range(128)}))
    assert not made and table.version == 0


def test_after_the_hot_set_moves_balancing_follows_the_new_load_not_the_window_average() -> None:
    """Three epochs with the hot key groups on lane 0, then one with them on lane 1: a 4-epoch
    average still calls lane 0 the heavier one; the epochs after the shift say lane 1."""
    m = DistributionManager(spec({"balance": {"threshold": 0.2, "period": 1, "patience": 1, "max_moves": 2,
                                              "window": 4}}), max_lanes=2)
    table = RoutingTable.uniform(K, 2)  # kgs 0-3 on lane 0, 4-7 on lane 1
    old = {0: 60, 1: 60, 2: 10, 3: 10, 4: 10, 5: 10, 6: 10, 7: 10}   # lane 0: 140, lane 1: 40
    new = {0: 10, 1: 10, 2: 10, 3: 10, 4: 60, 5: 50, 6: 10, 7: 10}   # lane 0: 40, lane 1: 130
    for epoch in (1, 2, 3):
        m.observe("s", load(epoch, table, old))
    m.observe("s", load(4, table, new))
    table, made = m.plan(5, "s", table)
    (d,) = made
    assert d.kind == "balance"
    assert d.action["moves"] and all(src == 1 and dst == 0 for _, src, dst in d.action["moves"])


def test_lookahead_balances_the_epoch_whose_input_shifted_before_it_runs() -> None:
    """Balanced epochs, then an epoch whose input (read ahead) puts the hot key groups on lane
    0: with the look-ahead the moves come before that epoch runs; without it, nothing moves (the
    measured epochs are balanced); an input like the last epoch's moves nothing either."""
    control = {"balance": {"threshold": 0.2, "period": 1, "patience": 1, "max_moves": 4, "lookahead": True}}
    even = {kg: 20.0 for kg in range(K)}
    hot = np.array([3000, 2000, 200, 200, 200, 200, 200, 200], dtype=float)  # rows: lane 0 has 5400 of 6200

    def manager() -> tuple[DistributionManager, RoutingTable]:
        m = DistributionManager(spec(control), max_lanes=2)
        table = RoutingTable.uniform(K, 2)
        for epoch in (1, 2, 3):
            m.observe("s", load(epoch, table, even))  # 200 rows and 20 ms per key group
        return m, table

    m, table = manager()
    new, made = m.plan(4, "s", table, upcoming=hot)
    (d,) = made
    assert d.kind == "balance" and "lookahead" in d.why and d.why["lookahead"]["rows"] == int(hot.sum())
    assert all(src == 0 and dst == 1 for _, src, dst in d.action["moves"])
    lane0 = sum(hot[kg] for kg in range(K) if new.lane_of(kg) == 0)
    assert lane0 < 0.75 * hot.sum() and d.expected["makespanMs"] < d.why["makespanMs"]

    m, table = manager()
    assert m.plan(4, "s", table)[1] == []  # no look-ahead: the history is balanced
    m, table = manager()
    assert m.plan(4, "s", table, upcoming=np.full(K, 200.0))[1] == []  # the input did not shift


def test_a_deferring_kernels_time_is_charged_to_the_rows_it_worked_on() -> None:
    """A kernel that holds input until the watermark passes it works in an epoch on what arrived
    before: its time goes to the groups whose held rows it released, not to this epoch's input."""
    manifests = [
        {"lane": 0, "ms": {"receive": 10, "kernel": 90, "load": 0, "write": 0}, "input_rows": 100, "state_rows": 0,
         "state_bytes": 0, "kg_rows": {"0": 100}, "kg_state_rows": {},
         "kg_work": {"1": 60, "2": 30}, "kg_held": {"0": 100}, "held_before": 90, "held_worked": 90},
    ]
    s = step_load(5, 1, manifests, wall_s=1.0)
    assert s.kg_load == pytest.approx({0: 10.0, 1: 60.0, 2: 30.0})  # receive by input, kernel by work
    assert s.work == {1: 60, 2: 30} and s.kg_held == {0: 100}
    assert s.to_json()["heldRows"] == 100 and s.to_json()["workRows"] == 90
    plain = step_load(5, 1, [{k: v for k, v in manifests[0].items() if not k.startswith(("kg_work", "kg_held", "held"))}], 1.0)
    assert plain.kg_load == pytest.approx({0: 100.0}) and plain.work == plain.kg_rows


def deferred_load(epoch: int, table: RoutingTable, worked: dict[int, int], arrived: dict[int, int]) -> StepLoad:
    """An epoch of a kernel that works on the last epoch's rows (``worked``) and holds back all
    of this epoch's (``arrived``), at 0.1 ms per row worked on."""
    busy = [0.0] * table.lanes
    for kg, v in worked.items():
        busy[table.lane_of(kg)] += v / 10
    return StepLoad(epoch, table.lanes, {kg: v / 10 for kg, v in worked.items()}, dict(arrived), {}, busy,
                    sum(arrived.values()), 0, 0, 0, 1.0, [], dict(worked), dict(arrived),
                    sum(worked.values()), sum(worked.values()))


def test_lookahead_waits_for_a_deferring_kernel_to_work_on_the_shifted_input() -> None:
    """A pattern holds each epoch's rows until the next epoch's watermark: when the input
    shifts, the coming epoch still works on the balanced held rows, so moving key groups for the
    shifted input would unbalance it. The look-ahead moves one epoch later, when the shifted
    rows are the held ones, before the epoch that works on them runs."""
    control = {"balance": {"threshold": 0.2, "period": 1, "patience": 1, "max_moves": 4, "lookahead": True}}
    m = DistributionManager(spec(control), max_lanes=2)
    table = RoutingTable.uniform(K, 2)
    even = {kg: 200 for kg in range(K)}
    hot = np.array([3000, 2000, 200, 200, 200, 200, 200, 200], dtype=float)  # lane 0: 5400 of 6200
    for epoch in (1, 2, 3):
        m.observe("s", deferred_load(epoch, table, even, even))
    # epoch 4's input is hot, but its work is epoch 3's even rows: nothing moves
    table4, made = m.plan(4, "s", table, upcoming=hot)
    assert made == [] and table4 == table
    m.observe("s", deferred_load(4, table, even, {kg: int(v) for kg, v in enumerate(hot)}))
    # epoch 5 works on epoch 4's hot rows (held): the look-ahead moves now
    _, made = m.plan(5, "s", table, upcoming=hot)
    (d,) = made
    assert d.kind == "balance" and d.why["lookahead"]["heldRows"] == d.why["lookahead"]["workRows"] == int(hot.sum())
    assert all(src == 0 and dst == 1 for _, src, dst in d.action["moves"])
    assert d.expected["makespanMs"] < d.why["makespanMs"]


def test_operator_requests_rescale_move_and_rebalance_before_the_policies() -> None:
    """An operator's request (the control API) is taken by the step's next plan, first of all
    stages, as a decision whose why names the operator and the command; the automatic balancer
    does not undo it in the same plan; a request that cannot fit is refused naming why."""
    m = DistributionManager(spec({"scale": {"auto": False, "max_lanes": 2},
                                  "balance": {"threshold": 0.2, "period": 1, "patience": 1}}), max_lanes=2)
    table = RoutingTable.uniform(K, 2)
    skewed = {0: 40, 1: 30, 2: 20, 3: 10, 4: 5, 5: 5, 6: 5, 7: 5}
    m.observe("s", load(1, table, skewed))
    m.observe("s", load(2, table, skewed))  # (the balancer acts on two epochs or more)
    for bad, why in (({"step": "x", "rebalance": True}, "stateful step"), ({"step": "s"}, "exactly one"),
                     ({"step": "s", "lanes": 3}, "from 1 to 2"), ({"step": "s", "move": {"9": 0}}, "key group"),
                     ({"step": "s", "move": {"1": 2}}, "lane from 0 to 1")):
        with pytest.raises(ValueError, match=why):
            m.check_request(bad, lanes_cap=2, lanes_now=2)
    m.request({"step": "s", "move": {"7": 0}, "id": "c1"})
    table, made = m.plan(3, "s", table)
    assert table.assignment[7] == 0 and [d.why["reason"] for d in made] == ["operator"]  # no balance on top
    assert made[0].action["moves"] == [[7, 1, 0]] and made[0].why["command"] == "c1"
    table, made = m.plan(4, "s", table)  # taken once
    assert all(d.why.get("reason") != "operator" for d in made)
    table = RoutingTable.uniform(K, 2)
    m.request({"step": "s", "rebalance": True, "id": "c2"})
    table, made = m.plan(5, "s", table)
    assert made and made[0].kind == "balance" and made[0].why["reason"] == "operator"
    assert made[0].expected["makespanMs"] < made[0].why["makespanMs"]  # moved load off the hot lane
    m.request({"step": "s", "lanes": 1, "id": "c3"})
    table, made = m.plan(6, "s", table)
    assert table.lanes == 1 and made[0].kind == "rescale" and made[0].action["lanes"] == [2, 1]
    assert m.check_request({"step": "s", "rebalance": True}, 2, 2) == "s"


def test_a_lane_count_is_fixed_without_control_scale() -> None:
    m = DistributionManager(spec({}), max_lanes=2)
    with pytest.raises(ValueError, match="no control.scale"):
        m.check_request({"step": "s", "lanes": 1}, lanes_cap=2, lanes_now=2)
