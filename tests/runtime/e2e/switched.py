"""What the control tests' network writes per epoch when its price filter is switched at an epoch."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb


def per_epoch(out: Path) -> dict[int, list[int]]:
    rows = duckdb.connect().execute(
        f"SELECT CAST(regexp_extract(filename, 'epoch=(\\d+)', 1) AS INT) AS e, price "
        f"FROM read_parquet('{out}/rows/epoch=*/*.parquet', filename=true) ORDER BY ALL"
    ).fetchall()
    got: dict[int, list[int]] = {}
    for e, price in rows:
        got.setdefault(e, []).append(price)
    return got


def expected(src: Path, switch_at: int) -> dict[int, list[int]]:
    """File i is epoch i + 1: price >= 100 before ``switch_at``, price >= 500 from it on."""
    out = {}
    for i, f in enumerate(sorted(src.glob("*.json"))):
        cut = 500 if i + 1 >= switch_at else 100
        prices = sorted(json.loads(line)["price"] for line in f.read_text().splitlines())
        out[i + 1] = [p for p in prices if p >= cut]
    return out
