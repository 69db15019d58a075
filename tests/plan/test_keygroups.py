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
