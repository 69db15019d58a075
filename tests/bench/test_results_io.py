"""bench/results_io.py keeps a result's summary in git and its per-epoch detail beside it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


results_io = _load("results_io")
trend = _load("trend")


def adaptive(latencies: dict[str, list[float]]) -> dict:
    return {"benchmark": "adaptive", "when": "2026-11-28T10:00:00", "epochs_per_phase": 3, "rounds": 1,
            "runs": [{"system": system, "round": 0,
                      "epochs": [{"epoch": i, "latency_ms": ms, "routing": {"assignment": [0, 1, 1, 0]}}
                                 for i, ms in enumerate(values)]}
                     for system, values in latencies.items()]}


def test_the_summary_keeps_the_spread_and_the_detail_goes_beside(tmp_path: Path) -> None:
    full = adaptive({"adaptive": [float(x) for x in range(1, 201)], "static": [5.0, 900.0, 7.0]})
    path = results_io.write(tmp_path / "adaptive.json", full)
    kept = json.loads(path.read_text())
    assert "epochs" not in kept["runs"][0]
    spread = kept["runs"][0]["epochs_spread"]
    assert spread["count"] == 200
    assert spread["latency_ms"] == {"min": 1.0, "median": 100.5, "p99": 198.0, "max": 200.0}
    assert kept["runs"][1]["epochs_spread"]["latency_ms"]["max"] == 900.0
    assert results_io.read(path, detail=True) == full
    assert len(path.read_text()) < len(json.dumps(full)) / 3


def test_trend_reads_the_same_p99_from_a_summary_as_from_the_whole_run(tmp_path: Path) -> None:
    full = adaptive({"adaptive": [float(x % 37) for x in range(300)], "static": [float(x % 91) for x in range(300)]})
    (tmp_path / "whole").mkdir()
    (tmp_path / "whole" / "a.json").write_text(json.dumps(full))
    results_io.write(tmp_path / "summary" / "a.json", full)
    texts = []
    for folder in ("whole", "summary"):
        console = Console(record=True, width=200)
        trend.main(["adaptive", "--results", str(tmp_path / folder)], console=console)
        texts.append(console.export_text())
    table = texts[0].splitlines()[-2]
    assert " 36 " in table and " 89 " in table  # each system's p99, nearest rank
    assert texts[0] == texts[1]


def test_a_report_that_needs_the_detail_says_where_it_is(tmp_path: Path) -> None:
    path = results_io.write(tmp_path / "overload.json", {"runs": {"q": {"epochs": [{"rows": 1}]}}})
    results_io.detail_path(path).unlink()
    with pytest.raises(FileNotFoundError, match="overload.json holds the summary of its run"):
        results_io.read(path, detail=True)
    plain = tmp_path / "faults.json"
    plain.write_text(json.dumps({"cells": [1, 2]}))
    assert results_io.read(plain, detail=True) == {"cells": [1, 2]}
