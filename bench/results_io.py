"""Result files: a summary in git, each run's per-epoch detail beside it, compressed.

A benchmark's result file under ``bench/results/`` is what a reader and ``bench/trend.py`` use: the
settings, the tables, the spread of runs. The per-epoch arrays a run also records (``epochs``, the
progress ``records``) are what make these files large, and only a report that draws
a run's timeline needs them. So :func:`write` puts the summary in ``<name>.json`` — each per-epoch
list replaced by its spread (``<key>_spread``: count, and min / median / p99 / max of every number
in it) — and the whole result, compressed, in ``detail/<name>.json.gz``. Git keeps the detail only
of the current named results whose report draws timelines (``adaptive*``, ``overload``; see
``.gitignore``); the dated history keeps its detail on the machine that ran it.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DETAIL_KEYS = frozenset({"epochs", "records"})


def p99(values: list[float]) -> float:
    """The nearest-rank 99th percentile (the one ``trend.py`` has always printed)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def _spread_of(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "p99": p99(values), "max": max(values)}


def spread(items: list[Any]) -> dict[str, Any]:
    """Count, and the spread of each number in a list of numbers or of flat records."""
    out: dict[str, Any] = {"count": len(items)}
    numbers = [x for x in items if isinstance(x, int | float) and not isinstance(x, bool)]
    if numbers:
        out.update(_spread_of(numbers))
        return out
    fields: dict[str, list[float]] = {}
    for item in items:
        if isinstance(item, dict):
            for k, v in item.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    fields.setdefault(k, []).append(v)
    out.update({k: _spread_of(v) for k, v in fields.items()})
    return out


def summary(result: Any) -> Any:
    """The result with every per-epoch list replaced by its spread."""
    if isinstance(result, dict):
        out: dict[str, Any] = {}
        for k, v in result.items():
            if k in DETAIL_KEYS and isinstance(v, list):
                out[f"{k}_spread"] = spread(v)
            else:
                out[k] = summary(v)
        return out
    if isinstance(result, list):
        return [summary(v) for v in result]
    return result


def _stripped(data: Any) -> bool:
    if isinstance(data, dict):
        return any(f"{k}_spread" in data for k in DETAIL_KEYS) or any(_stripped(v) for v in data.values())
    if isinstance(data, list):
        return any(_stripped(v) for v in data)
    return False


def detail_path(path: Path) -> Path:
    return path.parent / "detail" / f"{path.stem}.json.gz"


def dumps(result: Any, default: Any = None) -> str:
    """One line per top-level key: a summary stays small and a diff of two runs still reads by key."""
    if not isinstance(result, dict) or not result:
        return json.dumps(result, default=default) + "\n"
    lines = (f"{json.dumps(k)}: {json.dumps(v, default=default)}" for k, v in result.items())
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write(path: Path, result: Any, *, default: Any = None) -> Path:
    """Write the summary to ``path`` and, when the result has per-epoch lists, the whole of it beside."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    short = summary(result)
    path.write_text(dumps(short, default))
    if short != result:
        full = detail_path(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(full, "wt") as f:
            json.dump(result, f, default=default)
    return path


def read(path: Path, *, detail: bool = False) -> Any:
    """A result file; with ``detail``, the whole result (an error naming the file when it is not here)."""
    path = Path(path)
    if not detail:
        return json.loads(path.read_text())
    full = detail_path(path)
    if full.exists():
        with gzip.open(full, "rt") as f:
            return json.load(f)
    data = json.loads(path.read_text())
    if not _stripped(data):
        return data  # nothing was left out of this one
    raise FileNotFoundError(
        f"{path.name} holds the summary of its run; the per-epoch detail this report draws from "
        f"({full}) stays on the machine that ran it — run the benchmark again to draw it"
    )
