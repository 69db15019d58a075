"""Added steps that start from a kept epoch (``apply --from-epoch``) without Spark: which read a
copy of a running source, how the network runs while they catch up, and what is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eddyline.api.change import (
    catch_ups,
    required_history_starts,
    still_catching_up,
    with_catch_ups,
)
from eddyline.api.validate import load_spec
from eddyline.errors import SpecError

FILES = {"path": "/in", "format": "json", "schema": "auction long, price long, ts timestamp", "max_files_per_epoch": 1}


def running() -> dict[str, Any]:
    return {
        "name": "net", "key_groups": 8,
        "sources": [{"name": "bids", "files": FILES}, {"name": "people", "files": {**FILES, "path": "/p"}}],
        "steps": [{"name": "cheap", "input": "bids", "filter": "price < 10"}],
        "sinks": [{"name": "c", "input": "cheap", "console": {}}, {"name": "p", "input": "people", "console": {}}],
    }


def with_queries(*steps: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(running())
    for s in steps:
        raw["steps"].append(s)
        raw["sinks"].append({"name": f"to_{s['name']}", "input": s["name"], "console": {}})
    return raw


COUNTS = {"name": "counts", "input": "bids", "aggregate": {"key": "auction", "aggregates": {"n": "count(*)"}}}


def test_added_steps_on_a_running_source_read_a_copy_until_they_catch_up() -> None:
    old = load_spec(running())
    new = load_spec(with_queries(COUNTS, {"name": "big", "input": "bids", "filter": "price > 90"},
                                 {"name": "on_cheap", "input": "cheap", "select": ["price"]}))
    copies = catch_ups(old, new, 3)
    assert copies == {"bids__from_3": ("bids", ("counts", "big"))}  # not 'on_cheap': it reads a running step
    assert required_history_starts(old, new, 3) == {"bids__from_3": "bids"}
    runs = with_catch_ups(new, copies)
    assert [s.name for s in runs.sources] == ["bids", "people", "bids__from_3"]
    assert runs.node("bids__from_3").params == runs.node("bids").params
    assert {s.name: s.inputs for s in runs.steps} == {
        "cheap": ("bids",), "counts": ("bids__from_3",), "big": ("bids__from_3",), "on_cheap": ("cheap",)}
    # a later network without one of the steps, or without the source: what still applies
    gone = load_spec(with_queries(COUNTS))
    assert still_catching_up(gone, copies) == {"bids__from_3": ("bids", ("counts",))}
    assert still_catching_up(old, copies) == {} and with_catch_ups(old, copies) is old


def test_what_cannot_start_from_a_kept_epoch_is_refused() -> None:
    old = load_spec(running())
    with pytest.raises(SpecError, match="no added step reads a running source and no added source reads what a running one reads"):
        required_history_starts(old, load_spec(with_queries({"name": "on_cheap", "input": "cheap", "select": ["price"]})), 2)
    join = {"name": "both", "join": {"left": "bids", "right": "people", "left_key": "auction", "right_key": "auction"}}
    joined = with_queries(join)
    with pytest.raises(SpecError, match="step 'both' reads running source 'bids' among other inputs"):
        catch_ups(old, load_spec(joined), 2)
    taken = with_queries(COUNTS)
    taken["sources"].append({"name": "bids__from_2", "files": {**FILES, "path": "/other"}})
    taken["sinks"].append({"name": "o", "input": "bids__from_2", "console": {}})
    with pytest.raises(SpecError, match="the name 'bids__from_2' for the copy of source 'bids' is taken"):
        catch_ups(old, load_spec(taken), 2)


def test_a_change_that_reads_more_of_a_join_than_it_stores_needs_the_join_reset():
    """A join keeps only the columns read after it: reading fewer of them is a change like any
    other, reading one it left out would find its stored rows without it."""
    from eddyline.api.change import network_diff

    def net(select: list[str]) -> Any:
        raw = copy.deepcopy(running())
        raw["steps"] += [{"name": "j", "join": {"left": "bids", "right": "people", "left_key": "auction",
                                                "right_key": "auction"}},
                         {"name": "s", "input": "j", "select": select}]
        raw["sinks"].append({"name": "out", "input": "s", "console": {}})
        return load_spec(raw)

    old = net(["auction", "price"])
    assert not network_diff(old, net(["price"])).problems
    wider = network_diff(old, net(["price", "ts_right"]))
    assert wider.incompatible == ["j"]
    assert wider.problems == [
        "step 'j': it stores only the columns read after it (auction, price besides its keys and times), and the "
        "change reads more (ts_right); give --reset j to start it with no state"]
    assert not network_diff(old, net(["price", "ts_right"]), reset=("j",)).problems
    assert network_diff(old, net(["*"])).incompatible == ["j"]  # a star reads every column
