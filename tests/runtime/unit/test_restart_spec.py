"""A run started on a checkpoint with a spec that differs from the network it holds: for every
stateful kind, a change of each field its state depends on is refused before anything runs,
naming the step and the field (the state is never read as another network's); a change of a
live parameter, a stateless step or an added sink is a change to apply at the next boundary.
Without Spark: the checkpoint's metadata and networks only."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import eddyline.kinds  # noqa: F401  (registers the step kinds)
from eddyline.api.steps import STEPS
from eddyline.api.validate import load_spec
from eddyline.errors import SpecError
from eddyline.runtime.checkpoint import Checkpoint, network_hash

FILES = {"path": "/in", "format": "json", "max_files_per_epoch": 1,
         "schema": "auction long, bidder long, price long, ts timestamp, expires timestamp"}
PATTERN = {"key": "auction", "time": "ts", "within": "30s", "factory": "eddyline.operators.pattern:tick_pattern",
           "args": {"value_col": "price"}, "measures": {"a": ["A", "price", "first"]}}

#: per stateful kind, a step of it, and for each field its state depends on, another value
STATEFUL: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "aggregate": ({"key": "auction", "aggregates": {"n": "count(*)"}},
                  {"key": "bidder", "aggregates": {"n": "count(*)", "top": "max(price)"}, "time": "ts"}),
    "window_aggregate": ({"key": "auction", "time": "ts", "window": {"size": "10s"}, "aggregates": {"n": "count(*)"}},
                         {"key": "bidder", "time": "expires", "window": {"size": "5s"},
                          "aggregates": {"n": "count(*)", "s": "sum(price)"}}),
    "dedup": ({"key": "auction", "time": "ts", "ttl": "1m"}, {"key": "bidder", "time": "expires", "ttl": "2m"}),
    "over_aggregate": ({"key": "auction", "time": "ts", "preceding": 10, "aggregates": {"n": "count(*)"}},
                       {"key": "bidder", "time": "expires", "preceding": 20,
                        "aggregates": {"n": "count(*)", "s": "sum(price)"}}),
    "session_window": ({"key": "auction", "time": "ts", "gap": "10s", "aggregates": {"n": "count(*)"}},
                       {"key": "bidder", "time": "expires", "gap": "5s",
                        "aggregates": {"n": "count(*)", "s": "sum(price)"}}),
    "top_k": ({"partition_by": "auction", "order_by": ["price DESC"], "k": 3, "time": "ts"},
              {"partition_by": "bidder", "order_by": ["ts DESC"], "time": "expires", "with_ties": False}),
    "pattern": (PATTERN, {"key": "bidder", "time": "expires", "within": "10s", "args": {"value_col": "bidder"},
                          "measures": {"a": ["A", "bidder", "first"]}}),
    "join": ({"left": "bids", "right": "more", "left_key": "auction", "right_key": "auction", "left_time": "ts",
              "right_time": "ts", "ttl": "1m"},
             {"left_key": "bidder", "right_key": "bidder", "left_time": "expires", "right_time": "expires", "ttl": "2m"}),
}
LIVE = {"window_aggregate": {"watermark_delay": "3s"}, "dedup": {"watermark_delay": "3s"}, "top_k": {"k": 5}}


def network(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    step = {"name": "s", kind: params} if kind == "join" else {"name": "s", "input": "bids", kind: params}
    return {
        "name": "net", "key_groups": 8,
        "sources": [{"name": "bids", "files": FILES}, {"name": "more", "files": {**FILES, "path": "/more"}}],
        "steps": [{"name": "cheap", "input": "bids", "filter": "price < 10"}, step],
        "sinks": [{"name": "out", "input": "s", "console": {}}, {"name": "c", "input": "cheap", "console": {}},
                  *([] if kind == "join" else [{"name": "m", "input": "more", "console": {}}])],
    }


def checkpoint_of(tmp_path: Path, raw: dict[str, Any]) -> Checkpoint:
    """A checkpoint as a run of ``raw`` leaves it (the network it was created with)."""
    spec = load_spec(raw)
    ck = Checkpoint(str(tmp_path / "ckpt"))
    ck.open(spec.fingerprint(), created=ck.store_network(spec.as_dict()))
    return ck


def test_every_stateful_kind_is_covered() -> None:
    assert set(STATEFUL) == {k.key for k in STEPS.find(lambda k: k.stateful)}


CASES = [(kind, field) for kind, (_, other) in STATEFUL.items() for field in other]


@pytest.mark.parametrize(("kind", "field"), CASES, ids=[f"{k}.{f}" for k, f in CASES])
def test_a_change_the_state_cannot_follow_is_refused_naming_step_and_field(tmp_path: Path, kind: str, field: str) -> None:
    base, other = STATEFUL[kind]
    ck = checkpoint_of(tmp_path, network(kind, base))
    changed = network(kind, {**base, field: other[field]})
    with pytest.raises(SpecError) as refused:
        ck.restart_change(load_spec(changed))
    text = str(refused.value)
    assert f"run: step 's': {kind}.{field}" in text and "changed, and its state would not fit" in text, text
    assert "apply with --reset s" in text and f"'eddyline apply SPEC --checkpoint {ck.location}'" in text
    assert "nothing was run" in text
    assert sorted(p.name for p in Path(ck.location).iterdir()) == ["_staging", "metadata.json", "networks"]


@pytest.mark.parametrize("kind", sorted(STATEFUL))
def test_a_change_the_state_can_follow_is_a_change_to_apply(tmp_path: Path, kind: str) -> None:
    base, _ = STATEFUL[kind]
    raw = network(kind, base)
    ck = checkpoint_of(tmp_path, raw)
    assert ck.restart_change(load_spec(raw)) is None  # the same network: nothing to do
    edited = copy.deepcopy(raw)
    edited["steps"][0]["filter"] = "price < 20"  # a stateless step's predicate
    edited["sinks"].append({"name": "more_out", "input": "cheap", "console": {}})  # an added sink
    if kind in LIVE:
        edited["steps"][1][kind] |= LIVE[kind]  # a live parameter of the stateful step
    diff = ck.restart_change(load_spec(edited))
    assert diff is not None and "+ sink 'more_out'" in diff.lines() and "~ step 'cheap': filter" in diff.lines()
    live = [line for line in diff.lines() if line.startswith("~ step 's'")]
    assert live == ([f"~ step 's': {kind}.{next(iter(LIVE[kind]))}"] if kind in LIVE else [])


def test_the_network_it_was_created_with_goes_on_with_the_one_applied_since(tmp_path: Path) -> None:
    raw = network("aggregate", STATEFUL["aggregate"][0])
    ck = checkpoint_of(tmp_path, raw)
    applied = copy.deepcopy(raw)
    applied["steps"][0]["filter"] = "price < 99"
    digest = ck.store_network(load_spec(applied).as_dict())
    ck.record_change(load_spec(applied).fingerprint(), digest, {"epoch": 4})
    assert ck.in_force() == digest == network_hash(load_spec(applied).as_dict())
    assert ck.restart_change(load_spec(raw)) is None  # a supervisor's unchanged command line
    third = copy.deepcopy(raw)
    third["steps"][0]["filter"] = "price < 5"
    assert ck.restart_change(load_spec(third)).lines() == ["~ step 'cheap': filter"]  # against the applied one
