"""Key groups computed in numpy (the balancer's look-ahead) equal the ones Spark computes."""

from __future__ import annotations

import pyarrow as pa
import pytest


def test_key_group_counts_in_numpy_equal_the_key_groups_spark_computes(spark):
    """The look-ahead's key groups (numpy) are the epoch's (Spark SQL from the compiler), for one
    and two BIGINT key columns with nulls; other key types are not guessed at."""
    import numpy as np

    from eddyline.plan.keygroups import key_group_counts, key_group_sql

    rng = np.random.default_rng(5)
    n, groups = 3000, 128
    table = pa.table({
        "a": pa.array(rng.integers(-10**12, 10**12, n), pa.int64(), mask=rng.random(n) < 0.05),
        "b": pa.array(rng.integers(0, 50, n), pa.int64(), mask=rng.random(n) < 0.1),
        "s": pa.array([str(x) for x in rng.integers(0, 9, n)]),
    })
    df = spark.createDataFrame(table.to_pandas().astype({"a": "Int64", "b": "Int64"}))
    for keys in (("a",), ("b",), ("a", "b")):  # b repeats: 50 values and null
        sql = key_group_sql(keys, groups)
        spark_counts = np.zeros(groups, dtype=np.int64)
        for row in df.selectExpr(f"{sql} AS kg").groupBy("kg").count().collect():
            spark_counts[row.kg] = row["count"]
        ours = key_group_counts(table, keys, groups)
        assert ours is not None and ours.sum() == n
        assert np.array_equal(ours, spark_counts), keys
    assert key_group_counts(table, ("s",), groups) is None


def test_each_rows_key_group_of_bigint_and_string_keys_is_the_one_spark_computes(spark):
    """What resident epochs route by (key_groups_of) against Spark's key_group_sql, row by row:
    strings empty, non-ASCII and null, BIGINTs null and negative, one key and two."""
    from eddyline.plan.keygroups import key_group_sql, key_groups_of

    table = pa.table({
        "s": pa.array(["", "a", "héllo wörld", None, "x" * 70, "auction-17"] * 50, pa.string()),
        "n": pa.array([0, -1, None, 2**40, 7, -(2**62)] * 50, pa.int64()),
        "i": pa.array(range(300), pa.int64()),
        "t": pa.array([1_700_000_000_123, None, 0, -5, 86_400_000, 7] * 50, pa.timestamp("ms", tz="UTC")),
    })
    df = spark.createDataFrame(table)
    for keys in (("s",), ("n", "s"), ("s", "i"), ("n",), ("i", "t")):
        expected = [r[0] for r in df.selectExpr(f"{key_group_sql(keys, 128)} AS kg").collect()]
        assert key_groups_of(table, keys, 128).tolist() == expected, keys
    with pytest.raises(TypeError, match="int32"):
        key_groups_of(pa.table({"k": pa.array([1], pa.int32())}), ("k",), 128)


def test_a_whole_rows_hash_of_every_plain_type_is_the_one_spark_computes(spark):
    """What a split key group's rows choose their home fragment by on resident lanes
    (spark_xxhash64_of_values) against Spark's xxhash64 of the same columns, row by row: every
    type a row may carry, nulls in each, -0.0 and NaN, TINYINT and SMALLINT sign-extended."""
    import datetime

    from eddyline.hashing import hashes_as_spark, spark_xxhash64_of_values

    n = 12
    table = pa.table({
        "side": pa.array([0, 1, -3, 127, None, -128] * 2, pa.int8()),
        "small": pa.array([0, -1, 300, None, 32767, -32768] * 2, pa.int16()),
        "i": pa.array([0, -1, 2**31 - 1, -(2**31), None, 42] * 2, pa.int32()),
        "n": pa.array([0, -1, None, 2**40, 7, -(2**62)] * 2, pa.int64()),
        "f": pa.array([0.0, -0.0, float("nan"), 1.5, None, -3.25e30] * 2, pa.float32()),
        "d": pa.array([0.0, -0.0, float("nan"), float("inf"), None, 1e-300] * 2, pa.float64()),
        "b": pa.array([True, False, None] * 4, pa.bool_()),
        "day": pa.array([datetime.date(2026, 1, 1), None, datetime.date(1969, 12, 31)] * 4, pa.date32()),
        "t": pa.array([1_700_000_000_123_456, None, -5] * 4, pa.timestamp("us", tz="UTC")),
        "s": pa.array(["", "héllo", None, "x" * 70] * 3, pa.string()),
        "bin": pa.array([b"", b"\x00\xff", None, b"abc"] * 3, pa.binary()),
    })
    assert table.num_rows == n and all(hashes_as_spark(f.type) for f in table.schema)
    df = spark.createDataFrame(table)
    for columns in [(c,) for c in table.column_names] + [tuple(table.column_names), ("side", "s", "d", "i")]:
        expected = [r[0] for r in df.selectExpr(f"xxhash64({', '.join(columns)}) AS h").collect()]
        assert spark_xxhash64_of_values(*[table.column(c) for c in columns]).tolist() == expected, columns
    assert not hashes_as_spark(pa.decimal128(10, 2)) and not hashes_as_spark(pa.list_(pa.int64()))
