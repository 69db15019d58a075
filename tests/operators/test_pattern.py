"""The pattern kernel against hand-written matches and a brute-force reference, its independence
from how input is cut into epochs and ordered, and the two parallelisations of AnduIN's seed:
partitioned by key and the pipeline split ``P+ = P v (P P+)``."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.operators.base import KernelResult
from eddyline.operators.pattern import (
    ONE,
    PLUS,
    SKIP_TILL_NEXT_MATCH,
    STRICT,
    Always,
    Contiguity,
    Element,
    Falling,
    Measure,
    Pattern,
    PatternKernel,
    pipeline_split,
    stage2_batch,
    tick_pattern,
)
from tests.operators.harness import Driver, run_epochs, with_end_of_stream
from tests.operators.harness import exact_delta as check_delta

SCHEMA = pa.schema(
    [
        ("_kg", pa.int32()),
        ("sym", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("price", pa.int64()),
        ("vol", pa.int64()),
    ]
)
MEASURES: dict[str, Measure] = {
    "a": ("A", "price", "first"),
    "b_len": ("B", None, "count"),
    "b_low": ("B", "price", "min"),
    "b_last": ("B", "price", "last"),
    "c": ("C", "price", "first"),
    "d_peak": ("D", "price", "max"),
    "d_len": ("D", None, "count"),
    "d_vols": ("D", "vol", "count"),
}
WITHIN = 20_000
Match = tuple[Any, ...]


# ------------------------------------------------------------------------------ helpers
def table(rows: Sequence[tuple[str | None, int, int | None, int | None]]) -> pa.Table:
    """Rows ``(sym, t_ms, price, vol)``; the key group is a fixed function of the symbol."""
    return pa.table(
        {
            "_kg": [sum(map(ord, r[0] or "")) % 5 for r in rows],
            "sym": [r[0] for r in rows],
            "ts": [r[1] * 1000 for r in rows],
            "price": [r[2] for r in rows],
            "vol": [r[3] for r in rows],
        },
        schema=SCHEMA,
    )


def make_rows(
    seed: int, n: int = 60, keys: int = 3, span_s: int = 30
) -> list[tuple[str, int, int | None, int | None]]:
    """Stock-like rows with many equal timestamps (ties) and a few null prices and volumes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        price = None if rng.random() < 0.04 else int(rng.integers(0, 8))
        vol = None if rng.random() < 0.1 else int(rng.integers(0, 3))
        out.append((f"K{rng.integers(0, keys)}", int(rng.integers(0, span_s)) * 1000, price, vol))
    return out


def kernel(pattern: Pattern | None = None, within: int = WITHIN, **kw: Any) -> PatternKernel:
    return PatternKernel(
        SCHEMA, ("sym",), "ts", pattern or tick_pattern("price"), within, MEASURES, **kw
    )


def check_epoch(k: PatternKernel, old: pa.Table, res: KernelResult) -> None:
    """The harness's per-epoch check of a single kernel: exact deltas, changed key groups."""
    check_delta(k, old, res)
    assert set(res.changed_key_groups) >= set(pc.unique(res.upserts.column("_kg")).to_pylist())


def run_pipeline(
    s1: PatternKernel, s2: PatternKernel, epochs: Sequence[tuple[pa.Table, int]]
) -> pa.Table:
    """Stage 1 then stage 2 per epoch, stage 2 getting stage 1's seeds of the same epoch."""
    stage1, stage2 = Driver(s1, check=check_delta), Driver(s2, check=check_delta)
    for batch, wm in with_end_of_stream(epochs):
        seeds = stage1.step(batch, wm).output
        stage2.step(stage2_batch(s2, batch, seeds), wm)
    assert stage1.state.num_rows == 0 and stage2.state.num_rows == 0
    return stage2.output


def ms(v: datetime) -> int:
    return round(v.timestamp() * 1000)


def matches(out: pa.Table) -> list[Match]:
    """Output rows as sorted tuples ``(sym, start_ms, end_ms, *measures)``."""
    rows = [
        (r["sym"], ms(r["match_start"]), ms(r["match_end"]), *(r[m] for m in MEASURES))
        for r in out.to_pylist()
    ]
    return sorted(rows, key=repr)


def epochs_of(
    rows: list[tuple[str, int, int | None, int | None]],
    rng: np.random.Generator,
    n_epochs: int,
    lags: Sequence[int],
) -> list[tuple[pa.Table, int]]:
    """Cut rows into epochs with out-of-order arrival (a row may arrive up to two epochs after
    its time slot) and shuffled batches; each epoch's watermark trails every row not yet arrived."""
    order = sorted(range(len(rows)), key=lambda i: rows[i][1])
    slot = np.zeros(len(rows), dtype=np.int64)
    slot[order] = np.arange(len(rows)) * n_epochs // max(len(rows), 1)
    arrival = np.minimum(slot + rng.integers(0, 3, len(rows)), n_epochs - 1)
    times = np.array([r[1] for r in rows], dtype=np.int64)
    out, wm = [], NO_WATERMARK
    for e in range(n_epochs):
        pending = times[arrival >= e]
        if e and pending.size:
            wm = max(wm, int(pending.min()) - lags[e % len(lags)])
        idx = rng.permutation(np.flatnonzero(arrival == e))
        out.append((table([rows[i] for i in idx]), wm))
    return out


# ------------------------------------------------------------------------ the reference
def sort_key(r: tuple[str, int, int | None, int | None]) -> tuple:
    """The kernel's total order within a key: time, then the other columns, nulls last."""
    return (r[1], r[2] is None, r[2] or 0, r[3] is None, r[3] or 0)


def as_dict(r: tuple[str, int, int | None, int | None]) -> dict[str, Any]:
    return {"sym": r[0], "t": r[1], "price": r[2], "vol": r[3]}


def measures_of(blocks: Sequence[Sequence[dict[str, Any]]], names: Sequence[str]) -> tuple:
    out: list[Any] = []
    for elem, col, func in MEASURES.values():
        block = blocks[list(names).index(elem)]
        vals = [r[col] for r in block if col is not None and r[col] is not None]
        out.append(
            {
                "first": lambda b=block, c=col: b[0][c],
                "last": lambda b=block, c=col: b[-1][c],
                "count": lambda b=block, c=col, v=vals: len(b) if c is None else len(v),
                "min": lambda v=vals: min(v) if v else None,
                "max": lambda v=vals: max(v) if v else None,
            }[func]()
        )
    return tuple(out)


def splits(length: int, quants: Sequence[str]) -> Iterator[tuple[int, ...]]:
    """Every way to cut ``length`` consecutive rows into one block per element."""
    if not quants:
        if length == 0:
            yield ()
        return
    room = length - (len(quants) - 1)
    for size in [1] if quants[0] == ONE else range(1, room + 1):
        if size <= room:
            for tail in splits(length - size, quants[1:]):
                yield (size, *tail)


def holds(pattern: Pattern, blocks: Sequence[Sequence[dict[str, Any]]]) -> bool:
    """Does every row of ``blocks`` (consecutive in the match) satisfy its element's predicate?"""
    bound: dict[str, dict[str, Any]] = {}
    prev = None
    for el, block in zip(pattern.elements, blocks, strict=True):
        for row in block:
            if not el.predicate(row, prev, dict(bound)):
                return False
            bound.setdefault(el.name, row)
            bound[f"{el.name}.last"] = row
            prev = row
    return True


def reference(
    rows: list[tuple[str, int, int | None, int | None]], pattern: Pattern, within: int
) -> list[Match]:
    """All matches, by brute force over each key's sorted rows. Strict contiguity: every segment
    of consecutive rows and every split of it into element blocks. Skip till next match: a
    depth-first walk that skips exactly the rows satisfying no transition."""
    names = [e.name for e in pattern.elements]
    quants = [e.quantifier for e in pattern.elements]
    found: list[Match] = []
    for sym in sorted({r[0] for r in rows}):
        ev = [as_dict(r) for r in sorted((r for r in rows if r[0] == sym), key=sort_key)]
        if pattern.contiguity == STRICT:
            for s in range(len(ev)):
                for j in range(s, len(ev)):
                    if ev[j]["t"] - ev[s]["t"] > within:
                        break
                    for sizes in splits(j - s + 1, quants):
                        bounds = np.cumsum([s, *sizes])
                        blocks = [ev[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
                        if holds(pattern, blocks):
                            found.append((sym, ev[s]["t"], ev[j]["t"], *measures_of(blocks, names)))
        else:
            found += skip_reference(sym, ev, pattern, within)
    return sorted(found, key=repr)


def skip_reference(
    sym: str, ev: list[dict[str, Any]], pattern: Pattern, within: int
) -> list[Match]:
    els = pattern.elements
    n = len(els)
    out: list[Match] = []

    def walk(start: int, pos: int, blocks: list[list[dict[str, Any]]]) -> None:
        elem = len(blocks) - 1
        if elem == n - 1:
            out.append(
                (sym, ev[start]["t"], ev[pos]["t"], *measures_of(blocks, [e.name for e in els]))
            )
            if els[-1].quantifier == ONE:
                return
        bound = {}
        for e, b in zip(els, blocks, strict=False):
            bound[e.name], bound[f"{e.name}.last"] = b[0], b[-1]
        for j in range(pos + 1, len(ev)):
            if ev[j]["t"] - ev[start]["t"] > within:
                return
            took = False
            if els[elem].quantifier == PLUS and els[elem].predicate(ev[j], ev[pos], bound):
                walk(start, j, [*blocks[:-1], [*blocks[-1], ev[j]]])
                took = True
            if elem + 1 < n and els[elem + 1].predicate(ev[j], ev[pos], bound):
                walk(start, j, [*blocks, [ev[j]]])
                took = True
            if took:
                return

    for s in range(len(ev)):
        if els[0].predicate(ev[s], None, {}):
            walk(s, s, [[ev[s]]])
    return out


# --------------------------------------------------------------------------------- tests
def test_tick_pattern_hand_made() -> None:
    """X falls 10 → 9 → 5, rebounds to 6 (under both 10 and 9), then rises 11, 12 above both:
    two starts (A = 10, A = 9) times two D extensions. Y's 2 s tie is ordered by price (4 then 6),
    which makes 8, 4, 6, 9 a tick; the tied rows arrive in separate epochs, in reverse."""
    x = [("X", t * 1000, p, 1) for t, p in zip(range(1, 8), [10, 9, 5, 6, 11, 12, 8], strict=True)]
    y_first = [("Y", 1000, 8, 1), ("Y", 2000, 6, 1), ("Y", 3000, 9, 1)]
    y_late = [("Y", 2000, 4, 1)]
    got = matches(
        run_epochs(
            kernel(),
            [(table(x + y_first), NO_WATERMARK), (table(y_late), 2000)],
            check=check_epoch,
            drained=True,
        ).output
    )
    #         sym  start  end   a  b_len b_low b_last c  d_peak d_len d_vols
    assert got == sorted(
        [
            ("X", 1000, 5000, 10, 2, 5, 5, 6, 11, 1, 1),
            ("X", 1000, 6000, 10, 2, 5, 5, 6, 12, 2, 2),
            ("X", 2000, 5000, 9, 1, 5, 5, 6, 11, 1, 1),
            ("X", 2000, 6000, 9, 1, 5, 5, 6, 12, 2, 2),
            ("Y", 1000, 3000, 8, 1, 4, 4, 6, 9, 1, 1),
        ],
        key=repr,
    )


def test_the_kernel_counts_its_work_per_key_group_rows_times_open_runs() -> None:
    """Two keys with the same rows in one epoch: X keeps falling (every row starts a run that
    stays open, so each row is tried against all the runs before it), Y's rows never leave a
    run open. X's key group is charged far more work than Y's, by the kernel's own count."""
    x = [("X", t * 1000, 100 - t, 1) for t in range(1, 11)]  # 10 rows, 0+1+...+9 tries
    y = [("Y", t * 1000, 5, 1) for t in range(1, 11)]  # flat: only A-starts that B cannot extend
    batch = table(x + y)
    kg_x, kg_y = (sum(map(ord, s)) % 5 for s in ("X", "Y"))
    assert kg_x != kg_y
    k = kernel()
    held = k.process(batch, k.state_schema.empty_table(), NO_WATERMARK)  # buffered until ordered
    assert held.kg_cost == {}  # nothing matched yet: no work
    res = k.process(SCHEMA.empty_table(), held.state, 20_000)
    assert set(res.kg_cost) == {kg_x, kg_y}
    assert res.kg_cost[kg_x] >= 10 + sum(range(10)) and res.kg_cost[kg_y] < res.kg_cost[kg_x]


def test_null_key_and_no_key() -> None:
    """A null key is a key like any other; without keys the whole key group is one sequence."""
    prices = [10, 9, 5, 6, 11, 12, 8]
    rows = [(None, t * 1000, p, 1) for t, p in zip(range(1, 8), prices, strict=True)]
    spans = [(1000, 5000), (1000, 6000), (2000, 5000), (2000, 6000)]
    got = matches(
        run_epochs(kernel(), [(table(rows), NO_WATERMARK)], check=check_epoch, drained=True).output
    )
    assert [(m[0], m[1], m[2]) for m in got] == [(None, a, b) for a, b in spans]
    single = table(rows).set_column(0, "_kg", pa.array([0] * 7, pa.int32()))
    k = PatternKernel(
        SCHEMA, (), "ts", tick_pattern("price"), WITHIN, {"a": ("A", "price", "first")}
    )
    out = run_epochs(k, [(single, NO_WATERMARK)], check=check_epoch, drained=True).output
    assert sorted((ms(r["match_start"]), ms(r["match_end"])) for r in out.to_pylist()) == spans
    assert out.column_names == ["match_start", "match_end", "a"]


def test_within_is_enforced_and_inclusive() -> None:
    x = table([("X", t * 1000, p, 0) for t, p in zip(range(1, 6), [10, 9, 5, 6, 11], strict=True)])
    spans = {
        w: [
            (m[1], m[2])
            for m in matches(
                run_epochs(
                    kernel(within=w), [(x, NO_WATERMARK)], check=check_epoch, drained=True
                ).output
            )
        ]
        for w in (4000, 3000, 2999)
    }
    assert spans == {4000: [(1000, 5000), (2000, 5000)], 3000: [(2000, 5000)], 2999: []}


@pytest.mark.parametrize("contiguity", [STRICT, SKIP_TILL_NEXT_MATCH])
@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_reference(seed: int, contiguity: Contiguity) -> None:
    rows = make_rows(seed, n=90)
    pattern = tick_pattern("price", contiguity)
    within = [8_000, 15_000, 30_000][seed % 3]
    got = matches(
        run_epochs(
            kernel(pattern, within), [(table(rows), NO_WATERMARK)], check=check_epoch, drained=True
        ).output
    )
    assert got == reference(rows, pattern, within)
    assert got, "the random data should contain ticks"


def test_a_b_plus_every_extension() -> None:
    """``A B+``: every start followed by falling prices, one match per extension (AnduIN's
    p1p2, p1p2p3, ...), checked against a direct enumeration."""
    rows = make_rows(42, n=40, keys=2)
    pattern = Pattern((Element("A", Always()), Element("B", Falling("price"), PLUS)))
    measures: dict[str, Measure] = {
        "n": ("B", None, "count"),
        "lo": ("B", "price", "min"),
        "who": ("A", "sym", "first"),
        "until": ("B", "ts", "max"),
    }
    k = PatternKernel(SCHEMA, ("sym",), "ts", pattern, 10_000, measures)
    out = run_epochs(k, [(table(rows), NO_WATERMARK)], check=check_epoch, drained=True).output
    assert out.column("who").equals(out.column("sym")) and out.column("until").equals(
        out.column("match_end")
    )
    want = []
    for sym in sorted({r[0] for r in rows}):
        ev = sorted((r for r in rows if r[0] == sym), key=sort_key)
        for s in range(len(ev)):
            for j in range(s + 1, len(ev)):
                a, b = ev[j - 1][2], ev[j][2]
                if ev[j][1] - ev[s][1] > 10_000 or a is None or b is None or not b < a:
                    break
                want.append((sym, ev[s][1], ev[j][1], j - s, b))
    got = [
        (r["sym"], ms(r["match_start"]), ms(r["match_end"]), r["n"], r["lo"])
        for r in out.to_pylist()
    ]
    assert sorted(got, key=repr) == sorted(want, key=repr) and got


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_epochs=st.integers(1, 7),
    lags=st.lists(st.integers(0, 4_000), min_size=1, max_size=4),
    contiguity=st.sampled_from([STRICT, SKIP_TILL_NEXT_MATCH]),
)
def test_matches_do_not_depend_on_epochs_or_arrival_order(
    seed: int, n_epochs: int, lags: list[int], contiguity: Contiguity
) -> None:
    """However rows are cut into epochs, arrive out of order across them (behind no watermark),
    and are shuffled within a batch, the matches are the same: the reference's."""
    rows = make_rows(seed, n=60)
    pattern = tick_pattern("price", contiguity)
    epochs = epochs_of(rows, np.random.default_rng(seed), n_epochs, lags)
    run = run_epochs(kernel(pattern), epochs, check=check_epoch, drained=True)
    out, metrics = run.output, run.metrics
    assert metrics["late_rows"] == 0
    assert matches(out) == reference(rows, pattern, WITHIN)


def test_replay_with_another_row_order_gives_identical_results() -> None:
    rows = make_rows(7, n=80)
    k = kernel()
    first = k.process(table(rows[:40]), None, NO_WATERMARK)
    second_batch = table(rows[40:])
    results = [
        k.process(
            second_batch.take(np.random.default_rng(s).permutation(second_batch.num_rows)),
            first.state,
            15_000,
        )
        for s in range(3)
    ]
    for r in results[1:]:
        for a, b in [
            (r.output, results[0].output),
            (r.state, results[0].state),
            (r.upserts, results[0].upserts),
            (r.deletes, results[0].deletes),
        ]:
            assert a.equals(b)
        assert (
            r.changed_key_groups == results[0].changed_key_groups
            and r.metrics == results[0].metrics
        )
    assert (
        pickle.loads(pickle.dumps(k))
        .process(second_batch, first.state, 15_000)
        .output.equals(k.process(second_batch, first.state, 15_000).output)
    )


def test_late_rows_per_key_and_behind_the_horizon() -> None:
    """With lateness allowed, a row is late only if its key already matched a row at or after its
    time; without, any row behind the watermark is. An idle key's state goes once its last time
    is behind the horizon."""
    k = kernel(allowed_lateness_ms=60_000)
    r = k.process(
        table([("X", 1000, 5, 0), ("X", 2000, 4, 0), ("X", 3000, 3, 0)]), None, NO_WATERMARK
    )
    r = k.process(SCHEMA.empty_table(), r.state, 10_000)  # matches X up to 3 s
    late = [("X", 2000, 9, 0), ("X", 3000, 0, 0), ("X", 5000, 1, 0), ("Y", 2000, 1, 0)]
    r = k.process(table(late), r.state, 10_000)
    assert r.metrics["late_rows"] == 2  # X at 2 s and at 3 s (a tie with a matched row)
    meta = r.state.filter(pc.equal(r.state.column("_kind"), 0)).sort_by("sym")
    assert meta.column("_last_ms").to_pylist() == [5_000, 2_000]
    r = k.process(SCHEMA.empty_table(), r.state, 90_000)  # runs and last times behind the horizon
    assert r.state.num_rows == 0 and set(r.deletes.column("sym").to_pylist()) == {"X", "Y"}
    r = k.process(table([("X", 4000, 1, 0)]), r.state, 90_000)  # X forgotten, yet still late
    assert r.metrics["late_rows"] == 1 and r.state.num_rows == 0

    strict = kernel()
    r = strict.process(table([("X", 1000, 5, 0)]), None, NO_WATERMARK)
    r = strict.process(
        table([("X", 2000, 4, 0), ("Z", 9000, 4, 0), ("Z", 10_000, 4, 0)]), r.state, 10_000
    )
    assert r.metrics["late_rows"] == 2 and r.metrics["buffered_rows"] == 1  # Z at 10 s waits


def test_partitioned_by_key_equals_single_instance() -> None:
    """Key groups split over three lanes, each with its own kernel and state, as the runtime does."""
    rows = make_rows(3, n=90, keys=6)
    rng = np.random.default_rng(3)
    epochs = epochs_of(rows, rng, 5, [0, 2_000])
    whole = matches(run_epochs(kernel(), epochs, check=check_epoch, drained=True).output)
    lanes = []
    for lane in range(3):
        mine = [
            (b.filter(pa.array(np.asarray(b.column("_kg")) % 3 == lane)), wm) for b, wm in epochs
        ]
        lanes += matches(run_epochs(kernel(), mine, check=check_epoch, drained=True).output)
    assert sorted(lanes, key=repr) == whole and whole


@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize("contiguity", [STRICT, SKIP_TILL_NEXT_MATCH])
@pytest.mark.parametrize("seed", [3, 4, 9])  # data sets with strict ticks in them
def test_pipeline_split_equals_single_stage(seed: int, contiguity: Contiguity, at: int) -> None:
    """Stage 1 (A B, resp. A B+ C D, up to the first P) feeding stage 2 (the P+ extensions and the
    suffix) finds exactly the single kernel's matches, across epochs with out-of-order arrival."""
    rows = make_rows(seed, n=90)
    pattern = tick_pattern("price", contiguity)
    epochs = epochs_of(rows, np.random.default_rng(seed), 3 + seed % 4, [0, 1_500, 3_000])
    single = matches(run_epochs(kernel(pattern), epochs, check=check_epoch, drained=True).output)
    s1, s2 = pipeline_split(SCHEMA, ("sym",), "ts", pattern, WITHIN, MEASURES, at)
    assert matches(run_pipeline(s1, s2, epochs)) == single and single


@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize("contiguity", [STRICT, SKIP_TILL_NEXT_MATCH])
@pytest.mark.parametrize("seed", [3, 9])
def test_pipeline_split_made_while_running_continues_the_single_kernels_state(
    seed: int, contiguity: Contiguity, at: int
) -> None:
    """The rewrite made at an epoch boundary (:mod:`eddyline.kinds.rewrite`): the single kernel
    runs the first epochs, then both stages start from its state, each keeping the runs of its
    part; the matches before plus the pipeline's after are exactly the single kernel's."""
    rows = make_rows(seed, n=120)
    pattern = tick_pattern("price", contiguity)
    epochs = with_end_of_stream(epochs_of(rows, np.random.default_rng(seed), 6, [0, 1_500, 3_000]))
    single = matches(run_epochs(kernel(pattern), epochs, check=check_epoch).output)
    for cut in range(1, len(epochs)):
        before = Driver(kernel(pattern), check=check_epoch)
        for batch, wm in epochs[:cut]:
            before.step(batch, wm)
        s1, s2 = pipeline_split(SCHEMA, ("sym",), "ts", pattern, WITHIN, MEASURES, at)
        stage1, stage2 = Driver(s1, check=check_delta), Driver(s2, check=check_delta)
        stage1.state = stage2.state = before.state
        for batch, wm in epochs[cut:]:
            seeds = stage1.step(batch, wm).output
            stage2.step(stage2_batch(s2, batch, seeds), wm)
        assert stage1.state.num_rows == 0 and stage2.state.num_rows == 0
        got = matches(pa.concat_tables([before.output, stage2.output]))
        assert got == single and single, cut


def test_pipeline_split_hand_made_seeds() -> None:
    """The seeds stage 1 emits for X (split at B): every A followed by a lower row."""
    x = table(
        [("X", t * 1000, p, 1) for t, p in zip(range(1, 8), [10, 9, 5, 6, 11, 12, 8], strict=True)]
    )
    s1, _ = pipeline_split(SCHEMA, ("sym",), "ts", tick_pattern("price"), WITHIN, MEASURES)
    seeds = s1.process(x, None, END_OF_STREAM).output
    got = [
        (r["_start_ms"], r["_end_ms"], r["_first_0.price"], r["_first_1.price"], r["_count_1"])
        for r in seeds.to_pylist()
    ]
    assert got == [(1000, 2000, 10, 9, 1), (2000, 3000, 9, 5, 1), (6000, 7000, 12, 8, 1)]


def test_schema_without_key_group_column() -> None:
    """Step builders pass the input schema without ``_kg``; the kernel appends it."""
    k = PatternKernel(SCHEMA.remove(0), ("sym",), "ts", tick_pattern("price"), WITHIN, MEASURES)
    assert k.input_schema.names == ["sym", "ts", "price", "vol", "_kg"]
    x = table([("X", t * 1000, p, 1) for t, p in zip(range(1, 6), [10, 9, 5, 6, 11], strict=True)])
    assert matches(
        run_epochs(k, [(x, NO_WATERMARK)], check=check_epoch, drained=True).output
    ) == matches(run_epochs(kernel(), [(x, NO_WATERMARK)], check=check_epoch, drained=True).output)


def test_validation() -> None:
    with pytest.raises(ValueError, match="unique"):
        Pattern((Element("A", Always()), Element("A", Always())))
    with pytest.raises(ValueError, match="unknown element"):
        PatternKernel(
            SCHEMA, ("sym",), "ts", tick_pattern("price"), 1, {"x": ("Q", "price", "first")}
        )
    with pytest.raises(ValueError, match="needs a column"):
        PatternKernel(SCHEMA, ("sym",), "ts", tick_pattern("price"), 1, {"x": ("A", None, "max")})
    with pytest.raises(ValueError, match="Kleene-plus"):
        pipeline_split(SCHEMA, ("sym",), "ts", tick_pattern("price"), 1, {}, at=2)


def test_deferred_rows_are_the_input_the_watermark_has_not_passed() -> None:
    """The pattern names its buffered rows as held-back input, and the lanes' account of the
    rows worked on per key group follows them from the epoch they arrive to the one that frees them."""
    from eddyline.operators.base import deferred_counts
    from eddyline.runtime.lanes import _deferral

    k = kernel()
    rows = make_rows(5, n=40, keys=4)
    first = table(rows)
    arrived = np.bincount(first.column("_kg").to_numpy(), minlength=5)
    res1 = k.process(first, k.empty_state(), NO_WATERMARK)  # nothing is behind the watermark
    held1 = deferred_counts(k, res1.state, 5)
    assert held1 is not None and held1.tolist() == arrived.tolist()
    acct1 = _deferral(arrived, np.zeros(5, dtype=np.int64), held1)
    assert (
        acct1["kg_work"] == {}
        and sum(acct1["kg_held"].values()) == 40
        and acct1["held_before"] == 0
    )
    # the next epoch's watermark passes every row of the first one; its own rows come later
    late = table([(s, t + 100_000, p, v) for s, t, p, v in rows[:10]])
    res2 = k.process(late, res1.state, 60_000)
    held2 = deferred_counts(k, res2.state, 5)
    arrived2 = np.bincount(late.column("_kg").to_numpy())
    assert held2 is not None and held2.sum() == 10
    acct2 = _deferral(arrived2, held1, held2)
    assert acct2["kg_work"] == {str(g): int(n) for g, n in enumerate(arrived) if n}
    assert acct2["held_before"] == 40 and acct2["held_worked"] == 40
    # a kernel that works on its input at once defers nothing
    from eddyline.operators.dedup import DedupKernel

    assert deferred_counts(DedupKernel.__new__(DedupKernel), res1.state, 5) is None
