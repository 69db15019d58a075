"""A controller restored from its state (through JSON) at any epoch boundary takes the decisions
of the one that kept running, cool-downs and scaler history included; the typed overload
verdicts say what the engine used to read from free text (no Spark)."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from eddyline.control.controller import Controller
from eddyline.control.decisions import Decision, DecisionKind
from eddyline.control.manager import RECENT
from eddyline.control.overload import QUIET, Outcome, OverloadController, OverloadVerdict
from eddyline.control.state import ControllerState
from eddyline.control.stats import StepLoad
from eddyline.plan.keygroups import RoutingTable

from . import overloads as ov
from .loads import K, load, spec

EPOCHS = 30
CONTROL = {
    "balance": {"threshold": 0.15, "period": 1, "patience": 2, "max_moves": 2, "cooldown": 3},
    "scale": {"min_lanes": 2, "max_lanes": 3, "cooldown": 4},
    "history": 8,
}
Hook = Callable[[Controller], Controller]


def per_kg(epoch: int) -> dict[int, float]:
    """A hot key group that moves every 6 epochs, over noisy background load."""
    rng = np.random.default_rng(epoch)
    hot = (epoch // 6) * 3 % K
    return {kg: float(40 if kg == hot else 5 + rng.uniform(0, 3)) for kg in range(K)}


def wall_s(epoch: int) -> float:
    """Input arrives 4x faster in epochs 12-19: the scaler adds a lane, then takes it away."""
    return 0.05 if 12 <= epoch < 20 else 0.2


def through_json(controller: Controller) -> Controller:
    """A fresh controller (a restarted driver) restored from a JSON round trip of the state."""
    saved = json.loads(json.dumps(controller.snapshot().model_dump(mode="json")))
    fresh = Controller(controller.spec, max_lanes=3)
    fresh.restore(ControllerState.model_validate(saved))
    return fresh


def run(
    *, before_plan: dict[int, Hook] | None = None, before_observe: dict[int, Hook] | None = None
) -> list[str]:
    """Plan and observe every epoch; a hook may swap the controller before an epoch is planned
    (a restart from the last commit) or before it is observed (a replay of a logged plan).
    Returns per epoch its decisions and the recent decisions the progress would show."""
    controller, table, out = Controller(spec(CONTROL), max_lanes=3), RoutingTable.uniform(K, 2), []
    for epoch in range(1, EPOCHS + 1):
        if before_plan and epoch in before_plan:
            controller = before_plan[epoch](controller)
        table, made = controller.manager.plan(epoch, "s", table)
        out.append(json.dumps([d.to_json() for d in made], sort_keys=True))
        if before_observe and epoch in before_observe:
            controller = before_observe[epoch](controller)
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=wall_s(epoch)))
        out.append(json.dumps(controller.manager.recent(RECENT), sort_keys=True))
    out.append(json.dumps(controller.snapshot().model_dump(mode="json"), sort_keys=True))
    return out


def cooling_down() -> list[int]:
    """The epochs planned while the balancer keeps key groups it moved where they are."""
    controller, table, out = Controller(spec(CONTROL), max_lanes=3), RoutingTable.uniform(K, 2), []
    for epoch in range(1, EPOCHS + 1):
        if controller.snapshot().manager.balancers["s"].frozen:
            out.append(epoch)
        table, _ = controller.manager.plan(epoch, "s", table)
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=wall_s(epoch)))
    return out


@pytest.fixture(scope="module")
def uninterrupted() -> list[str]:
    return run()


def test_the_run_balances_rescales_and_cools_down(uninterrupted: list[str]) -> None:
    kinds = [d["kind"] for epoch in uninterrupted[0:-1:2] for d in json.loads(epoch)]
    assert kinds.count("balance") >= 5 and kinds.count("rescale") == 2, kinds
    assert len(cooling_down()) >= 10


@pytest.mark.parametrize("k", range(1, EPOCHS + 1))
def test_restored_after_a_commit_it_decides_as_the_uninterrupted_one(
    k: int, uninterrupted: list[str]
) -> None:
    assert run(before_plan={k: through_json}) == uninterrupted


@pytest.mark.parametrize("k", range(1, EPOCHS + 1))
def test_restored_from_a_logged_plan_it_decides_as_the_uninterrupted_one(
    k: int, uninterrupted: list[str]
) -> None:
    assert run(before_observe={k: through_json}) == uninterrupted


def test_restored_again_and_again_it_decides_as_the_uninterrupted_one(
    uninterrupted: list[str],
) -> None:
    every = dict.fromkeys(range(1, EPOCHS + 1), through_json)
    assert run(before_plan=every, before_observe=every) == uninterrupted


def test_a_controller_that_forgot_its_state_inside_a_cooldown_decides_otherwise(
    uninterrupted: list[str],
) -> None:
    """The tests above can fail: a restart that lost the state decides differently at some
    epoch inside a cool-down, both with nothing restored (as before the state was committed)
    and with everything but the cool-downs restored."""

    def forgotten(controller: Controller) -> Controller:
        return Controller(controller.spec, max_lanes=3)

    def thawed(controller: Controller) -> Controller:
        state = controller.snapshot()
        balancer = state.manager.balancers["s"].model_copy(update={"frozen": []})
        manager = state.manager.model_copy(update={"balancers": {"s": balancer}})
        fresh = Controller(controller.spec, max_lanes=3)
        fresh.restore(state.model_copy(update={"manager": manager}))
        return fresh

    cooldown = cooling_down()
    assert cooldown
    assert any(run(before_plan={k: forgotten}) != uninterrupted for k in cooldown)
    assert any(run(before_plan={k: thawed}) != uninterrupted for k in cooldown)


# ---------------------------------------------------------------------- the state as data
def test_the_state_round_trips_through_json_exactly() -> None:
    controller = Controller(spec(CONTROL), max_lanes=3)
    table = RoutingTable.uniform(K, 2)
    for epoch in range(1, 12):
        table, _ = controller.manager.plan(epoch, "s", table)
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=wall_s(epoch)))
    state = controller.snapshot()
    assert (
        ControllerState.model_validate(json.loads(json.dumps(state.model_dump(mode="json"))))
        == state
    )
    assert len(state.manager.history["s"]) == CONTROL["history"]  # bounded as the history is
    # a snapshot is a copy: the controller going on (and measuring decisions) leaves it as it was
    dumped = state.model_dump(mode="json")
    for epoch in range(12, 16):
        table, _ = controller.manager.plan(epoch, "s", table)
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=wall_s(epoch)))
    assert state.model_dump(mode="json") == dumped
    with pytest.raises(ValueError, match="frozen"):
        state.version = 2  # type: ignore[misc]


def test_numbers_keep_their_type_and_numpy_becomes_plain() -> None:
    controller = Controller(spec(CONTROL), max_lanes=3)
    table = RoutingTable.uniform(K, 2)
    odd = StepLoad(
        1,
        2,
        {np.int64(0): np.float64(0.1) + 0.2, 1: 3},
        {0: np.int64(7), 1: 2},
        {},
        [np.float64(1 / 3), 2],
        np.int64(9),
        0,
        0,
        0,
        0.3,
        [{"kg": np.int64(0), "key": "k", "rows": 2}],
    )
    controller.manager.observe("s", odd)
    restored = through_json(controller).manager.history.latest("s")
    assert restored == odd
    assert [type(v) for v in restored.kg_load.values()] == [float, int]
    assert [type(v) for v in restored.lane_busy_ms] == [float, int]
    assert type(restored.input_rows) is int and type(next(iter(restored.kg_load))) is int
    table, made = controller.manager.plan(2, "s", table)  # decides from it as from the original
    assert made == []


def test_the_state_keeps_decisions_to_measure_and_the_recent_ones() -> None:
    controller = Controller(
        spec({**CONTROL, "chaos": {"random_moves": 1, "every": 1}}), max_lanes=3
    )
    table = RoutingTable.uniform(K, 2)
    for epoch in range(1, 20):
        table, _ = controller.manager.plan(epoch, "s", table)
        controller.manager.observe("s", load(epoch, table, per_kg(epoch), wall_s=wall_s(epoch)))
    table, _ = controller.manager.plan(20, "s", table)  # epoch 20's decisions are still to measure
    every = controller.manager.decisions
    kept = controller.snapshot().manager.decisions
    pending = [d for d in every if d.measured is None]
    assert pending and len(every) > len(kept) >= RECENT
    assert [Decision(**d.model_dump()) for d in kept] == [
        d for d in every if d.measured is None or d in every[-RECENT:]
    ]
    assert through_json(controller).manager.recent() == controller.manager.recent()


def test_the_overload_controllers_state_is_part_of_it() -> None:
    net = ov.spec({"cost_model": {"step_ms_per_row": {"a": 0.01}}})
    controller = Controller(net, max_lanes=3)
    assert controller.overload is not None
    for e in (1, 2):
        controller.overload.observe(ov.epoch(e, 1000), {"a": [0.5]})
    again = through_json(controller)
    assert again.overload is not None and again.overload.thresholds == {"a": [0.5]}
    assert again.overload.plan(3, {"src": 160_000}) == controller.overload.plan(3, {"src": 160_000})
    # a commit of before the state was typed held only the overload controller's
    legacy = ControllerState.model_validate(
        {"overload": controller.overload.state().model_dump(mode="json")}
    )
    assert legacy.overload == controller.snapshot().overload and legacy.manager.history == {}


def test_without_a_routing_policy_no_statistics_are_kept() -> None:
    """Nothing would look at them: a network with only overload control keeps its commits small."""
    controller = Controller(ov.spec({}), max_lanes=3)
    table = RoutingTable.uniform(K, 2)
    controller.manager.observe("a", load(1, table, per_kg(1)))
    assert controller.manager.history.epochs("a") and controller.snapshot().manager.history == {}
    assert controller.manager.plan(2, "a", table) == (table, [])


def test_decision_kinds_are_typed_and_plain_strings_in_json() -> None:
    d = Decision(3, "s", DecisionKind.BALANCE, {"moves": [[1, 0, 1]]}, {}, {})
    data = d.to_json()
    assert type(data["kind"]) is str and data["kind"] == "balance"
    assert Decision.from_json(json.loads(json.dumps(data))) == d
    assert Decision.from_json(data).kind is DecisionKind.BALANCE


# ---------------------------------------------------------------------- overload outcomes
def _warmed(cfg: dict) -> OverloadController:
    c = OverloadController(ov.spec(cfg))
    for e in (1, 2):
        c.observe(ov.epoch(e, 1000))
    return c


#: outcome -> (the controller, what is available); the bound is 1 s, the budget 800 ms
CASES: dict[Outcome, tuple[Callable[[], OverloadController], int]] = {
    Outcome.WARMING_UP: (lambda: OverloadController(ov.spec({})), 5_000),
    Outcome.NO_INPUT: (lambda: _warmed({}), 0),
    Outcome.FITS: (
        lambda: _warmed({"cost_model": {"fixed_ms": 100, "step_ms_per_row": {"a": 0.01}}}),
        50_000,
    ),
    Outcome.BELOW_OVERHEAD: (lambda: _warmed({"cost_model": {"fixed_ms": 900}}), 1_000),
    Outcome.ADMISSION: (
        lambda: _warmed(
            {"shedding": "off", "cost_model": {"fixed_ms": 200, "step_ms_per_row": {"a": 0.01}}}
        ),
        200_000,
    ),
    Outcome.SHEDDING: (lambda: _warmed({"cost_model": {"step_ms_per_row": {"a": 0.01}}}), 160_000),
}
#: what the engine used to match against the verdict's reason
LEGACY_QUIET = ("fits the bound", "no input", "warming up (slow start)")


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_says_what_the_reason_said(outcome: Outcome) -> None:
    make, available = CASES[outcome]
    verdict = make().plan(3, {"src": available})
    assert verdict.outcome is outcome
    reason = verdict.explain["reason"]
    assert reason == (
        f"shedding ({ov.spec({}).control.overload.shedding})"
        if outcome is Outcome.SHEDDING
        else outcome.value
    )
    legacy = bool(verdict.shed or verdict.caps or reason not in LEGACY_QUIET)
    assert verdict.worth_reporting == legacy
    assert verdict.worth_reporting == (
        outcome in (Outcome.BELOW_OVERHEAD, Outcome.ADMISSION, Outcome.SHEDDING)
    )
    assert verdict.to_json() == {
        "caps": verdict.caps,
        "shed": verdict.shed,
        "explain": verdict.explain,
    }
    assert bool(verdict.shed) == (outcome is Outcome.SHEDDING)


def test_a_quiet_outcome_that_caps_is_worth_reporting() -> None:
    slow_start = OverloadController(ov.spec({"probe_rows": 1_000}))
    verdict = slow_start.plan(1, {"src": 5_000})
    assert verdict.outcome is Outcome.WARMING_UP and verdict.caps == {"src": 1_000}
    assert verdict.worth_reporting


def test_worth_reporting_for_every_outcome_and_action() -> None:
    for outcome in Outcome:
        assert OverloadVerdict(outcome, {}, {}, {}).worth_reporting == (outcome not in QUIET)
        assert OverloadVerdict(outcome, {"src": 10}, {}, {}).worth_reporting
        assert OverloadVerdict(outcome, {}, {"a": {"keep": [0.5]}}, {}).worth_reporting
