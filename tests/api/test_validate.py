"""Malformed specs are refused before anything runs, naming the node and the field path."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import eddyline
from eddyline.api.validate import load_spec
from eddyline.errors import SpecError
from eddyline.runtime.compile import analyze

GOOD = {
    "name": "hot",
    "sources": [
        {"name": "bids", "files": {"path": "in", "format": "json", "schema": "auction long, price long, ts timestamp"}}
    ],
    "steps": [
        {"name": "expensive", "input": "bids", "filter": "price > 100"},
        {
            "name": "per_auction",
            "input": "expensive",
            "window_aggregate": {
                "key": "auction",
                "time": "ts",
                "window": {"size": "10s", "slide": "2s"},
                "aggregates": {"bids": "count(*)", "top": "max(price)"},
                "watermark_delay": "4s",
            },
        },
    ],
    "sinks": [{"name": "out", "input": "per_auction", "files": {"path": "out"}}],
}


def mutate(path: str, value: object) -> dict:
    """Copy GOOD and set a dotted path (list indexes as numbers); value None deletes."""
    spec = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = spec
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is None:
        del node[int(last) if last.isdigit() else last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return spec


STRUCTURAL = [
    (mutate("steps.1.window_aggregate.window.size", "ten"),
     "step 'per_auction': window.size: expected a duration like '10s', got 'ten'"),
    (mutate("steps.1.window_aggregate.window.slide", "3s"),
     "step 'per_auction': window: slide: expected a slide that divides the size (10s), got 3s"),
    (mutate("steps.1.window_aggregate.aggregates", {"p": "median(price)"}),
     "step 'per_auction': aggregates.p: expected one of count(*)"),
    (mutate("steps.1.window_aggregate.colour", "red"),
     "step 'per_auction': colour: unknown field; expected one of aggregates, allowed_lateness"),
    (mutate("steps.0.input", "bidz"),
     "step 'expensive': input: unknown input 'bidz'; expected one of bids, expensive, per_auction"),
    (mutate("steps.0.filter", "price >"),
     "step 'expensive': filter: invalid SQL expression 'price >': GT is missing its right-hand operand"),
    (mutate("sinks.0.input", "nowhere"), "sink 'out': input: unknown input 'nowhere'"),
    (mutate("steps.0.input", "per_auction"), "step 'expensive': input: part of a cycle"),
    (mutate("sources.0.files", {"path": "in", "format": "json"}),
     "source 'bids': files.schema: a json source needs a schema"),
    (mutate("sources.0.files", {"path": "in", "format": "json", "schema": "a long", "header": True}),
     "source 'bids': files.header: only CSV files have a header line, not json"),
    (mutate("sources.0.files", {"path": "in", "format": "parquet", "retract": "revisions"}),
     "source 'bids': files.retract: only a sink takes epochs back"),
    (mutate("sinks.0.files", {"path": "out", "format": "json", "retract": "revisions"}),
     "sink 'out': files.retract: revisions are written as Parquet; set format: parquet (not json)"),
    (mutate("sinks.0.files", {"path": "out", "retract": "negate"}),
     "sink 'out': retract: Input should be 'move' or 'revisions', got 'negate'"),
    (mutate("steps.1.window_aggregate.watermark_delay", "-4s"),
     "step 'per_auction': watermark_delay: expected a duration like '10s', got '-4s'"),
    (mutate("steps.1.name", "expensive"), "step 'expensive': name: already used by a step"),
    (mutate("steps.0.select", ["price"]), "step 'expensive': a step has exactly one kind; this one has filter and select"),
    (mutate("key_groups", 0), "network: key_groups: Input should be greater than 0, got 0"),
    (mutate("sinks.0.input", "expensive"), "step 'per_auction': its output reaches no sink"),
]


@pytest.mark.parametrize(("raw", "expected"), STRUCTURAL, ids=[e[:40] for _, e in STRUCTURAL])
def test_structural_errors_name_node_and_field(raw: dict, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def renamed(path: str, old: str, new: str) -> dict:
    spec = copy.deepcopy(GOOD)
    node = spec
    for p in path.split("."):
        node = node[int(p)] if p.isdigit() else node[p]
    node[new] = node.pop(old)
    return spec


def test_a_misspelt_or_unknown_kind_is_named_once_with_the_closest_one() -> None:
    with pytest.raises(SpecError) as info:
        load_spec(renamed("steps.1", "window_aggregate", "windw_aggregate"))
    assert info.value.problems == ["step 'per_auction': unknown field 'windw_aggregate' — did you mean 'window_aggregate'?"]
    with pytest.raises(SpecError) as info:
        load_spec(renamed("steps.1", "window_aggregate", "tumble"))
    [problem] = info.value.problems
    assert problem.startswith("step 'per_auction': unknown field 'tumble'; expected one step kind: aggregate, dedup")
    assert "combine" not in problem  # what a rewrite rule writes is not offered
    # a bad field of a source: one line, not a second about the list it was left out of
    with pytest.raises(SpecError) as info:
        load_spec(mutate("sources.0.files", {**GOOD["sources"][0]["files"], "bogus": 1}))
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith("source 'bids': bogus: unknown field")
    # a misspelt field: named with the one it was meant to be, and not also "path: field required"
    with pytest.raises(SpecError) as info:
        load_spec(renamed("sources.0.files", "path", "pth"))
    assert info.value.problems == ["source 'bids': pth: unknown field — did you mean 'path'?"]
    with pytest.raises(SpecError) as info:
        load_spec(renamed("steps.1.window_aggregate", "aggregates", "aggregate"))
    assert info.value.problems == ["step 'per_auction': aggregate: unknown field — did you mean 'aggregates'?"]


def test_good_spec_loads_and_yaml_equals_python() -> None:
    spec = load_spec(copy.deepcopy(GOOD))
    net = eddyline.Network("hot")
    bids = net.source("bids", eddyline.Files("in", format="json", schema="auction long, price long, ts timestamp"))
    (
        bids.filter("price > 100", name="expensive")
        .window_aggregate(
            key="auction", time="ts", window=eddyline.sliding("10s", "2s"),
            aggregates={"bids": "count(*)", "top": "max(price)"}, watermark_delay="4s", name="per_auction",
        )
        .to(eddyline.Files("out"), name="out")
    )
    assert net.spec == spec
    again = load_spec(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)))
    assert again == spec


def test_builder_refuses_duplicate_names_at_once() -> None:
    net = eddyline.Network("n")
    net.source("bids", eddyline.Generator())
    with pytest.raises(SpecError, match="source 'bids': name: already used"):
        net.source("bids", eddyline.Generator())


SEMANTIC = [
    (mutate("steps.0.filter", "price + 1"), "step 'expensive': filter:"),
    (mutate("steps.0.filter", "prize > 100"), "step 'expensive': filter:"),
    (mutate("steps.1.window_aggregate.time", "price"),
     "step 'per_auction': time: expected a timestamp column, 'price' is bigint"),
    (mutate("steps.1.window_aggregate.aggregates", {"s": "sum(ts)"}),
     "step 'per_auction': aggregates.s: sum() expects a numeric column, 'ts' is timestamp"),
    (mutate("steps.1.window_aggregate.key", "bidder"), "step 'per_auction': key: unknown column 'bidder'"),
]


@pytest.mark.parametrize(("raw", "expected"), SEMANTIC, ids=[e[:40] for _, e in SEMANTIC])
def test_type_errors_found_by_spark_analysis(spark, tmp_path: Path, raw: dict, expected: str) -> None:
    raw = copy.deepcopy(raw)
    raw["sources"][0]["files"]["path"] = str(tmp_path)
    spec = load_spec(raw)  # structurally fine
    with pytest.raises(SpecError) as info:
        analyze(spec, spark)
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_cli_exit_code_2_and_message(tmp_path: Path) -> None:
    bad = tmp_path / "net.yaml"
    bad.write_text(yaml.safe_dump(mutate("steps.1.window_aggregate.window.size", "ten")))
    proc = subprocess.run(
        [sys.executable, "-m", "eddyline.cli", "validate", str(bad), "--offline"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "step 'per_auction': window.size: expected a duration like '10s', got 'ten'" in proc.stderr
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(GOOD))
    missing = subprocess.run(  # its input directory, 'in', is not there: said before Spark starts
        [sys.executable, "-m", "eddyline.cli", "validate", str(good), "--offline"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert missing.returncode == 2
    assert f"source 'bids': files.path: 'in' does not exist (a relative path is read from {tmp_path})" in missing.stderr
    (tmp_path / "in").mkdir()
    ok = subprocess.run(
        [sys.executable, "-m", "eddyline.cli", "validate", str(good), "--offline"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    assert "ok: network 'hot'" in ok.stdout


def test_a_yaml_error_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "net.yaml"
    bad.write_text("name: t\nsources: [\n  - x\n")
    with pytest.raises(SpecError, match=rf'(?s)network: not valid YAML: .*in "{bad}", line \d+'):
        load_spec(bad)
