"""The controller's state round-trips through JSON at every epoch boundary: a controller restored
from it decides exactly as the one that kept running (no Spark)."""

from __future__ import annotations

import json

import numpy as np

from eddyline.control.controller import Controller
from eddyline.control.overload import QUIET, Outcome, OverloadVerdict
from eddyline.control.state import ControllerState, ManagerState
from eddyline.plan.keygroups import RoutingTable

from .loads import K, load, spec

EPOCHS = 30
CONTROL = {
    "balance": {"threshold": 0.15, "period": 1, "patience": 1, "max_moves": 2, "cooldown": 3},
    "scale": {"min_lanes": 1, "max_lanes": 3, "cooldown": 2},
    "history": 8,
}


def per_kg(epoch: int) -> dict[int, float]:
    """A hot key group that moves every 5 epochs, over noisy background load."""
    rng = np.random.default_rng(epoch)
    hot = (epoch // 5) * 3 % K
    return {kg: float(40 if kg == hot else 5 + rng.uniform(0, 3)) for kg in range(K)}


def drive(controller: Controller, table: RoutingTable, first: int, last: int, *,
          restore_at: int | None = None) -> tuple[list[str], RoutingTable]:
    """Plan and observe epochs ``first..last``; with ``restore_at``, before planning that epoch
    the controller is replaced by a fresh one restored from a JSON round trip of its state."""
    decided = []
    for epoch in range(first, last + 1):
        if epoch == restore_at:
            saved = json.loads(json.dumps(controller.snapshot().model_dump(mode="json")))
            controller = Controller(controller.manager.spec, max_lanes=3)
            controller.restore(ControllerState.model_validate(saved))
        table, made = controller.manager.plan(epoch, "s", table)
        decided += [json.dumps(d.to_json(), sort_keys=True) for d in made]
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=0.075))
    return decided, table


def test_a_restored_controller_decides_as_the_uninterrupted_one_at_every_boundary() -> None:
    net = spec(CONTROL)
    want, _ = drive(Controller(net, max_lanes=3), RoutingTable.uniform(K, 2), 1, EPOCHS)
    kinds = [json.loads(d)["kind"] for d in want]
    assert kinds.count("balance") >= 3, kinds
    for k in range(2, EPOCHS + 1):
        got, _ = drive(Controller(net, max_lanes=3), RoutingTable.uniform(K, 2), 1, EPOCHS, restore_at=k)
        assert got == want, f"restored before epoch {k}"


def test_without_its_state_a_controller_decides_differently_inside_a_cooldown() -> None:
    """The test above can fail: a controller that forgot its state (a fresh one, as before the
    state was committed) moves key groups that the balancer had frozen after a move."""
    net = spec(CONTROL)
    controller = Controller(net, max_lanes=3)
    table = RoutingTable.uniform(K, 2)
    want, differs = [], 0
    for epoch in range(1, EPOCHS + 1):
        before = controller.snapshot()
        fresh = Controller(net, max_lanes=3)
        fresh.manager.restore(ManagerState(history=before.manager.history))  # the same statistics, no hysteresis
        frozen = controller.manager.balancers["s"].frozen
        table_fresh, made_fresh = fresh.manager.plan(epoch, "s", table)
        table, made = controller.manager.plan(epoch, "s", table)
        if frozen and [d.to_json() for d in made] != [d.to_json() for d in made_fresh]:
            differs += 1
        want += made
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=0.075))
    assert differs >= 1


def test_overload_outcomes_worth_a_decision() -> None:
    for outcome in Outcome:
        quiet = OverloadVerdict(outcome, {}, {}, {})
        assert quiet.worth_reporting == (outcome not in QUIET)
        assert OverloadVerdict(outcome, {"src": 10}, {}, {}).worth_reporting
        assert OverloadVerdict(outcome, {}, {"s": {"keep": [0.5]}}, {}).worth_reporting


def test_a_plans_snapshot_on_top_of_the_last_commits_is_the_state_the_plan_was_made_with() -> None:
    """A plan logs the controller's state without the statistics (planning does not change
    them); restored on top of the last commit's full state it gives back the whole state."""
    net = spec(CONTROL)
    controller = Controller(net, max_lanes=3)
    table = RoutingTable.uniform(K, 2)
    for epoch in range(1, EPOCHS + 1):
        committed = json.loads(json.dumps(controller.snapshot().model_dump(mode="json")))
        table, _ = controller.manager.plan(epoch, "s", table)
        planned = controller.snapshot(statistics=False)
        assert planned.manager.history is None
        replay = Controller(net, max_lanes=3)
        replay.restore(ControllerState.model_validate(committed))
        replay.restore(ControllerState.model_validate(json.loads(json.dumps(planned.model_dump(mode="json")))))
        assert replay.snapshot() == controller.snapshot(), epoch
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=0.075))
