"""Digest of what the Nexmark suite and the adaptive network write, to show a change kept outputs.

Every spec in ``examples/nexmark/`` runs with its Nexmark sources bounded to a fixed data set
(``limit``, unpaced, a fixed number of offsets per epoch) and its sinks redirected to a scratch
directory; the adaptive network of ``tests/runtime/e2e/test_adaptive.py`` runs with its control
plane relocating random key groups every epoch, rescaling 2 → 3 → 1 lanes and splitting hot join
key groups. Each sink's rows are read back with DuckDB, sorted, and hashed (rows, SHA-256 of the
sorted rows). Only the command line is used, so the same script measures any two versions::

    python bench/output_digest.py > after.txt
    git stash; python bench/output_digest.py > before.txt; git stash pop
    diff before.txt after.txt          # no output: every sink wrote the same rows

One ``eddyline run --until-idle`` process per network, ``local[2]``.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NEXMARK = ROOT / "examples" / "nexmark"


def bounded_nexmark(spec: dict, out: Path, events: int, per_epoch: int) -> dict:
    for src in spec["sources"]:
        if "nexmark" in src:
            src["nexmark"].update(rate=1_000, unpaced=True)
            src["limit"] = events
            src["max_rows_per_epoch"] = per_epoch
    spec["trigger"] = 0
    spec["lanes"] = 2
    for sink in spec["sinks"]:
        sink["files"] = {"path": str(out / sink["name"]), "format": "parquet"}
    return spec


def adaptive(out: Path) -> dict:
    """tests/runtime/e2e/test_adaptive.py's network with its CHURN control section."""
    bounded = {"rate": 500, "unpaced": True}
    rows = 4_500
    return {
        "name": "adaptive", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [
            {"name": "clicks", "generator": {**bounded, "keys": 200, "skew": 1.2, "seed": 5}, "limit": rows,
             "max_rows_per_epoch": 750},
            {"name": "auction", "nexmark": {"stream": "auction", **bounded, "hot_auction_ratio": 1}, "limit": rows,
             "max_rows_per_epoch": 750},
            {"name": "bid", "nexmark": {"stream": "bid", **bounded}, "limit": rows, "max_rows_per_epoch": 750},
        ],
        "steps": [
            {"name": "per_key", "input": "clicks", "window_aggregate": {
                "key": "key", "time": "event_time", "window": {"size": "2s"},
                "aggregates": {"n": "count(*)", "total": "sum(value)"}}},
            {"name": "first_seen", "input": "clicks", "dedup": {"key": "key", "time": "event_time", "ttl": "3s"}},
            {"name": "bids_in_auction", "join": {
                "left": "auction", "right": "bid", "left_key": "id", "right_key": "auction", "kind": "interval",
                "left_time": "date_time", "left_end": "expires", "right_time": "date_time"}},
            {"name": "pairs", "input": "bids_in_auction", "select": ["id", "bidder", "price", "date_time_right AS bid_time"]},
        ],
        "sinks": [
            {"name": "windows", "input": "per_key", "files": {"path": str(out / "windows")}},
            {"name": "firsts", "input": "first_seen", "files": {"path": str(out / "firsts")}},
            {"name": "pairs_out", "input": "pairs", "files": {"path": str(out / "pairs_out")}},
        ],
        "control": {
            "chaos": {"random_moves": 3, "seed": 11},
            "scale": {"schedule": {3: 3, 5: 1}, "auto": False, "max_lanes": 3},
            "spread": {"schedule": {2: [0, 5]}, "fanout": 3, "hot_share": 0.3},
        },
    }


def digest(directory: Path) -> tuple[int, str]:
    import duckdb

    files = sorted(directory.glob("epoch=*/*.parquet"))
    if not files:
        return 0, "-"
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT * FROM read_parquet('{directory}/epoch=*/*.parquet', hive_partitioning = false) ORDER BY ALL"
    ).fetchall()
    h = hashlib.sha256()
    for r in rows:
        h.update(repr(r).encode())
        h.update(b"\n")
    return len(rows), h.hexdigest()[:16]


def run(spec: dict, work: Path) -> None:
    path = work / "net.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(path), "--checkpoint", str(work / "ckpt"),
           "--until-idle", "--no-live", "--master", "local[2]"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{spec['name']}: exit {done.returncode}\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--per-epoch", type=int, default=6_000)
    ap.add_argument("--queries", default="", help="comma-separated subset, e.g. q0,q5,adaptive")
    args = ap.parse_args()
    wanted = set(filter(None, args.queries.split(",")))
    networks: list[tuple[str, dict, Path]] = []
    with tempfile.TemporaryDirectory(prefix="eddyline-digest-") as tmp:
        for spec_file in sorted(NEXMARK.glob("q*.yaml"), key=lambda p: int(p.stem[1:])):
            if wanted and spec_file.stem not in wanted:
                continue
            work = Path(tmp) / spec_file.stem
            spec = bounded_nexmark(yaml.safe_load(spec_file.read_text()), work / "out", args.events, args.per_epoch)
            networks.append((spec_file.stem, spec, work))
        if not wanted or "adaptive" in wanted:
            work = Path(tmp) / "adaptive"
            networks.append(("adaptive", adaptive(work / "out"), work))
        for name, spec, work in networks:
            work.mkdir(parents=True)
            run(spec, work)
            for sink in sorted(p for p in (work / "out").iterdir() if p.is_dir()):
                rows, sha = digest(sink)
                print(f"{name:10s} {sink.name:12s} {rows:8d} rows  {sha}", flush=True)


if __name__ == "__main__":
    main()
