"""Graph rewriting without Spark: the hot-spot detector over made-up load histories, the rules as
data, and the checks that keep a rewrite command honest."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eddyline.api.change import check_change, network_diff
from eddyline.api.validate import load_spec, spec_from_raw
from eddyline.control.controller import Controller
from eddyline.control.hotspot import hot_spots
from eddyline.control.stats import LoadHistory, StepLoad
from eddyline.errors import SpecError
from eddyline.kinds.rewrite import RULES, fitting, rewrite
from eddyline.runtime.inbox import Inbox
from eddyline.runtime.rewriting import checked_rewrite, propose_rewrites

PATTERN = {"key": "key", "time": "t", "within": "10s", "factory": "eddyline.operators.pattern:tick_pattern",
           "args": {"value_col": "v"}}


def raw(rewrite_cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": "net", "key_groups": 8,
        "sources": [{"name": "ticks", "generator": {"keys": 4}}],
        "steps": [
            {"name": "found", "input": "ticks", "pattern": PATTERN},
            {"name": "counts", "input": "ticks", "window_aggregate": {
                "key": "key", "time": "event_time", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"}}},
        ],
        "sinks": [{"name": "m", "input": "found", "console": {}}, {"name": "c", "input": "counts", "console": {}}],
        "control": {"rewrite": rewrite_cfg or {}},
    }


def load(epoch: int, busy: list[float], kg: dict[int, float], wall_s: float = 1.0) -> StepLoad:
    return StepLoad(epoch, len(busy), kg, {}, {}, busy, 0, 0, 0, 0, wall_s)


def history(found: list[StepLoad], counts: list[StepLoad]) -> LoadHistory:
    h = LoadHistory(8)
    for a, b in zip(found, counts, strict=True):
        h.add("found", a)
        h.add("counts", b)
    return h


HOT = {0: 90.0, 1: 5.0, 2: 5.0}  # one key group carries 1.8x a fair lane's share of 2 lanes
EVEN = {g: 10.0 for g in range(8)}


def test_a_saturated_critical_step_with_a_hot_key_group_is_a_hot_spot_after_patience() -> None:
    spec = load_spec(raw({"saturation": 0.5, "patience": 2}))
    quiet = [load(e, [100.0, 20.0], EVEN) for e in (1, 2, 3)]
    found = [load(1, [700.0, 50.0], HOT), load(2, [600.0, 50.0], HOT), load(3, [650.0, 40.0], HOT)]
    spots = hot_spots(spec, history(found, quiet), 4, max_lanes=2)
    assert [s.step for s in spots] == ["found"]
    assert [w["epoch"] for w in spots[0].why["epochs"]] == [2, 3]
    assert spots[0].why["epochs"][0] == {"epoch": 2, "makespanMs": 600.0, "epochMs": 1000.0, "hotKeyGroup": 0,
                                         "hotShareOfFairLane": 1.8}


@pytest.mark.parametrize("what", ["not saturated", "lanes can fix it", "not critical", "not every epoch", "more lanes"])
def test_what_is_not_a_hot_spot(what: str) -> None:
    spec = load_spec(raw({"saturation": 0.5, "patience": 2}))
    found = [load(e, [700.0, 50.0], HOT) for e in (1, 2)]
    counts = [load(e, [100.0, 20.0], EVEN) for e in (1, 2)]
    max_lanes = 2
    if what == "not saturated":
        found[1] = load(2, [400.0, 50.0], HOT)  # 40% of the epoch
    elif what == "lanes can fix it":
        found[1] = load(2, [700.0, 50.0], {0: 40.0, 1: 30.0, 2: 30.0})  # 0.8x a fair share: move or add lanes
    elif what == "not critical":
        counts[0] = load(1, [900.0, 20.0], EVEN)  # the window step was slower
    elif what == "not every epoch":
        found[0] = load(1, [700.0, 50.0], EVEN)
    else:
        max_lanes = 4  # 90 > 1.2 x (100 / 4) still: the key group is hot with 4 lanes too
    spots = hot_spots(spec, history(found, counts), 3, max_lanes=max_lanes)
    assert (spots != []) == (what == "more lanes"), spots


def test_a_schedule_names_the_epoch_and_auto_off_stops_the_detector() -> None:
    spec = load_spec(raw({"auto": False, "schedule": {5: ["found"]}}))
    hot = history([load(e, [700.0, 50.0], HOT) for e in (1, 2, 3)], [load(e, [1.0, 1.0], EVEN) for e in (1, 2, 3)])
    assert [(s.step, s.why) for s in hot_spots(spec, hot, 5, 2)] == [("found", {"reason": "schedule"})]
    assert hot_spots(spec, hot, 4, 2) == []
    with pytest.raises(SpecError, match=r"control: rewrite.schedule.5: expected epoch >= 1 and stateful steps \(found, counts\), got \['ticks'\]"):
        load_spec(raw({"schedule": {5: ["ticks"]}}))
    with pytest.raises(SpecError, match="rewrite.rules"):
        load_spec(raw({"rules": ["local-global-aggregate"]}))
    with pytest.raises(SpecError, match="control: rewrite: a network with max_delay cannot change its network"):
        load_spec({**raw(), "max_delay": "5s"})


def test_the_pattern_split_rule_as_data() -> None:
    spec = load_spec(raw())
    done = rewrite(spec, spec.as_dict(), "pattern-pipeline-split", "found")
    new = spec_from_raw(done.network)
    assert [s.name for s in new.steps] == ["found_stage1", "found", "counts"]
    s1, s2 = new.steps[0].params, new.steps[1].params
    assert (s1.split.stage, s1.split.at, s1.seeds) == (1, "B", None)
    assert (s2.split.stage, s2.split.at, s2.seeds) == (2, "B", "found_stage1")
    assert done.inherit == {"found_stage1": "found"} and done.fits == ("found",)
    # as a hand-made change the state of 'found' would not fit; the rule vouches for it
    with pytest.raises(SpecError, match="step 'found': input changed, and its state would not fit"):
        check_change(spec, new)
    assert network_diff(spec, new, fits=done.fits).lines() == ["+ step 'found_stage1'", "~ step 'found': pattern.seeds, pattern.split"]
    # where it does not fit, the reason
    assert fitting(spec, spec.as_dict(), "counts", tuple(RULES)) is None
    with pytest.raises(SpecError, match="rewrites pattern steps; 'counts' is a window_aggregate"):
        rewrite(spec, spec.as_dict(), "pattern-pipeline-split", "counts")
    with pytest.raises(SpecError, match="the pattern is split already"):
        rewrite(new, new.as_dict(), "pattern-pipeline-split", "found")
    no_plus = raw()
    no_plus["steps"][0]["pattern"] = {**PATTERN, "factory": "tests.control.test_rewriting:two_steps", "args": {}}
    with pytest.raises(SpecError, match="no Kleene-plus element"):
        rewrite(load_spec(no_plus), no_plus, "pattern-pipeline-split", "found")


def two_steps() -> Any:
    from eddyline.operators.pattern.dsl import Always, Element, Pattern

    return Pattern((Element("A", Always()), Element("B", Always())))


def test_a_rewrite_command_must_be_the_rules_effect(tmp_path) -> None:  # noqa: ANN001
    spec = load_spec(raw({"saturation": 0.5, "patience": 2}))
    controller = Controller(spec, max_lanes=2)
    for e in (1, 2):
        controller.manager.observe("found", load(e, [700.0, 50.0], HOT))
        controller.manager.observe("counts", load(e, [10.0, 10.0], EVEN))
    inbox = Inbox(str(tmp_path))
    assert propose_rewrites(spec, controller, inbox, 3, 2, skip={"found"}) == []  # refused before
    assert propose_rewrites(spec, controller, inbox, 3, 2) == ["found"]
    assert propose_rewrites(spec, controller, inbox, 3, 2) == []  # one waits already
    (command,) = inbox.pending()
    assert command["from"] == "rewrite" and command["rewrite"]["why"]["reason"] == "hot spot"
    assert checked_rewrite(spec, command).inherit == {"found_stage1": "found"}
    tampered = copy.deepcopy(command)
    tampered["network"]["steps"][2]["window_aggregate"]["window"]["size"] = "2s"
    with pytest.raises(SpecError, match="not what rule 'pattern-pipeline-split' makes of the running one"):
        checked_rewrite(spec, tampered)
    smuggled = {**command, "inherit": {"found_stage1": "counts"}}
    with pytest.raises(SpecError, match="not what rule"):
        checked_rewrite(spec, smuggled)


def test_the_aggregate_split_rule_as_data() -> None:
    net = raw()
    net["steps"].append({"name": "totals", "input": "ticks", "aggregate": {
        "key": "key", "time": "event_time", "aggregates": {"n": "count(*)", "top": "max(value)", "latest": "last(value)"}}})
    net["sinks"].append({"name": "t", "input": "totals", "console": {}})
    spec = load_spec(net)
    done = rewrite(spec, spec.as_dict(), "aggregate-local-global-split", "totals")
    new = spec_from_raw(done.network)
    assert [s.name for s in new.steps] == ["found", "counts", "totals_local", "totals"]
    local, totals = new.steps[2], new.steps[3]
    assert (local.kind, local.input, totals.input, totals.params.combined) == ("combine", "ticks", "totals_local", True)
    assert list(local.params.aggregates) == ["n", "top", "latest"]  # their order is the state's columns' order
    assert local.params.aggregates == totals.params.aggregates and local.params.time == "event_time"
    assert done.inherit == {} and done.fits == ("totals",)  # the step keeps the state it has
    with pytest.raises(SpecError, match="step 'totals': input changed, and its state would not fit"):
        check_change(spec, new)
    assert network_diff(spec, new, fits=done.fits).lines() == [
        "+ step 'totals_local'", "~ step 'totals': aggregate.combined, input"]
    # what the rule expects: the makespan by the hot key group's share of a fair lane
    why = {"epochs": [{"hotShareOfFairLane": 2.5}, {"hotShareOfFairLane": 2.0}]}
    assert RULES["aggregate-local-global-split"].expect(800.0, why) == {"stepMakespanMs": 400.0, "makespanMs": 400.0}
    assert RULES["aggregate-local-global-split"].expect(800.0, {"reason": "schedule"})["makespanMs"] == 800.0
    # where it does not fit, the reason
    with pytest.raises(SpecError, match="takes combined partials already"):
        rewrite(new, new.as_dict(), "aggregate-local-global-split", "totals")
    taken = copy.deepcopy(net)
    taken["steps"].append({"name": "totals_local", "input": "ticks", "select": ["key"]})
    taken["sinks"].append({"name": "l", "input": "totals_local", "console": {}})
    with pytest.raises(SpecError, match="the name 'totals_local' for the local step is taken"):
        rewrite(load_spec(taken), taken, "aggregate-local-global-split", "totals")
    shed = copy.deepcopy(net)
    shed["control"]["overload"] = {"shedding": "uniform"}
    shed["sinks"][2]["qos"] = {"latency": "2s"}
    with pytest.raises(SpecError, match="overload shedding would shed partial rows"):
        rewrite(load_spec(shed), shed, "aggregate-local-global-split", "totals")
    assert fitting(spec, spec.as_dict(), "totals", tuple(RULES))[0] == "aggregate-local-global-split"
