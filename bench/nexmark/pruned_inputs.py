"""How much of a Nexmark query's Eddyline time is moving columns it never uses?

Eddyline's stateful steps ship every column of their input through the lane shuffle into the
Python lanes and their state (Spark cannot prune through ``mapInArrow``); Spark's own operators
only see the columns the query needs. This runs chosen queries twice on ``run_nexmark.py``'s
data set: the spec as written, and the same spec with a ``select`` after each source that keeps
only the columns the query reads (what a projection pushdown would do). Same settings as
``run_nexmark.py``; ``--repeat`` alternating runs per variant, the fastest counts.

Usage (from outside the repository, see README.md): ``python bench/nexmark/pruned_inputs.py
--queries q3,q8,q9,q11``. Prints a table and writes ``bench/results/nexmark-pruned-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import run_nexmark as rn

#: Per query and source: the columns the query reads downstream (filters, keys, times, output).
NEEDED: dict[str, dict[str, list[str]]] = {
    "q3": {"auction": ["id", "seller", "category"], "person": ["id", "name", "city", "state"]},
    "q4": {
        "auction": ["id", "date_time", "expires", "category"],
        "bid": ["auction", "price", "date_time"],
    },
    "q6": {
        "auction": ["id", "date_time", "expires", "seller"],
        "bid": ["auction", "price", "date_time"],
    },
    "q8": {"person": ["id", "name", "date_time"], "auction": ["seller", "date_time"]},
    "q9": {
        "auction": [
            "id",
            "item_name",
            "description",
            "initial_bid",
            "reserve",
            "date_time",
            "expires",
            "seller",
            "category",
        ],
        "bid": ["auction", "bidder", "price", "date_time"],
    },
    "q11": {"bid": ["bidder", "date_time"]},
}


def pruned(raw: dict[str, Any], query: str) -> dict[str, Any]:
    """``raw`` with a select after each source; the steps read the selects instead."""
    raw = json.loads(json.dumps(raw))
    renames = {}
    selects = []
    for src in raw["sources"]:
        cols = NEEDED[query][Path(src["files"]["path"]).name]
        renames[src["name"]] = f"{src['name']}_cols"
        selects.append({"name": f"{src['name']}_cols", "input": src["name"], "select": cols})
    for step in raw["steps"]:
        if step.get("input") in renames:
            step["input"] = renames[step["input"]]
        j = step.get("join")
        if j:
            j["left"] = renames.get(j["left"], j["left"])
            j["right"] = renames.get(j["right"], j["right"])
    raw["steps"] = selects + raw["steps"]
    return raw


def streams(raw: dict[str, Any]) -> list[str]:
    return sorted({Path(src["files"]["path"]).name for src in raw["sources"]})


def run(spark: Any, raw: dict[str, Any]) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="nexmark-pruned-"))
    raw = json.loads(json.dumps(raw))
    for sink in raw["sinks"]:
        sink["files"]["path"] = str(tmp / "out" / sink["name"])
    try:
        return rn.run_eddyline(spark, raw, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", default="q3,q8,q9,q11")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=50)
    ap.add_argument("--files-per-epoch", type=int, default=5)
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--lanes", type=int, default=2)
    args = ap.parse_args()

    from eddyline.runtime.session import get_spark

    version = rn.code_version()
    if (Path(version["root"]) / "examples" / "nexmark").is_dir():
        rn.SPECS = Path(version["root"]) / "examples" / "nexmark"
    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": str(args.lanes)})
    if rn.worker_eddyline(spark) != {version["root"]}:
        raise SystemExit(
            "Spark's Python workers import another eddyline than the driver; see README.md"
        )
    data = (
        Path(tempfile.gettempdir()) / f"eddyline-nexmark-{args.events}-{args.files}-{args.rate:g}"
    )
    manifest = rn.generate(spark, data, args.events, args.files, args.rate)
    warm = rn.warm_copy(data, 2)
    out: dict[str, Any] = {}
    for q in args.queries.split(","):
        as_written = rn.eddyline_spec(q, data, args.files_per_epoch, args.lanes, Path("unused"))
        variants = {"as written": as_written, "pruned": pruned(as_written, q)}
        for raw in variants.values():  # warm-up on the first files
            w = json.loads(json.dumps(raw).replace(str(data), str(warm)))
            for src in w["sources"]:
                src["files"]["max_files_per_epoch"] = 1
            run(spark, w)
        events = sum(sum(manifest["rows"][s]) for s in streams(as_written))
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in variants}
        for rep in range(args.repeat):
            for name in list(variants) if rep % 2 == 0 else list(variants)[::-1]:
                runs[name].append(run(spark, variants[name]))
        out[q] = {"input_events": events}
        for name, rs in runs.items():
            best = min(rs, key=lambda r: r["wall_s"])
            best.pop("records", None)
            best["events_per_s"] = events / best["wall_s"]
            best["runs_wall_s"] = [round(r["wall_s"], 2) for r in rs]
            out[q][name] = best
        a, p = out[q]["as written"], out[q]["pruned"]
        print(
            f"{q}: as written {a['events_per_s']:,.0f} ev/s ({a['wall_s']:.1f} s) · pruned {p['events_per_s']:,.0f} ev/s "
            f"({p['wall_s']:.1f} s) · ×{p['events_per_s'] / a['events_per_s']:.2f}",
            flush=True,
        )
    when = datetime.now(UTC).isoformat()
    path = rn.RESULTS / f"nexmark-pruned-{when[:19].replace(':', '')}.json"
    path.write_text(
        json.dumps(
            {"benchmark": "nexmark-pruned", "when": when, "eddyline": version, "queries": out},
            indent=2,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"{(time.perf_counter() - t0) / 60:.1f} min")
