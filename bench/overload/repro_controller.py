"""Reproducers for the overload controller problems found by run_overload.py (no Spark needed).

    python bench/overload/repro_controller.py

Found with the engine before commit 7b5a696 and fixed there (kept as checks):

* ``shedding: uniform`` never shed: ``lp.uniform_plan`` keys its keep fraction by the LP's source
  arcs (``rows->win#0``) while ``OverloadController.plan`` read the shed points (``win#0->win``),
  so every keep was 1.0 although the decision said "shedding (uniform)" (case 1, uniform line:
  now keep 0.64 on both steps).
* The LP valued a query per *output row*; a window emits about one row per key and window
  whatever it keeps, so the LP shed the utility-1 window query to ``min_keep`` before the
  utility-0.3 dedup (case 1, LP line: now it sheds the dedup only).

Still present at 7b5a696:

* case 1': the per-row step cost is fitted as ``(makespan - smallest makespan) / rows``, so the
  row-proportional lane time of the smallest epoch of the history counts as fixed cost. From a
  noise-free history of 300-600k-row epochs (true: F = 2 s, dedup 4 us/row, 5 us/row in all) it
  fits F = 3.06 s and dedup 1.3 us/row, and predicts 1.2M rows at 6.2 s ("fits the bound") while
  they take 8 s: the model under-predicts epochs larger than those it has seen.
* case 2: an epoch with a handful of rows in a short history makes its per-row costs explode
  (median of two = mean): F = 0, a = 345 ms/row, win 6.8 ms/row, keep 0.02 everywhere. The engine
  now leaves the first epoch of a process out of the fit, which was where this happened in the
  benchmark (F = -1,747,791 ms, a = 58,605 ms/row before the fix); the fit itself has no guard.
"""

from __future__ import annotations

from eddyline.api.validate import load_spec
from eddyline.control.overload import EpochCost, OverloadController


def spec(mode: str) -> object:
    overload: dict = {"shedding": mode, "probe_rows": 128_000}
    return load_spec({
        "name": "repro", "trigger": "1s", "lanes": 2, "key_groups": 64,
        "sources": [{"name": "src", "generator": {"rate": 20000, "keys": 2000}}],
        "steps": [
            {"name": "win", "input": "src", "window_aggregate": {
                "key": "key", "time": "event_time", "window": {"size": "2s"},
                "aggregates": {"n": "count(*)", "total": "sum(value)"}}},
            {"name": "dedup", "input": "src", "dedup": {"key": ["key", "value"], "time": "event_time", "ttl": "4s"}},
        ],
        "sinks": [
            {"name": "q1", "input": "win", "memory": {}, "qos": {"latency": "8s", "utility": 1.0}},
            {"name": "q2", "input": "dedup", "memory": {}, "qos": {"latency": "8s", "utility": 0.3}},
        ],
        "control": {"overload": overload},
    })


def cost(epoch: int, ms: float, rows: int, span_win: float, span_dedup: float) -> EpochCost:
    return EpochCost(
        epoch, ms, {"src": rows}, {"win": [rows], "dedup": [rows]}, {"win": [rows], "dedup": [rows]},
        {"win": span_win, "dedup": span_dedup}, {"win": 2 * span_win, "dedup": 2 * span_dedup},
        {"win": 2, "dedup": 2}, {"win": rows // 50, "dedup": int(rows * 0.95)},
        {"q1": rows // 50, "q2": int(rows * 0.95)}, ms / 1000,
    )


def show(title: str, c: OverloadController, available: int) -> None:
    v = c.plan(99, {"src": available})
    why = v.explain
    print(f"-- {title}")
    print(f"   reason={why.get('reason')!r} keep={why.get('keep')} predictedMs={why.get('predictedMs')} "
          f"takeRows={why.get('takeRows')} expectedUtility={why.get('expectedUtility')}")
    if "model" in why:
        m = why["model"]
        print(f"   model F={m['F']} a={m['a']} cost={m['cost']}")
    print(f"   applied shed (what the engine does): {({s: x['keep'] for s, x in v['shed'].items()}) or 'nothing'}")


def main() -> None:
    # True costs used to make the histories: F = 2000 ms, reading 0.5 us/row, lanes: win 0.5 us/row,
    # dedup 4 us/row (5 us/row in all). Budget = 0.8 x 8 s = 6.4 s.
    def epoch(e: int, rows: int, noise: float = 0.0) -> EpochCost:
        return cost(e, 2000 + noise + rows * 0.005, rows, 20 + rows * 0.0005, 50 + rows * 0.004)

    # 1. uniform: the same history and 1.6M rows waiting (true duration 10 s), LP vs uniform
    for mode in ("lp", "uniform"):
        c = OverloadController(spec(mode))
        for e, rows in enumerate((300_000, 500_000, 400_000, 800_000), 1):
            c.observe(epoch(e, rows))
        show(f"1. shedding: {mode}, 1.6M rows waiting (true duration 10.0 s > 6.4 s budget)", c, 1_600_000)

    # 1'. the cost fit's bias, without any noise: the per-row step cost is (makespan - smallest
    # makespan) / rows, so the smallest epoch's row-proportional lane time is counted as fixed
    c = OverloadController(spec("lp"))
    for e, rows in enumerate((300_000, 500_000, 400_000, 600_000), 1):
        c.observe(epoch(e, rows))
    show("1'. noise-free history of 300-600k-row epochs, 1.2M rows waiting (true 8.0 s > 6.4 s budget)", c, 1_200_000)

    # 2. cold start: a 15-row first epoch of 10.6 s (cold workers), then a 128k-row epoch of 7.7 s
    c = OverloadController(spec("lp"))
    c.observe(cost(1, 10_559, 15, 250.0, 260.0))
    c.observe(cost(2, 7_684, 128_000, 45.0, 800.0))
    show("2. cold start (two epochs of history), 477k rows waiting", c, 477_019)


if __name__ == "__main__":
    main()
