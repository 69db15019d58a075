"""The step kinds' registry as the rest of the engine sees it: every kind the package registers is
documented, answers the engine's questions through :class:`eddyline.kinds.base.StepKind`, and
only the kinds a user writes are offered in messages."""

from __future__ import annotations

import importlib
import re

import pytest

import eddyline.kinds
from eddyline.api.steps import STEPS
from eddyline.api.validate import load_spec, spec_from_raw
from eddyline.errors import SpecError
from eddyline.kinds.base import StepKind


def documented() -> dict[str, str]:
    """kind → module, from the table in the kinds package's docstring."""
    doc = eddyline.kinds.__doc__ or ""
    return dict(re.findall(r"^\| ``(\w+)``\s*\| (\w+)\s*\|", doc, re.M))


def test_every_registered_step_kind_is_documented_with_its_module() -> None:
    table = documented()
    assert set(table) == set(STEPS.keys())
    for key, module in table.items():
        kind = STEPS.get(key)
        assert type(kind).__module__ == f"eddyline.kinds.{module}", key
        assert importlib.import_module(f"eddyline.kinds.{module}")


@pytest.mark.parametrize("key", sorted(STEPS.keys()))
def test_each_kind_compiles_and_a_stateful_one_has_a_kernel(key: str) -> None:
    kind = STEPS.get(key)
    assert isinstance(kind, StepKind)
    assert callable(getattr(kind, "compile", None))
    if kind.stateful:
        assert type(kind).kernel is not StepKind.kernel, f"{key} keeps state but makes no kernel"


#: one step of each kind a user writes, over nexmark's bids (a kind added to the registry brings one)
EXAMPLES: dict[str, dict] = {
    "filter": {"input": "bids", "filter": "price > 1"},
    "select": {"input": "bids", "select": ["*", "price * 2 AS twice"]},
    "union": {"union": ["bids", "bids"]},
    "udf": {"input": "bids", "udf": {"function": "eddyline.examples.udfs:to_euro", "schema": "auction long, price long"}},
    "lookup": {"input": "bids", "lookup": {"table": {"path": "auctions"}, "key": "auction", "table_key": "id"}},
    "window_aggregate": {"input": "bids", "window_aggregate": {
        "key": "auction", "time": "date_time", "window": {"size": "10s"}, "aggregates": {"n": "count(*)"}}},
    "session_window": {"input": "bids", "session_window": {
        "key": ["bidder", "auction"], "time": "date_time", "gap": "10s", "aggregates": {"n": "count(*)"}}},
    "aggregate": {"input": "bids", "aggregate": {"key": "bidder", "aggregates": {"top": "max(price)"}}},
    "over_aggregate": {"input": "bids", "over_aggregate": {
        "key": "auction", "time": "date_time", "preceding": 3, "aggregates": {"avg3": "avg(price)"}}},
    "top_k": {"input": "bids", "top_k": {"partition_by": "auction", "order_by": ["price DESC"], "k": 2, "time": "date_time"}},
    "dedup": {"input": "bids", "dedup": {"key": "bidder", "time": "date_time", "ttl": "1m"}},
    "join": {"join": {"left": "bids", "right": "bids", "left_key": "auction", "right_key": "auction"}},
    "pattern": {"input": "bids", "pattern": {"key": "auction", "time": "date_time", "within": "30s",
                                             "factory": "eddyline.operators.pattern:tick_pattern",
                                             "args": {"value_col": "price"}}},
}


def test_every_offered_kind_has_an_example() -> None:
    kinds = STEPS.keys()
    assert set(EXAMPLES) == {k for k in kinds if STEPS.get(k).offered}


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_each_offered_kind_validates_its_example_and_explains_it_with_its_shuffle_if_stateful(
        key: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # (paths in a spec are relative to the working directory)
    (tmp_path / "auctions").mkdir()
    raw = {"name": "n", "sources": [{"name": "bids", "nexmark": {"stream": "bid"}}],
           "steps": [{"name": "s", **EXAMPLES[key]}], "sinks": [{"name": "out", "input": "s", "console": {}}]}
    (step,) = load_spec(raw).steps
    kind = STEPS.get(key)
    assert step.kind == key and step.info is kind
    lines = kind.describe(step, 16)
    assert lines[0].startswith(key), lines
    assert any("repartition(lanes" in line for line in lines) == kind.stateful, lines


def test_an_unknown_kind_names_the_closest_offered_one_and_never_an_internal_kind() -> None:
    raw = {"name": "n", "sources": [{"name": "s", "generator": {}}],
           "steps": [{"name": "last", "input": "s", "windw_aggregate": {}}],
           "sinks": [{"name": "out", "input": "last", "console": {}}]}
    with pytest.raises(SpecError) as named:
        spec_from_raw(raw)
    assert named.value.problems == ["step 'last': unknown field 'windw_aggregate' — did you mean 'window_aggregate'?"]
    raw["steps"][0] = {"name": "last", "input": "s", "xyz": {}}
    with pytest.raises(SpecError) as listed:
        spec_from_raw(raw)
    (problem,) = listed.value.problems
    offered = problem.split("expected one step kind: ")[1].split(", ")
    kinds = STEPS.keys()
    assert set(offered) == {k for k in kinds if STEPS.get(k).offered}
    assert "combine" in kinds and "combine" not in offered
