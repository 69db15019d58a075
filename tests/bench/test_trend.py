"""bench/trend.py reads the result JSON of several runs and prints one row per run, in time order."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from rich.console import Console

spec = importlib.util.spec_from_file_location("trend", Path(__file__).resolve().parents[2] / "bench" / "trend.py")
assert spec is not None and spec.loader is not None
trend = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trend)


def throughput(when: str, eddyline: float, spark: float) -> dict:
    return {"workload": "tumbling", "when": when, "ratio": eddyline / spark,
            "engines": {"eddyline": {"rows_per_s": eddyline}, "spark-structured-streaming": {"rows_per_s": spark}}}


def test_runs_in_time_order_with_their_ratios(tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text(json.dumps(throughput("2026-11-22T10:00:00", 300_000, 250_000)))
    (tmp_path / "a.json").write_text(json.dumps(throughput("2026-11-21T10:00:00", 200_000, 250_000)))
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "idle.json").write_text(json.dumps({
        "benchmark": "idle_lull", "when": "2026-11-22T11:00:00",
        "modes": [{"keepalive": False, "summary": {"ratio": 3.5}}, {"keepalive": True, "summary": {"ratio": 1.1}}]}))
    (tmp_path / "junk.json").write_text("{not json")
    console = Console(record=True, width=200)
    trend.main(["--results", str(tmp_path)], console=console)
    text = console.export_text()
    first, second = text.index("2026-11-21T10:00"), text.index("2026-11-22T10:00")
    assert first < second
    assert "200,000" in text and "0.80" in text and "300,000" in text and "1.20" in text
    assert "3.50" in text and "1.10" in text
    only = Console(record=True, width=200)
    trend.main(["idle", "--results", str(tmp_path)], console=only)
    filtered = only.export_text()
    assert "tumbling" not in filtered and "3.50" in filtered
