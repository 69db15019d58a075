"""A prototype of lane state updated in place, against today's kernel (issue #55, item 5's finding).

A resident lane's state is an Arrow table that a pure kernel takes and returns whole, so every
epoch costs at least a probe and a copy of the whole state (``bench/state_growth.py``: behind
PyFlink at ten million keys). This prototype keeps a dedup's state the way Flink's heap state
backend keeps it, in place: the remembered keys in a sorted array with their first and last event
times beside them, new keys in a small sorted delta that is merged into the main arrays once it
holds a sixteenth of them (so each key is copied O(log) times over its life, not once an epoch),
and expiry skipped while the watermark has not reached the oldest remembered time plus the TTL (a
lower bound kept as keys are added). Per epoch: one sort of the batch and two binary searches
per distinct batch key; the output rows and the changed state rows (the store's upserts: a key's
interval widens only with rows that pass) are the same as today's kernel's.

It is a prototype: int64 keys, the dedup only, no expiry scan, not wired to the lanes. It is
checked against :class:`~eddyline.operators.dedup.DedupKernel` on every epoch it runs (the same
rows out, the same upserts) and timed beside it on the same batches.

Usage: ``python bench/state_inplace.py [--keys 100000,1000000,5000000] [--rows 8000] [--epochs 20]``
(a lane's share: ``bench/state_growth.py``'s ten million keys are five million a lane). Writes
``bench/results/state-inplace-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import results_io  # noqa: E402

from eddyline.columns import KG  # noqa: E402
from eddyline.hashing import spark_xxhash64  # noqa: E402
from eddyline.operators.dedup import DedupKernel  # noqa: E402

SCHEMA = pa.schema([("key", pa.int64()), ("event_time", pa.timestamp("ms")), ("value", pa.int64())])
TTL_MS = 86_400_000
KEY_GROUPS = 128


class InPlaceDedup:
    """The first row per key, the state kept in place (module docstring)."""

    def __init__(self, ttl_ms: int):
        self.ttl_ms = ttl_ms
        self.keys = np.zeros(0, np.int64)
        self.first = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.int64)
        self.d_keys, self.d_first, self.d_last = self.keys.copy(), self.first.copy(), self.last.copy()
        self.oldest = np.iinfo(np.int64).max  # a lower bound of every remembered last time

    def __len__(self) -> int:
        return self.keys.size + self.d_keys.size

    def process(self, keys: np.ndarray, times: np.ndarray, watermark_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """``(indexes of the batch rows that pass, the changed keys)``."""
        live = np.flatnonzero(times >= watermark_ms)
        if watermark_ms > self.oldest + self.ttl_ms:
            raise NotImplementedError("expiry: the prototype keeps every key (a day's TTL)")
        order = live[np.lexsort((times[live], keys[live]))]
        k, t = keys[order], times[order]
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if k.size else np.zeros(0, np.int64)
        uk, t_first = k[starts], t[starts]
        t_last = np.maximum.reduceat(t, starts) if k.size else t_first
        found_main, at_main = _find(self.keys, uk)
        found_delta, at_delta = _find(self.d_keys, uk)
        seen = found_main | found_delta
        # a remembered key's rows pass (and widen its interval, in place) only past its last
        # time plus the TTL, which a day's TTL over this data never reaches
        last = np.full(uk.size, np.iinfo(np.int64).max - self.ttl_ms)
        last[found_main] = self.last[at_main[found_main]]
        last[found_delta] = self.d_last[at_delta[found_delta]]
        if np.any(seen & (t_last > last + self.ttl_ms)):
            raise NotImplementedError("a remembered key seen again past its TTL: not in the prototype")
        new = ~seen
        self._add(uk[new], t_first[new], t_last[new])
        return order[starts[new]], uk[new]

    def _add(self, keys: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        if not keys.size:
            return
        self.oldest = min(self.oldest, int(last.min()))
        at = np.searchsorted(self.d_keys, keys)  # (keys sorted and new: the delta stays sorted)
        self.d_keys, self.d_first, self.d_last = (np.insert(a, at, v) for a, v in
                                                  ((self.d_keys, keys), (self.d_first, first), (self.d_last, last)))
        if self.d_keys.size * 16 > self.keys.size:
            at = np.searchsorted(self.keys, self.d_keys)
            self.keys, self.first, self.last = (np.insert(a, at, v) for a, v in
                                                ((self.keys, self.d_keys), (self.first, self.d_first),
                                                 (self.last, self.d_last)))
            self.d_keys, self.d_first, self.d_last = (a[:0] for a in (self.d_keys, self.d_first, self.d_last))


def _find(sorted_keys: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    at = np.searchsorted(sorted_keys, probe)
    inside = at < sorted_keys.size
    found = np.zeros(probe.size, bool)
    found[inside] = sorted_keys[at[inside]] == probe[inside]
    return found, np.where(found, at, 0)


def batch(keys: np.ndarray, t_ms: np.ndarray) -> pa.Table:
    table = pa.table({"key": keys, "event_time": pa.array(t_ms, pa.timestamp("ms")),
                      "value": np.zeros(keys.size, np.int64)}, schema=SCHEMA)
    return table.append_column(KG, pa.array(np.mod(spark_xxhash64(table.column("key")), KEY_GROUPS).astype(np.int32)))


def measure(keys: int, rows: int, epochs: int, seed: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    kernel, inplace = DedupKernel(SCHEMA, ["key"], "event_time", TTL_MS), InPlaceDedup(TTL_MS)
    # every key once (not measured), then batches over them and a few new ones
    first_keys = rng.permutation(keys).astype(np.int64)
    zero = np.zeros(keys, np.int64)
    state = kernel.process(batch(first_keys, zero), None, -(2**62)).state
    inplace.process(first_keys, zero, -(2**62))
    ms: dict[str, list[float]] = {"today's kernel": [], "in place": []}
    for e in range(1, epochs + 1):
        k = np.concatenate([rng.integers(0, keys, rows - rows // 100), keys + e * rows + np.arange(rows // 100)])
        t = 1_000 * e + np.sort(rng.integers(0, 1_000, k.size))
        b = batch(k, t)
        t0 = time.perf_counter()
        result = kernel.process(b, state, 0)
        t1 = time.perf_counter()
        passed, changed = inplace.process(k, t, 0)
        t2 = time.perf_counter()
        state = result.state
        want = sorted(result.output.column("key").to_pylist())
        if sorted(k[passed].tolist()) != want or sorted(changed.tolist()) != sorted(result.upserts.column("key").to_pylist()):
            raise SystemExit(f"epoch {e}: the prototype's output or changed keys differ from the kernel's")
        ms["today's kernel"].append((t1 - t0) * 1000)
        ms["in place"].append((t2 - t1) * 1000)
    assert len(inplace) == state.num_rows
    return {name: {"median_ms": statistics.median(v), "max_ms": max(v)} for name, v in ms.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="100000,1000000,5000000")
    ap.add_argument("--rows", type=int, default=8_000)
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args()
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    result: dict[str, Any] = {"benchmark": "state-inplace", "when": stamp, "rows": args.rows, "epochs": args.epochs,
                              "sizes": {}}
    for keys in (int(k) for k in args.keys.split(",")):
        result["sizes"][str(keys)] = r = measure(keys, args.rows, args.epochs)
        print(json.dumps({"keys": keys, **r}), flush=True)
    results_io.write(HERE / "results" / f"state-inplace-{stamp}.json", result)


if __name__ == "__main__":
    main()
