"""The step kinds' registry as the rest of the engine sees it: every kind the package registers is
documented, answers the engine's questions through :class:`eddyline.kinds.base.StepKind`, and
only the kinds a user writes are offered in messages."""

from __future__ import annotations

import importlib
import re

import pytest

import eddyline.kinds
from eddyline.api.steps import STEPS
from eddyline.api.validate import spec_from_raw
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
