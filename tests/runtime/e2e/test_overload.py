"""Overload end to end: shedding under a declared cost model (so decisions do not depend on this
machine's speed), scaled estimates against the exact answer, replay after a crash, a burst.

Latency itself is a benchmark matter (bench/overload); here the cost model is declared, which
makes every shedding decision a function of the input alone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.observe.progress import ProgressReporter
from eddyline.runtime.engine import Engine

ROWS = 40_000


def network(out: Path, *, overload: bool, source: dict | None = None, per_row_ms: float = 0.1) -> dict:
    spec: dict = {
        "name": "overload", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [source or {"name": "clicks", "generator": {"rate": 4000, "keys": 20, "unpaced": True, "seed": 9},
                               "limit": ROWS, "max_rows_per_epoch": 8000}],
        "steps": [{"name": "per_key", "input": "clicks", "window_aggregate": {
            "key": "key", "time": "event_time", "window": {"size": "1s"},
            "aggregates": {"n": "count(*)", "total": "sum(value)", "hi": "max(value)"}}}],
        "sinks": [{"name": "out", "input": "per_key", "files": {"path": str(out)},
                   "qos": {"latency": "500ms", "utility": 1.0}}],
    }
    if overload:
        spec["control"] = {"overload": {
            "shedding": "lp", "seed": 3, "headroom": 0.8,
            "cost_model": {"fixed_ms": 0, "read_ms_per_row": 0, "step_ms_per_row": {"per_key": per_row_ms},
                           "on_miss": "report"},  # the test decides the costs, whatever the machine does
            "shed_sink": {"path": str(out.parent / f"{out.name}-shed")},
        }}
    return spec


def windows(out: Path) -> dict[tuple, tuple]:
    rows = duckdb.connect().execute(
        f"SELECT * FROM read_parquet('{out}/epoch=*/*.parquet', hive_partitioning = false)"
    ).fetchall()
    cols = [c[0] for c in duckdb.connect().execute(
        f"DESCRIBE SELECT * FROM read_parquet('{out}/epoch=*/*.parquet', hive_partitioning = false)").fetchall()]
    return {(r[cols.index("key")], r[cols.index("window_start")]): dict(zip(cols, r, strict=True)) for r in rows}


def shed_rows(path: Path) -> list[tuple]:
    return sorted(duckdb.connect().execute(
        f"SELECT * FROM read_parquet('{path}/epoch=*/*.parquet', hive_partitioning = false)").fetchall())


def test_shedding_scales_aggregates_within_their_reported_error(spark, tmp_path: Path) -> None:
    Engine(load_spec(network(tmp_path / "exact", overload=False)), spark, str(tmp_path / "ck-exact")).run(until_idle=True)
    runs: dict[str, list[dict]] = {"job": [], "resident": []}
    for execution, records in runs.items():  # (a Spark job an epoch, then resident lanes)

        class Keep(ProgressReporter):
            def report(self, record: dict, into: list[dict] = records) -> None:
                into.append(record)

        raw = network(tmp_path / ("shed" if execution == "job" else execution), overload=True)
        spec = load_spec({**raw, "execution": execution})
        engine = Engine(spec, spark, str(tmp_path / f"ck-{execution}"), reporter=Keep())  # type: ignore[arg-type]
        engine.run(until_idle=True)
        assert engine.executor.mode == execution
    records = runs["job"]

    # resident lanes shed the rows Spark sheds, observe the same counts and estimates, and give
    # the controller the same numbers: the same decisions, the same windows
    assert windows(tmp_path / "resident") == windows(tmp_path / "shed")
    assert shed_rows(tmp_path / "resident-shed") == shed_rows(tmp_path / "shed-shed")
    timed = ("hotSpots", "modelCheck")  # (what this machine's clock measured)
    seen = {e: [(r["batchId"], r["overload"]["shed"], r["overload"]["estimates"], r["overload"]["quality"],
                 [(d["action"], {k: v for k, v in d["why"].items() if k not in timed})
                  for d in r["decisions"] if d["kind"] == "overload"]) for r in rs] for e, rs in runs.items()}
    assert seen["resident"] == seen["job"]

    # 8000 rows at 0.1 ms each would take 800 ms; the budget is 0.8 x 500 ms: keep half
    shedding = [r for r in records if r.get("overload", {}).get("shed")]
    assert len(shedding) >= 3
    for r in shedding:
        s = r["overload"]["shed"]["per_key"]
        assert s["keep"] == [0.5]
        assert abs(s["kept"][0] / s["offered"][0] - 0.5) < 0.03  # deterministic hash sampling
        assert abs(r["overload"]["quality"]["out"]["shedFraction"] - 0.5) < 0.03
        why = next(d for d in r["decisions"] if d["kind"] == "overload")["why"]
        assert why["reason"] == "shedding (lp)" and why["status"] == "optimal"
    # the dropped rows went to the shed sink, nothing lost silently
    dropped = duckdb.connect().execute(
        f"SELECT count(*) FROM read_json('{tmp_path}/shed-shed/epoch=*/*.json', format='newline_delimited')"
    ).fetchone()[0] if list((tmp_path / "shed-shed").glob("epoch=*/*.json")) else duckdb.connect().execute(
        f"SELECT count(*) FROM read_parquet('{tmp_path}/shed-shed/epoch=*/*.parquet', hive_partitioning = false)"
    ).fetchone()[0]
    assert dropped == sum(r["overload"]["shed"]["per_key"]["offered"][0] - r["overload"]["shed"]["per_key"]["kept"][0]
                          for r in shedding)

    # the progress says how wide the estimates' intervals were, as the output rows do
    con = duckdb.connect()
    for r in records:
        part = tmp_path / "shed" / f"epoch={r['batchId']:010d}"
        reported = r["overload"]["estimates"]["per_key"]
        if not list(part.glob("*.parquet")):
            assert reported["windows"] == 0
            continue
        n, mean_n, max_n, mean_total = con.execute(
            f"SELECT count(*), avg(n_error / abs(n)), max(n_error / abs(n)), avg(total_error / nullif(abs(total), 0)) "
            f"FROM read_parquet('{part}/*.parquet', hive_partitioning = false)").fetchone()
        assert reported["windows"] == n
        for got, want in [(reported["aggregates"]["n"]["meanRelError"], mean_n),
                          (reported["aggregates"]["n"]["maxRelError"], max_n),
                          (reported["aggregates"]["total"]["meanRelError"], mean_total)]:
            assert (got is None and want is None) if n == 0 else abs(got - want) < 1e-4
    assert any(r["overload"]["estimates"]["per_key"]["aggregates"]["n"]["meanRelError"] for r in shedding)

    exact, est = windows(tmp_path / "exact"), windows(tmp_path / "shed")
    assert set(est) <= set(exact) and len(est) >= 0.95 * len(exact)
    inside = {"n": 0, "total": 0}
    for k, e in est.items():
        for agg in inside:
            inside[agg] += abs(e[agg] - exact[k][agg]) <= e[f"{agg}_error"] + 1e-9
    for agg, hits in inside.items():  # 95 % intervals: most windows' exact answer lies inside
        assert hits >= 0.88 * len(est), (agg, hits, len(est))
    assert sum(e["n_error"] for e in est.values()) > 0


@pytest.mark.slow
def test_crash_while_shedding_replays_the_same_drops(spark, tmp_path: Path) -> None:
    """The run killed in the lanes of its first shedding epoch as a Spark job is run on by resident
    lanes, which replay that epoch's plan: the drops, and the windows, are those of a run of Spark
    jobs alone."""
    Engine(load_spec(network(tmp_path / "ref", overload=True)), spark, str(tmp_path / "ck-ref")).run(until_idle=True)

    def run(execution: str, *extra: str) -> subprocess.CompletedProcess:
        spec_file = tmp_path / f"{execution}.yaml"
        spec_file.write_text(yaml.safe_dump({**network(tmp_path / "out", overload=True), "execution": execution}))
        cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec_file), "--checkpoint", str(tmp_path / "ck"),
               "--until-idle", "--no-live", "--master", "local[2]", "--progress-json", str(tmp_path / f"{execution}.jsonl"),
               *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=400)

    first = run("job", "--crash-at", "3:in_task")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    plan = json.loads((tmp_path / "ck" / "plans" / f"{3:010d}.json").read_text())
    assert plan["shed"]["per_key"]["keep"] == [0.5]
    last = run("resident")
    assert last.returncode == 0, last.stderr[-2000:]
    replayed = [json.loads(line) for line in (tmp_path / "resident.jsonl").read_text().splitlines()]
    assert replayed[0]["batchId"] == 3 and {r["execution"]["mode"] for r in replayed} == {"resident"}
    assert windows(tmp_path / "out") == windows(tmp_path / "ref")
    assert shed_rows(tmp_path / "out-shed") == shed_rows(tmp_path / "ref-shed")


def test_a_burst_is_shed_and_shedding_stops_after_it(spark, tmp_path: Path) -> None:
    """A paced source at 3000 rows/s with a 3x burst; the declared capacity is about twice the
    normal rate, so the burst (and only the burst) is shed."""
    rate = 3000
    phases = [{"duration": "4s"}, {"duration": "4s", "rate": 3 * rate}, {"duration": "6s"}]
    source = {"name": "clicks", "generator": {"rate": rate, "keys": 20, "seed": 9, "phases": phases},
              "limit": rate * 4 + 3 * rate * 4 + rate * 6}
    raw = network(tmp_path / "out", overload=True, source=source, per_row_ms=400 / (2 * rate * 1.0))
    raw["trigger"] = 1000
    records: list[dict] = []

    class Keep(ProgressReporter):
        def report(self, record: dict) -> None:
            records.append(record)

    Engine(load_spec(raw), spark, str(tmp_path / "ck"), reporter=Keep()).run(until_idle=True)  # type: ignore[arg-type]
    burst_end = rate * 4 + 3 * rate * 4
    shed = [r for r in records if r.get("overload", {}).get("shed")]
    assert shed, [r["sources"][0]["endOffset"] - r["sources"][0]["startOffset"] for r in records]
    assert all(r["overload"]["quality"]["out"]["shedFraction"] > 0 for r in shed)
    after = [i for i, r in enumerate(records) if r["sources"][0]["startOffset"] >= burst_end]
    assert after, "the run should go on after the burst"
    late_shedding = [records[i]["batchId"] for i in after[3:] if records[i].get("overload", {}).get("shed")]
    assert not late_shedding, late_shedding


def test_semantic_shedding_drops_the_least_valuable_rows(spark, tmp_path: Path) -> None:
    """With ``mode: semantic`` and ``utility: value``, a shed row never has a higher value than
    the epoch's cut, which comes from last epoch's quantiles of the value: three epochs as Spark
    jobs (Spark's approximate quantiles), the rest on resident lanes (their exact quantiles)."""
    raw = network(tmp_path / "out", overload=True)
    raw["control"]["overload"].update({"mode": "semantic", "utility": {"per_key": "value"}})
    modes = []
    for execution, epochs in (("job", 3), ("resident", None)):
        engine = Engine(load_spec({**raw, "execution": execution}), spark, str(tmp_path / "ck"))
        engine.run(epochs=epochs, until_idle=epochs is None)
        modes.append(engine.executor.mode)
    assert modes == ["job", "resident"]
    plans = [json.loads(p.read_text()) for p in sorted((tmp_path / "ck" / "plans").glob("*.json"))]
    cuts = {p["epoch"]: p["shed"]["per_key"]["thresholds"][0] for p in plans if p["shed"]}
    assert len(cuts) >= 3 and all(c is not None for c in cuts.values())
    con = duckdb.connect()
    for epoch, cut in cuts.items():
        lo, hi, n = con.execute(
            f"SELECT min(value), max(value), count(*) FROM read_parquet('{tmp_path}/out-shed/epoch={epoch:010d}/*.parquet')"
        ).fetchone()
        assert hi < cut, (epoch, hi, cut)  # only rows below the cut were shed
        assert 0.4 * 8000 <= n <= 0.6 * 8000, n  # about half, as planned (the cut is a quantile)
