"""Control-line settings against a network, without Spark (eddyline.api.live)."""

from __future__ import annotations

import pytest

from eddyline.api.live import carried, parse_setting, with_settings
from eddyline.api.validate import load_spec
from eddyline.errors import SpecError

NET = {
    "name": "n",
    "sources": [{"name": "bids", "generator": {"rate": 10}}],
    "steps": [
        {"name": "cheap", "input": "bids", "filter": "value < 10"},
        {"name": "slim", "input": "cheap", "select": ["key", "value"]},
        {"name": "counts", "input": "bids", "window_aggregate": {
            "key": "key", "time": "timestamp", "window": {"size": "10s"}, "aggregates": {"n": "count(*)"}}},
    ],
    "sinks": [{"name": "a", "input": "slim", "console": {}}, {"name": "b", "input": "counts", "console": {}}],
}


def test_parse_setting_reads_the_value_as_yaml() -> None:
    assert parse_setting("cheap.filter=value < 3") == ("cheap.filter", "value < 3")
    assert parse_setting("top.k=3") == ("top.k", 3)
    assert parse_setting("slim.select=[key, 'value * 2 AS v']") == ("slim.select", ["key", "value * 2 AS v"])
    for bad in ("cheap", "cheap.filter", ".filter=x", "cheap.=x"):
        with pytest.raises(SpecError, match="expected STEP.PARAM=VALUE"):
            parse_setting(bad)


def test_settings_change_only_what_they_name_and_are_validated_as_a_whole() -> None:
    spec = load_spec(NET)
    changed = with_settings(spec, {"cheap.filter": "value < 3", "counts.watermark_delay": "5s", "slim.select": ["key"]})
    assert changed.step("cheap").params == "value < 3"
    assert changed.step("counts").params.watermark_delay == 5_000
    assert changed.step("slim").params == ("key",)
    assert changed.step("counts").params.aggregates == spec.step("counts").params.aggregates
    assert with_settings(spec, {}) is spec


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"cheap.filter": "value <"}, "control cheap.filter='value <': step 'cheap': filter: invalid SQL expression"),
        ({"counts.watermark_delay": "soon"}, "control counts.watermark_delay='soon': step 'counts': watermark_delay:"),
        ({"counts.aggregates": {"n": "sum(value)"}},
         "control counts.aggregates: 'aggregates' of a window_aggregate step cannot change while it runs "
         "(can: one of watermark_delay, allowed_lateness)"),
        ({"ghost.filter": "true"}, "control ghost.filter: no step or sink 'ghost'; steps: cheap, slim, counts; sinks: a, b"),
        ({"a.format": "json"}, "control a.format: 'format' of a console sink cannot change while it runs (can: none)"),
        ({"slim.select": []}, "control slim.select=[]: step 'slim': expected at least one expression"),
    ],
)
def test_a_setting_that_does_not_fit_is_refused_naming_it(settings: dict, message: str) -> None:
    with pytest.raises(SpecError) as e:
        with_settings(load_spec(NET), settings)
    assert str(e.value).startswith(message)


def test_a_network_change_names_what_cannot_change_in_place() -> None:
    import copy

    from eddyline.api.change import check_change, network_diff

    old = load_spec(NET)
    new = copy.deepcopy(NET)
    new["name"], new["key_groups"] = "other", 64
    new["sources"][0]["generator"]["rate"] = 20
    new["steps"][2]["window_aggregate"]["aggregates"] = {"n": "count(*)", "s": "sum(value)"}
    d = network_diff(old, load_spec(new), reset=("cheap",))
    assert d.problems == [
        "name: the running network is 'n'; a change keeps the name",
        "key_groups: the running network has 128; state is cut by them, so they stay",
        "source 'bids': its offsets would mean something else; remove it and add one with another name",
        "step 'counts': window_aggregate.aggregates.s changed, and its state would not fit the changed step; give --reset counts to start it with no state",
        "reset: cheap: not a stateful step of the running network",
    ]
    ok = copy.deepcopy(NET)
    ok["steps"][0]["filter"] = "value < 20"
    ok["steps"][2]["window_aggregate"]["watermark_delay"] = "3s"
    ok["steps"] = [s for s in ok["steps"] if s["name"] != "slim"]
    ok["sinks"] = [*ok["sinks"][1:], {"name": "c", "input": "cheap", "console": {}}]
    d = check_change(old, load_spec(ok))
    assert d.lines() == [
        "+ sink 'c'", "- step 'slim'", "- sink 'a'",
        "~ step 'cheap': filter", "~ step 'counts': window_aggregate.watermark_delay",
    ]


def test_control_plane_settings_change_the_policies_and_keep_their_state() -> None:
    from eddyline.control.controller import Controller

    raw = {**NET, "control": {"balance": {"threshold": 0.2, "cooldown": 3}, "scale": {"max_lanes": 4}}}
    spec = load_spec(raw)
    controller = Controller(spec, max_lanes=2)
    balancer = controller.manager.balancers["counts"]
    balancer._streak = 1  # a decision under way
    changed = with_settings(spec, {"control.balance.threshold": 0.5, "control.scale.max_lanes": 3})
    controller.reconfigure(changed)
    assert controller.manager.balancers["counts"] is balancer
    assert (balancer.threshold, balancer.cooldown, balancer._streak) == (0.5, 3, 1)
    assert controller.manager.scalers["counts"].max_lanes == 3
    with pytest.raises(SpecError, match=r"control control.placement: cannot change while it runs \(can: control.balance.threshold"):
        with_settings(spec, {"control.placement": "greedy"})
    with pytest.raises(SpecError, match="the network has no control.overload; it cannot be turned on while it runs"):
        with_settings(spec, {"control.overload.mode": "semantic"})
    with pytest.raises(SpecError, match=r"control.balance.threshold=-1"):
        with_settings(spec, {"control.balance.threshold": -1})


def test_settings_stay_in_force_across_a_change_of_network_unless_it_sets_the_parameter_itself() -> None:
    import copy

    old = load_spec(NET)
    settings = {"cheap.filter": "value < 3", "counts.watermark_delay": "5s", "slim.select": ["key"]}
    other = copy.deepcopy(NET)
    other["steps"][2]["window_aggregate"]["watermark_delay"] = "9s"  # written anew: the file wins
    other["steps"][1]["select"] = ["key", "value", "value * 2 AS v"]
    other["sinks"].append({"name": "c", "input": "cheap", "console": {}})
    new = load_spec(other)
    assert carried(old, new, settings) == {"cheap.filter": "value < 3"}
    gone = copy.deepcopy(NET)
    gone["steps"] = gone["steps"][2:]
    gone["sinks"] = gone["sinks"][1:]
    assert carried(old, load_spec(gone), settings) == {"counts.watermark_delay": "5s"}  # the others are gone
    assert carried(old, old, settings) == settings


def test_a_sinks_target_may_change_and_nothing_else_of_it() -> None:
    raw = {**NET, "sinks": [{"name": "a", "input": "slim", "files": {"path": "/data/a", "format": "json"}},
                            {"name": "b", "input": "counts", "console": {}}]}
    spec = load_spec(raw)
    moved = with_settings(spec, {"a.path": "/data/a-v2"})
    assert moved.node("a").params.path == "/data/a-v2" and moved.node("a").params.format == "json"
    assert moved.node("b") == spec.node("b") and moved.steps == spec.steps
    with pytest.raises(SpecError, match=r"'format' of a files sink cannot change while it runs \(can: one of path\)"):
        with_settings(spec, {"a.format": "csv"})
    with pytest.raises(SpecError, match="control a.path='': .*path"):
        with_settings(spec, {"a.path": ""})
    # a new network that leaves the sink as it was keeps the setting; one that moves it itself wins
    assert carried(spec, spec, {"a.path": "/data/a-v2"}) == {"a.path": "/data/a-v2"}
    raw2 = {**raw, "sinks": [{**raw["sinks"][0], "files": {"path": "/elsewhere", "format": "json"}}, raw["sinks"][1]]}
    assert carried(spec, load_spec(raw2), {"a.path": "/data/a-v2"}) == {}

