"""The window kernel against DuckDB, and its independence from how input is split into epochs."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.eventtime import NO_WATERMARK
from eddyline.operators.window import (
    WindowConfig,
    WindowKernel,
    partial_aggregate,
)
from tests.operators.harness import run_epochs
from tests.operators.windowrows import make_rows

AGGS = (
    ("n", "count", None),
    ("n_price", "count", "price"),
    ("total", "sum", "price"),
    ("lo", "min", "price"),
    ("hi", "max", "price"),
    ("mean", "avg", "price"),
)




def windows(cfg: WindowConfig, batches: list[pa.Table], watermarks: list[int]) -> pa.Table:
    """The windows emitted over the epochs, then end of stream: each epoch's rows are folded into
    partials (``partial_aggregate``) before the kernel sees them."""
    kernel = WindowKernel(cfg, cfg.partial_schema(batches[0].schema))
    run = run_epochs(
        kernel,
        zip(batches, watermarks, strict=True),
        prepare=lambda rows, wm: partial_aggregate(cfg, rows, "ts", wm)[0],
        drained=True,
    )
    return run.output


def duckdb_windows(rows: pa.Table, size_ms: int, slide_ms: int) -> list[tuple]:
    con = duckdb.connect()
    con.register("r", rows)
    k = size_ms // slide_ms
    return con.execute(
        f"""
        WITH x AS (SELECT *, epoch_ms(ts) AS t FROM r),
        w AS (SELECT x.*, (t // {slide_ms}) * {slide_ms} - i * {slide_ms} AS ws
              FROM x, range({k}) AS g(i))
        SELECT auction, ws, count(*), count(price), sum(price), min(price), max(price), avg(price)
        FROM w GROUP BY auction, ws ORDER BY auction, ws
        """
    ).fetchall()


def kernel_rows(out: pa.Table) -> list[tuple]:
    d = out.to_pydict()
    rows = []
    for i in range(out.num_rows):
        ws = int(d["window_start"][i].timestamp() * 1000)
        mean = d["mean"][i]
        rows.append(
            (
                d["auction"][i],
                ws,
                d["n"][i],
                d["n_price"][i],
                d["total"][i],
                d["lo"][i],
                d["hi"][i],
                mean,
            )
        )
    return sorted(rows, key=lambda r: (r[0], r[1]))


@pytest.mark.parametrize("size,slide", [(10_000, 10_000), (10_000, 2_000), (6_000, 3_000)])
def test_matches_duckdb(size: int, slide: int) -> None:
    rows = make_rows(2_000)
    cfg = WindowConfig(("auction",), size, slide, AGGS)
    out = windows(cfg, [rows], [NO_WATERMARK])
    got, want = kernel_rows(out), duckdb_windows(rows, size, slide)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:7] == w[:7]
        assert (g[7] is None and w[7] is None) or g[7] == pytest.approx(w[7])
    assert set(out.column("revision").to_pylist()) == {0}


def test_window_fires_only_when_watermark_passes_end() -> None:
    cfg = WindowConfig(("auction",), 10_000, 10_000, (("n", "count", None),))
    rows = pa.table(
        {
            "auction": pa.array([1, 1, 2], pa.int64()),
            "ts": pa.array([1_000_000, 9_999_000, 12_000_000], pa.timestamp("us", tz="UTC")),
        }
    )
    kernel = WindowKernel(cfg, cfg.partial_schema(rows.schema))
    partials, _ = partial_aggregate(cfg, rows, "ts", 9_999)
    r1 = kernel.process(partials, None, 9_999)
    assert r1.output.num_rows == 0 and r1.state.num_rows == 2
    r2 = kernel.process(partials.slice(0, 0), r1.state, 10_000)
    assert r2.output.to_pydict()["n"] == [2] and r2.state.num_rows == 1
    assert r2.changed_key_groups == [0] and r2.deletes.num_rows == 1


def test_late_rows_are_dropped_and_reported_or_revise_within_lateness() -> None:
    cfg = WindowConfig(
        ("auction",), 10_000, 10_000, (("n", "count", None),), allowed_lateness_ms=5_000
    )
    schema = pa.schema([("auction", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
    kernel = WindowKernel(cfg, cfg.partial_schema(schema))

    def batch(ts_ms: list[int]) -> pa.Table:
        return pa.table(
            {"auction": [7] * len(ts_ms), "ts": [t * 1000 for t in ts_ms]}, schema=schema
        )

    p, late = partial_aggregate(cfg, batch([1_000, 2_000]), "ts", 0)
    r = kernel.process(p, None, 0)
    p, late = partial_aggregate(cfg, batch([]), "ts", 11_000)
    r = kernel.process(p, r.state, 11_000)  # fires [0,10s) with n=2, keeps it for lateness
    assert r.output.to_pydict()["n"] == [2] and r.output.to_pydict()["revision"] == [0]
    p, late = partial_aggregate(cfg, batch([3_000]), "ts", 12_000)  # late but within lateness
    assert late.num_rows == 0
    r = kernel.process(p, r.state, 12_000)
    assert r.output.to_pydict()["n"] == [3] and r.output.to_pydict()["revision"] == [1]
    p, late = partial_aggregate(cfg, batch([4_000]), "ts", 15_000)  # beyond lateness: late row
    assert late.num_rows == 1 and p.num_rows == 0
    r = kernel.process(p, r.state, 15_000)
    assert r.output.num_rows == 0 and r.state.num_rows == 0


def test_global_window_without_key() -> None:
    rows = make_rows(500, seed=3)
    cfg = WindowConfig((), 10_000, 5_000, (("n", "count", None), ("hi", "max", "price")))
    out = windows(cfg, [rows], [NO_WATERMARK])
    con = duckdb.connect()
    con.register("r", rows)
    want = con.execute(
        "SELECT ws, count(*), max(price) FROM (SELECT *, (epoch_ms(ts)//5000)*5000 - i*5000 AS ws "
        "FROM r, range(2) g(i)) GROUP BY ws ORDER BY ws"
    ).fetchall()
    d = out.sort_by("window_start").to_pydict()
    got = [
        (int(w.timestamp() * 1000), n, h)
        for w, n, h in zip(d["window_start"], d["n"], d["hi"], strict=True)
    ]
    assert got == want


@settings(max_examples=40, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 400), max_size=6),
    wm_lag=st.lists(st.integers(0, 30_000), min_size=7, max_size=7),
    slide=st.sampled_from([2_000, 5_000, 10_000]),
)
def test_emitted_windows_do_not_depend_on_epoch_split(
    cuts: list[int], wm_lag: list[int], slide: int
) -> None:
    """However the same (in-order) input is cut into epochs, and wherever the watermark stands
    (behind every row seen so far), the emitted windows are the same."""
    rows = make_rows(400, seed=11, span_ms=60_000)
    cfg = WindowConfig(("auction",), 10_000, slide, AGGS)
    bounds = sorted({0, 400, *cuts})
    batches = [rows.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    times = rows.column("ts").to_numpy().astype("datetime64[us]").astype(np.int64) // 1000
    watermarks, seen = [], NO_WATERMARK
    for i, _b in enumerate(batches):
        # the watermark of epoch i comes from epochs before i, and never passes an unseen row
        watermarks.append(seen)
        hi = int(times[bounds[i + 1] - 1])
        seen = max(
            seen, min(hi, int(times[bounds[i + 1]]) if bounds[i + 1] < 400 else hi) - wm_lag[i]
        )
    whole = kernel_rows(windows(cfg, [rows], [NO_WATERMARK]))
    split = kernel_rows(windows(cfg, batches, watermarks))
    assert split == whole


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), delay=st.sampled_from([0, 1_500, 4_000]), epochs=st.integers(2, 8),
       lanes=st.integers(1, 3))
def test_an_in_epoch_watermark_fires_the_same_windows_no_later(seed: int, delay: int, epochs: int, lanes: int) -> None:
    """A window fed by sources may advance its watermark within the epoch to the newest event
    time its lane received minus the delay: over out-of-order input split into epochs and lanes,
    it emits exactly the windows (and late rows) the planned watermark alone emits, each in the
    same epoch or an earlier one."""
    rng = np.random.default_rng(seed)
    rows = make_rows(600, seed=seed, keys=7)
    jitter = rng.integers(-3_000_000, 3_000_000, rows.num_rows)  # µs: out of order within 3 s
    ts = np.maximum(rows.column("ts").to_numpy().astype("datetime64[us]").astype(np.int64) + jitter, 0)
    rows = rows.set_column(2, "ts", pa.array(ts, pa.timestamp("us", tz="UTC")))
    cuts = np.sort(rng.choice(np.arange(1, rows.num_rows), epochs - 1, replace=False))
    batches = np.split(np.arange(rows.num_rows), cuts)
    planned, seen = [], NO_WATERMARK  # Spark's rule: the newest event time of earlier epochs − delay
    for b in batches:
        planned.append(max(planned[-1] if planned else NO_WATERMARK, seen - delay) if seen > NO_WATERMARK else NO_WATERMARK)
        if len(b):
            seen = max(seen, int(ts[b].max() // 1000))
    lane_of = rows.column("auction").to_numpy() % lanes
    first_epoch: dict[bool, dict[tuple, int]] = {}
    emitted: dict[bool, list[tuple]] = {}
    late: dict[bool, int] = {}
    for advance in (False, True):
        cfg = WindowConfig(("auction",), 6_000, 2_000, AGGS, advance_delay_ms=delay if advance else None)
        first_epoch[advance], emitted[advance], late[advance] = {}, [], 0
        for lane in range(lanes):
            mine = [pa.array(b[lane_of[b] == lane], pa.int64()) for b in batches]
            kernel = WindowKernel(cfg, cfg.partial_schema(rows.schema))
            state = None
            for epoch, (take, wm) in enumerate([*zip(mine, planned, strict=True), (pa.array([], pa.int64()), 2**62)]):
                partials, late_rows = partial_aggregate(cfg, rows.take(take), "ts", wm)
                late[advance] += late_rows.num_rows
                result = kernel.process(partials, state, wm)
                state = result.state
                for row in kernel_rows(result.output):
                    first_epoch[advance].setdefault(row[:2], epoch)
                    emitted[advance].append(row)
            assert state.num_rows == 0
    assert sorted(emitted[True], key=repr) == sorted(emitted[False], key=repr) and late[True] == late[False]
    assert all(first_epoch[True][w] <= e for w, e in first_epoch[False].items())


def test_a_lane_fires_as_soon_as_its_own_rows_pass_the_window() -> None:
    cfg = WindowConfig(("auction",), 10_000, 10_000, (("n", "count", None),), advance_delay_ms=1_000)
    rows = pa.table({"auction": pa.array([1, 1, 2], pa.int64()),
                     "ts": pa.array([1_000_000, 9_000_000, 11_500_000], pa.timestamp("us", tz="UTC"))})
    kernel = WindowKernel(cfg, cfg.partial_schema(rows.schema))
    assert "_tmax" in kernel.input_schema.names and "_tmax" not in kernel.state_schema.names
    partials, _ = partial_aggregate(cfg, rows, "ts", NO_WATERMARK)
    r = kernel.process(partials, None, NO_WATERMARK)  # 11.5 s − 1 s passes the end of [0, 10 s)
    assert r.output.to_pydict()["n"] == [2] and r.state.num_rows == 1
    early, _ = partial_aggregate(cfg, rows.slice(0, 2), "ts", NO_WATERMARK)
    r = kernel.process(early, None, NO_WATERMARK)  # only rows before 10 s: 9 s − 1 s does not pass it
    assert r.output.num_rows == 0


@pytest.mark.parametrize("size,step,epochs", [(10_000, 2_000, 1), (6_000, 3_000, 4), (4_000, 4_000, 3)])
def test_cumulative_windows_match_duckdb(size: int, step: int, epochs: int) -> None:
    """Flink's CUMULATE: from each multiple of the size, windows ending every step; a row is in
    every one that ends after it. Over epochs with a rising watermark, against DuckDB."""
    rows = make_rows(1_500, seed=3)
    cfg = WindowConfig(("auction",), size, size, AGGS, cumulate_ms=step)
    cuts = np.array_split(np.arange(rows.num_rows), epochs)
    batches = [rows.take(pa.array(c)) for c in cuts]
    wms = [NO_WATERMARK] + [int(b.column("ts").to_numpy().astype("int64").max() // 1000) for b in batches[:-1]]
    out = windows(cfg, batches, wms)  # (rows come in time order: none is late)
    d = out.to_pydict()
    got = sorted((d["auction"][i], int(d["window_start"][i].timestamp() * 1000), int(d["window_end"][i].timestamp() * 1000),
                  *(d[c][i] for c in ("n", "n_price", "total", "lo", "hi", "mean"))) for i in range(out.num_rows))
    con = duckdb.connect()
    con.register("r", rows)
    want = con.execute(f"""
        WITH x AS (SELECT *, epoch_ms(ts) AS t, (epoch_ms(ts) // {size}) * {size} AS s FROM r),
        w AS (SELECT x.*, s + i * {step} AS we FROM x, range(1, {size // step} + 1) AS g(i) WHERE s + i * {step} > t)
        SELECT auction, s, we, count(*), count(price), sum(price), min(price), max(price), avg(price)
        FROM w GROUP BY auction, s, we ORDER BY ALL""").fetchall()
    assert len(got) == len(want) and len(got) > 0
    for g, w in zip(got, want, strict=True):
        assert g[:8] == w[:8] and (g[8] is None and w[8] is None or g[8] == pytest.approx(w[8]))
    assert set(out.column("revision").to_pylist()) == {0}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), epochs=st.integers(2, 6), lateness=st.sampled_from([0, 2_000]),
       shape=st.sampled_from([(6_000, 6_000, None), (6_000, 2_000, None), (6_000, 6_000, 2_000)]))
def test_lanes_drop_closed_windows_as_the_jvm_would(
    seed: int, epochs: int, lateness: int, shape: tuple[int, int, int | None]
) -> None:
    """A window kept across epochs leaves its plan without the watermark: the partials of every
    window reach the lanes, which drop those closed at the planned watermark and count the rows
    whose last window that was as late. Epoch by epoch, over out-of-order input, that emits and
    keeps what dropping in the JVM (``partial_aggregate`` at the watermark) does, with the same
    count of late rows."""
    size, slide, step = shape
    rng = np.random.default_rng(seed)
    rows = make_rows(500, seed=seed, keys=4)
    jitter = rng.integers(-8_000_000, 2_000_000, rows.num_rows)  # µs: some rows far behind
    ts = np.maximum(rows.column("ts").to_numpy().astype("datetime64[us]").astype(np.int64) + jitter, 0)
    rows = rows.set_column(2, "ts", pa.array(ts, pa.timestamp("us", tz="UTC")))
    batches = np.array_split(np.arange(rows.num_rows), epochs)
    batches[-1] = np.concatenate([batches[-1], np.arange(20)])  # the first rows again, now late
    cfg = WindowConfig(("auction",), size, slide, AGGS, allowed_lateness_ms=lateness, cumulate_ms=step)
    kernel = WindowKernel(cfg, cfg.partial_schema(rows.schema))
    states: dict[bool, pa.Table | None] = {True: None, False: None}
    late_total = {True: 0, False: 0}
    wm, seen = NO_WATERMARK, NO_WATERMARK
    for b in batches:
        part = rows.take(pa.array(b, pa.int64()))
        outs = {}
        for in_jvm in (True, False):
            partials, late_rows = partial_aggregate(cfg, part, "ts", wm if in_jvm else NO_WATERMARK)
            r = kernel.process(partials, states[in_jvm], wm)
            states[in_jvm] = r.state
            late_total[in_jvm] += late_rows.num_rows + r.metrics["late_rows"]
            outs[in_jvm] = sorted(kernel_rows(r.output), key=repr)
        assert outs[True] == outs[False]
        order = [(c, "ascending") for c in kernel.primary_key]
        assert states[True].sort_by(order).equals(states[False].sort_by(order))
        seen = max(seen, int(ts[b].max() // 1000))
        wm = max(wm, seen - 1_000)
    assert late_total[True] == late_total[False] > 0
