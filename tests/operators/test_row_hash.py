"""Spark's ``xxhash64`` over a row's columns in numpy (:func:`eddyline.hashing.spark_xxhash64_of_columns`),
value for value against Spark itself, on every column type the engine's sources give, nulls in each:
resident lanes shed the rows a per-epoch job sheds by this hash."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest

from eddyline.hashing import hashable, spark_xxhash64_of_columns

D = decimal.Decimal
COLUMNS = {  # Arrow type, values (None: NULL); extremes, signs, -0.0, NaN, empty strings
    "b": (pa.bool_(), [True, False, None, True]),
    "i8": (pa.int8(), [-128, 127, None, 0]),
    "i16": (pa.int16(), [-32768, 32767, -1, None]),
    "i32": (pa.int32(), [-(2**31), 2**31 - 1, None, 7]),
    "i64": (pa.int64(), [-(2**63), 2**63 - 1, 0, None]),
    "f32": (pa.float32(), [1.5, -0.0, float("nan"), None]),
    "f64": (pa.float64(), [-0.0, float("inf"), None, float("nan")]),
    "d": (pa.date32(), [dt.date(1969, 12, 31), None, dt.date(2024, 2, 29), dt.date(1, 1, 1)]),
    "ts": (pa.timestamp("us", "UTC"), [dt.datetime(1969, 12, 31, 23, 59, 59, 999999), None,
                                        dt.datetime(2024, 5, 1, 12, 0, 0, 1), dt.datetime(1970, 1, 1)]),
    "dec": (pa.decimal128(10, 2), [D("-12345678.91"), D("0.00"), None, D("99999999.99")]),
    "dec18": (pa.decimal128(18, 0), [D(-(10**18 - 1)), D(1), None, D(10**17)]),
    "dec38": (pa.decimal128(38, 4), [D("-1234567890123456789012345678.9012"), D("0.0001"), None,
                                     D("-0.0128")]),
    "s": (pa.string(), ["", "ABC", None, "Grüße, 世界 🎉" * 5]),
    "bin": (pa.binary(), [b"", b"\x00\xff" * 40, None, b"x"]),
}


def test_every_column_type_hashes_as_spark_hashes_it(spark) -> None:
    table = pa.table({name: pa.array(values, t) for name, (t, values) in COLUMNS.items()})
    # Spark's TIMESTAMP is UTC microseconds whatever the session zone: the values arrive as they are
    df = spark.createDataFrame(table)
    held = df.toArrow().cast(table.schema)  # (Spark holds the values given, -0.0 and NaN too)
    assert [str(c.to_pylist()) for c in held.columns] == [str(c.to_pylist()) for c in table.columns]
    for name in COLUMNS:  # each type on its own, then all of them chained
        want = [r[0] for r in df.selectExpr(f"xxhash64(`{name}`)").collect()]
        assert spark_xxhash64_of_columns(table.column(name)).tolist() == want, name
    want = [r[0] for r in df.selectExpr(f"xxhash64({', '.join(f'`{c}`' for c in COLUMNS)})").collect()]
    assert spark_xxhash64_of_columns(*table.columns).tolist() == want
    # all-null rows and an empty table
    nulls = spark.createDataFrame([(None, None)], "a bigint, s string")
    assert spark_xxhash64_of_columns(pa.array([None], pa.int64()), pa.array([None], pa.string())).tolist() == [
        nulls.selectExpr("xxhash64(a, s)").collect()[0][0]]
    assert spark_xxhash64_of_columns(table.slice(0, 0).column("s")).tolist() == []


def test_generated_rows_hash_as_spark_hashes_them(spark) -> None:
    """Many random values of the numeric types (the bit patterns of doubles included)."""
    rng = np.random.default_rng(5)
    n = 2000
    table = pa.table({
        "i": pa.array(rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)),
        "l": pa.array(rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)),
        "f": pa.array(rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)),
        "v": pa.array(rng.standard_normal(n).astype(np.float32)),
    })
    df = spark.createDataFrame(table)
    want = [r[0] for r in df.selectExpr("xxhash64(i, l, f, v)").collect()]
    assert spark_xxhash64_of_columns(*table.columns).tolist() == want


def test_types_spark_hashes_by_rules_not_reproduced_are_refused() -> None:
    for t in (pa.list_(pa.int64()), pa.struct([("a", pa.int64())]), pa.uint32(), pa.map_(pa.string(), pa.int64())):
        assert not hashable(t)
        with pytest.raises(TypeError, match="not reproduced"):
            spark_xxhash64_of_columns(pa.array([], t))


def test_resident_lanes_shed_the_rows_spark_sheds(spark) -> None:
    """:func:`eddyline.runtime.shedding.shed_tables` against the condition a per-epoch job sheds
    by (:func:`eddyline.runtime.shedding.shed_inputs`), on rows of every type: the same rows kept."""
    from eddyline.api.validate import load_spec
    from eddyline.operators.shed import random_keep_sql
    from eddyline.runtime.shedding import shed_tables

    spec = load_spec({
        "name": "shed", "sources": [{"name": "s", "generator": {"rate": 10}}],
        "steps": [{"name": "first", "input": "s", "dedup": {"key": "key", "time": "event_time", "ttl": "1s"}}],
        "sinks": [{"name": "out", "input": "first", "memory": {}, "qos": {"latency": "1s"}}],
        "control": {"overload": {"shedding": "uniform", "shed_sink": {"path": "/tmp/unused"}}}})
    rng = np.random.default_rng(11)
    n = 3000
    base = pa.table({name: pa.array([values[i] for i in rng.integers(0, 4, n)], t) for name, (t, values) in COLUMNS.items()})
    table = base.append_column("id", pa.array(np.arange(n)))
    df = spark.createDataFrame(table)
    for keep, seed in ((0.5, 3), (0.1, 2**40), (0.93, -7)):
        plan = {"keep": [keep], "mode": "random", "seed": seed}
        shed = shed_tables(spec.steps[0], [table], plan, spec.control.overload, 4)
        cond = random_keep_sql(f"xxhash64({', '.join(f'`{c}`' for c in table.column_names)})", keep, seed)
        want = sorted(r[0] for r in df.where(cond).select("id").collect())
        assert sorted(shed.inputs[0].column("id").to_pylist()) == want
        assert shed.observed == {"shed:first:0": {"offered": n, "kept": len(want)}}
        (dropped,) = shed.shed
        assert dropped.column_names[:3] == ["_step", "_input", "_epoch"] and dropped.num_rows == n - len(want)
