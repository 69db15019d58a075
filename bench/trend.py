"""Print how the benchmarks moved over time, from the summary every run leaves in bench/results/.

    python bench/trend.py                 # every benchmark
    python bench/trend.py nexmark         # only those whose name starts with "nexmark"

One table per benchmark (throughput per workload, Nexmark, adaptive, overload, idle lull), one
row per run in time order, with the ratio against the peer measured in the same run where the
benchmark has one. Runs on a shared 2-core machine spread by about ±10 %: read a trend from
several runs, not from the last two.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"

Row = tuple[str, ...]


def _commit(r: dict[str, Any]) -> str:
    e = r.get("eddyline")
    return (e.get("commit") or "")[:7] if isinstance(e, dict) else ""


def _throughput(r: dict[str, Any]) -> Row:
    e, n = r["engines"]["eddyline"], r["engines"]["spark-structured-streaming"]
    return (f"{e['rows_per_s']:,.0f}", f"{n['rows_per_s']:,.0f}", f"{r['ratio']:.2f}")


def _nexmark(r: dict[str, Any]) -> Row:
    ratios = {q: v.get("ratio") for q, v in r["queries"].items()}
    return tuple(f"{ratios[q]:.2f}" if isinstance(ratios.get(q), int | float) else "–" for q in NEXMARK_QUERIES)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def _adaptive(r: dict[str, Any]) -> Row:
    """Median over rounds of each system's p99 epoch latency (all phases)."""
    per: dict[str, list[float]] = {}
    for run in r.get("runs", []):
        latencies = [e["latency_ms"] for e in run.get("epochs", []) if "latency_ms" in e]
        if latencies:
            per.setdefault(run["system"], []).append(_p99(latencies))
        elif "p99" in run.get("epochs_spread", {}).get("latency_ms", {}):  # a summary (bench/results_io.py)
            per.setdefault(run["system"], []).append(run["epochs_spread"]["latency_ms"]["p99"])
    med = {k: statistics.median(v) for k, v in per.items()}
    a, s = med.get("adaptive"), med.get("static")
    return (
        str(r.get("epochs_per_phase", "")),
        str(r.get("rounds", "")),
        f"{a:,.0f}" if a else "–",
        f"{s:,.0f}" if s else "–",
        f"{a / s:.2f}" if a and s else "–",
    )


def _idle(r: dict[str, Any]) -> Row:
    by = {bool(m["keepalive"]): m["summary"]["ratio"] for m in r.get("modes", [])}
    return tuple(f"{by[k]:.2f}" if k in by else "–" for k in (False, True))


NEXMARK_QUERIES = ("q0", "q1", "q2", "q3", "q5", "q7", "q8", "q9", "q11")

#: benchmark -> (how to recognise its JSON, column names, one row from a result)
KINDS: dict[str, tuple[Callable[[dict[str, Any]], bool], Row, Callable[[dict[str, Any]], Row]]] = {
    "throughput": (lambda r: "engines" in r and "workload" in r,
                   ("Eddyline rows/s", "Spark SS rows/s", "ratio"), _throughput),
    "nexmark": (lambda r: r.get("benchmark") == "nexmark" and "queries" in r,  # ratio per query
                NEXMARK_QUERIES, _nexmark),
    "adaptive": (lambda r: r.get("benchmark") == "adaptive",
                 ("epochs/phase", "rounds", "p99 ms adaptive", "p99 ms static", "adaptive/static"), _adaptive),
    "idle_lull": (lambda r: r.get("benchmark") == "idle_lull",
                  ("1st after lull / before, keep-alive off", "on"), _idle),
}


def load(paths: Iterable[Path]) -> list[tuple[str, str, dict[str, Any]]]:
    """(benchmark, workload, result) per readable JSON, in time order; others are skipped."""
    out = []
    for path in paths:
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(r, dict) or "when" not in r:
            continue
        for name, (match, _, _) in KINDS.items():
            if match(r):
                workload = r.get("workload") or (r.get("args") or {}).get("query") or ""
                out.append((name, workload, r))
                break
    return sorted(out, key=lambda x: x[2]["when"])


def tables(results: list[tuple[str, str, dict[str, Any]]], prefix: str = "") -> list[Table]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for name, workload, r in results:
        if name.startswith(prefix) or workload.startswith(prefix):
            groups.setdefault((name, workload), []).append(r)
    out = []
    for (name, workload), runs in groups.items():
        columns, row = KINDS[name][1], KINDS[name][2]
        t = Table(title=f"{name}{' · ' + workload if workload else ''}")
        for c in ("run", "commit", *columns):
            t.add_column(c, justify="left" if c in ("run", "commit") else "right", no_wrap=True)
        for r in runs:
            try:
                cells = row(r)
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                cells = ("?",) * len(columns)  # an older shape of this benchmark's JSON
            t.add_row(r["when"][:16], _commit(r), *cells)
        out.append(t)
    return out


def main(argv: list[str] | None = None, console: Console | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix", nargs="?", default="", help="only benchmarks or workloads starting with this")
    ap.add_argument("--results", default=str(RESULTS), help="the folder of result JSON files")
    args = ap.parse_args(argv)
    # wide tables rather than cut numbers: a narrow terminal scrolls
    console = console or Console(width=max(Console().width, 150))
    for t in tables(load(sorted(Path(args.results).rglob("*.json"))), args.prefix):
        console.print(t)


if __name__ == "__main__":
    main()
