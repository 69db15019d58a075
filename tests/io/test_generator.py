"""The generator source: determinism, phases and event time, key distribution, pacing."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime
from fractions import Fraction
from functools import reduce

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from eddyline.io.generator import (
    UNPACED_AVAILABLE,
    Generator,
    Phase,
    generator_available,
    generator_event_time_ms,
    generator_frame,
    spread_multiplier,
)

START = datetime(2026, 1, 1, tzinfo=UTC)
START_MS = int(START.timestamp() * 1000)

#: Phases with awkward rates: fractional rows per phase, and one phase too short to hold a row.
AWKWARD = Generator(
    rate=3,
    keys=10,
    skew=1.2,
    seed=7,
    phases=(
        Phase(duration="1s"),
        Phase(duration="333ms", rate=7.5, keys=5, hot_shift=3),
        Phase(duration="10ms", rate=1),
        Phase(duration="2s", rate=1000, skew=0),
    ),
)


def _rows(df: DataFrame) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def _key_counts(df: DataFrame) -> Counter[int]:
    return Counter({r.key: r["count"] for r in df.groupBy("key").count().collect()})


# --------------------------------------------------------------------------- shape, determinism


def test_schema_is_exact(spark):
    df = generator_frame(spark, Generator(), 0, 10, 1)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("offset", "bigint"),
        ("key", "bigint"),
        ("value", "bigint"),
        ("event_time", "timestamp"),
    ]
    assert [r.offset for r in df.collect()] == list(range(10))


def test_rows_do_not_depend_on_ranges_or_partitions(spark):
    whole = _rows(generator_frame(spark, AWKWARD, 0, 3000, 3))
    assert whole == _rows(generator_frame(spark, AWKWARD, 0, 3000, 3))
    pieces = [(0, 5), (5, 6), (6, 1700), (1700, 3000)]
    split = reduce(
        DataFrame.unionAll,
        (generator_frame(spark, AWKWARD, a, b, i + 1) for i, (a, b) in enumerate(pieces)),
    )
    assert _rows(split) == whole


def test_seed_changes_keys_and_values(spark):
    a = _rows(generator_frame(spark, Generator(seed=1), 0, 200, 1))
    b = _rows(generator_frame(spark, Generator(seed=2), 0, 200, 1))
    assert [r[1:3] for r in a] != [r[1:3] for r in b]
    assert [r[3] for r in a] == [r[3] for r in b]  # event time does not depend on the seed


def test_key_and_value_bounds(spark):
    cases = [(1, 0.0), (7, 0.0), (7, 3.0), (1000, 1.0)]
    frames = [
        generator_frame(spark, Generator(keys=keys, skew=skew), 0, 3000, 2).select(
            F.lit(i).alias("case"), "key", "value"
        )
        for i, (keys, skew) in enumerate(cases)
    ]
    rows = reduce(DataFrame.unionAll, frames).collect()
    for i, (keys, _) in enumerate(cases):
        assert {r.key for r in rows if r.case == i} <= set(range(keys))
    assert {r.value for r in rows} <= set(range(1000))
    assert {r.key for r in rows if r.case == 1} == set(range(7))  # uniform: every key occurs


# --------------------------------------------------------------------------- phases, event time


def test_event_time_agrees_with_the_pure_function(spark):
    df = generator_frame(spark, AWKWARD, 0, 2000, 3).select(
        "offset", F.unix_millis("event_time").alias("ms")
    )
    got = {r.offset: r.ms for r in df.collect()}
    assert got == {o: generator_event_time_ms(AWKWARD, o) for o in range(2000)}


def test_phases_set_rate_keys_and_inherit_the_rest():
    ms = [generator_event_time_ms(AWKWARD, o) - START_MS for o in range(8)]
    # Phase 1: 3 rows/s for 1 s. Phase 2 (7.5/s for 333 ms) holds rows 3..5, i.e. 2.4975 rows
    # of time; phase 3 (10 ms at 1/s) holds none; phase 4 starts at 1343 ms, and its first row
    # (6) comes 0.4925 of its 1 ms row gap later.
    assert ms == [0, 333, 666, 1000, 1133, 1266, 1343, 1344]


def test_phase_keys_apply_within_the_phase(spark):
    df = generator_frame(spark, AWKWARD, 0, 600, 2)
    phase2 = df.where("offset between 3 and 5").agg(F.max("key")).first()[0]
    assert phase2 < 5
    assert df.where("offset >= 6").agg(F.max("key")).first()[0] >= 5  # back to 10 keys


def test_no_drift_across_many_phases():
    # 3.25 rows per 1 s phase: phase boundaries fall between rows. Exact arithmetic says where
    # each phase's first row lies; rounding must not accumulate over 500 phases.
    rate = Fraction(13, 4)  # 3.25, exactly
    params = Generator(rate=3.25, phases=tuple(Phase(duration="1s") for _ in range(500)))
    for k in range(0, 500, 7):
        first = math.ceil(k * rate)
        exact_us = k * 10**6 + (first - k * rate) * 10**6 / rate
        assert generator_event_time_ms(params, first) == START_MS + math.floor(exact_us / 1000)


def test_event_time_is_monotone_and_paced():
    params = Generator(rate=1000, phases=(Phase(duration="1s"), Phase(duration="1s", rate=10)))
    times = [generator_event_time_ms(params, o) for o in range(1100)]
    assert times == sorted(times)
    assert generator_available(params, 1.0) == 1001
    assert generator_available(params, 2.0) == 1011  # then ten rows a second
    assert generator_available(params, 3.0) == 1021  # the last phase continues
    assert generator_available(params, -1.0) == 0
    assert generator_available(params.model_copy(update={"unpaced": True}), 0) == UNPACED_AVAILABLE


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.5, 5000),
    phases=st.lists(st.tuples(st.integers(1, 3000), st.none() | st.floats(0.5, 5000)), max_size=4),
    elapsed_ms=st.integers(0, 8000),
)
def test_available_counts_the_offsets_whose_time_has_come(rate, phases, elapsed_ms):
    params = Generator(rate=rate, phases=tuple(Phase(duration=d, rate=r) for d, r in phases))
    n = generator_available(params, elapsed_ms / 1000)
    now_ms = START_MS + elapsed_ms
    # Event times are in µs; at ms resolution the count is pinned down to this sandwich.
    assert generator_event_time_ms(params, n) >= now_ms
    if n > 0:
        assert generator_event_time_ms(params, n - 1) <= now_ms


# --------------------------------------------------------------------------- keys


@given(st.integers(1, 5000))
def test_rank_to_key_is_a_bijection(keys):
    m = spread_multiplier(keys)
    assert math.gcd(m, keys) == 1
    if keys <= 500:
        assert sorted((r * m) % keys for r in range(keys)) == list(range(keys))


def test_skew_concentrates_keys(spark):
    tops = []
    for skew in (0.0, 0.8, 1.2, 2.0):
        counts = _key_counts(generator_frame(spark, Generator(keys=100, skew=skew), 0, 20_000, 2))
        top = counts.most_common(1)[0][1] / 20_000
        # The discrete Zipf law's top share is 1 / H(100, skew); the midpoint approximation
        # stays within a tenth of it (it overweights the very top slightly at high skew).
        expected = 1 / sum(k**-skew for k in range(1, 101))
        assert expected * 0.85 <= top <= expected * 1.2, (skew, top, expected)
        tops.append(top)
    assert tops == sorted(tops)
    assert tops[0] < 0.015  # uniform: 1 %, plus sampling noise


def test_hot_shift_chooses_the_hottest_key(spark):
    params = Generator(
        rate=1000,
        keys=50,
        skew=1.5,
        phases=(Phase(duration="5s"), Phase(duration="5s", hot_shift=57)),
    )
    first = _key_counts(generator_frame(spark, params, 0, 5000, 2))
    second = _key_counts(generator_frame(spark, params, 5000, 10_000, 2))
    assert first.most_common(1)[0][0] == 0
    assert second.most_common(1)[0][0] == 57 % 50
    # The next hottest keys are scattered, not neighbours of the hottest.
    runner_up = second.most_common(2)[1][0]
    assert abs(runner_up - 7) > 1


def test_a_frame_built_once_computes_a_small_slice_in_one_task_and_a_large_one_in_several(spark, monkeypatch):
    """The frame whose tasks take the slice when they run has one task for a small slice (a
    second would cost more to start than its rows) and one per partition for a larger one; the
    two are different keys, so the engine keeps a frame of each. Both compute exactly the slice."""
    from eddyline.api.sources import SourceSpec
    from eddyline.io import sources
    from eddyline.io.sources import make_source, slice_properties

    monkeypatch.setattr(sources, "ONE_TASK_ROWS", 100)
    gen = {"rate": 1000, "keys": 10, "seed": 3}
    src = make_source(SourceSpec.model_validate({"name": "g", "generator": gen}))
    small, large = {"start": 0, "end": 100}, {"start": 100, "end": 1000}
    assert src.run_time_key(small) != src.run_time_key(large)
    try:
        for planned, tasks in ((small, 1), (large, 3)):
            src.run_time_key(planned)
            df = src.frames(spark, None, 3).data
            for key, value in slice_properties({"g": planned}).items():
                spark.sparkContext.setLocalProperty(key, value)
            assert df.rdd.getNumPartitions() == tasks
            want = generator_frame(spark, Generator(**gen), planned["start"], planned["end"], 1)
            assert _rows(df.select(*want.columns)) == _rows(want)
    finally:
        for key in slice_properties({"g": small}):
            spark.sparkContext.setLocalProperty(key, None)


@pytest.mark.parametrize("params", [
    Generator(rate=1000, keys=100_000, seed=3, start_time=START),
    Generator(rate=5000, keys=1_000, skew=1.2, seed=11, start_time=START),
    Generator(rate=200, keys=50, skew=1.0, seed=5, start_time=START),
    AWKWARD.model_copy(update={"start_time": START}),
], ids=["uniform", "skewed", "skew-one", "phases"])
def test_rows_computed_without_spark_are_the_rows_spark_computes(spark, params: Generator) -> None:
    """What a resident epoch reads (generator_arrow) equals the Spark frame, value for value."""
    from eddyline.io.generator import generator_arrow

    ours = generator_arrow(params, 100, 20_100)
    theirs = generator_frame(spark, params, 100, 20_100, 2).toArrow()
    assert ours.column_names == theirs.column_names
    for name in ours.column_names:
        assert ours.column(name).to_pylist() == theirs.column(name).to_pylist(), name
