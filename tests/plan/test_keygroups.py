"""Key groups computed in numpy (the balancer's look-ahead) equal the ones Spark computes."""

from __future__ import annotations

import pyarrow as pa


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
