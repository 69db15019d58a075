"""Stateless steps on Arrow (resident epochs): DuckDB's answers to the Spark SQL of ``filter`` and
``select`` steps are Spark's own, checked against the shared SparkSession on the same rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from eddyline.operators.sqlsteps import SqlStep, SqlStepError, duckdb_expression

ROWS = pa.table({
    "seq": pa.array([1, 2, 3, None, 5], pa.int64()),
    "kind": pa.array(["a", "b", None, "a", "bb"]),
    "price": pa.array([10.5, None, 3.0, 7.25, 0.0]),
    "produced_us": pa.array([1_700_000_000_123_456, 0, -1_000, 86_400_000_000, None], pa.int64()),
})

SELECTS = [
    "seq", "seq * 2 AS twice", "seq % 2 AS odd", "price / 2 AS half", "seq / 2 AS ratio",
    "timestamp_micros(produced_us) AS ts", "timestamp_millis(seq) AS ms",
    "timestamp_micros(produced_us) + INTERVAL 10 SECONDS AS later",
    "upper(kind) AS k", "coalesce(kind, 'none') AS k2", "length(kind) AS n",
    "CASE WHEN price > 5 THEN 'high' ELSE 'low' END AS band",
]
FILTERS = ["kind = 'a'", "price > 5 AND seq IS NOT NULL", "kind IN ('a', 'bb') OR seq >= 3", "NOT (seq > 2)"]


def spark_rows(spark, table: pa.Table, sql: str) -> list[dict]:
    df = spark.createDataFrame(table)
    df.createOrReplaceTempView("input")
    return [r.asDict() for r in spark.sql(sql).collect()]


def duck_rows(spark, table: pa.Table) -> list[dict]:
    # through Spark's own conversion, so both sides give the same Python values
    return [r.asDict() for r in spark.createDataFrame(table).collect()] if table.num_rows else []


@pytest.mark.parametrize("expression", SELECTS)
def test_a_select_gives_what_spark_gives(spark, expression: str) -> None:
    got = SqlStep("s", expressions=(expression,)).run(ROWS)
    assert duck_rows(spark, got) == spark_rows(spark, ROWS, f"SELECT {expression} FROM input")


@pytest.mark.parametrize("condition", FILTERS)
def test_a_filter_keeps_the_rows_spark_keeps(spark, condition: str) -> None:
    got = SqlStep("f", condition=condition).run(ROWS)
    assert duck_rows(spark, got) == spark_rows(spark, ROWS, f"SELECT * FROM input WHERE {condition}")


def test_timestamps_come_out_as_utc_instants_as_spark_hands_them_to_python() -> None:
    got = SqlStep("s", expressions=("timestamp_micros(produced_us) AS ts",)).run(ROWS)
    assert got.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert duckdb_expression("timestamp_micros(x)") == "MAKE_TIMESTAMP(x)"


def test_what_duckdb_cannot_run_is_refused_naming_the_step_and_the_expression() -> None:
    with pytest.raises(SqlStepError, match=r"step 'odd': DuckDB cannot run 'bround\(price, 0\) AS p'"):
        SqlStep("odd", expressions=("bround(price, 0) AS p",)).check(ROWS.schema)
    with pytest.raises(SqlStepError, match="step 'bad': 'seq >' is not Spark SQL"):
        SqlStep("bad", condition="seq >")
