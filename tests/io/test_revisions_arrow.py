"""A source's revisions weighed in Arrow (resident lanes) as Spark weighs them in a per-epoch job
(eddyline.io.revisions.weighted): the same rows kept with the same weights, and the dead letters
of the others worded alike, byte for byte."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from eddyline.errors import SpecError
from eddyline.io.revisions import arrow_weight_problem, arrow_weighted, weighted
from eddyline.io.sources import Frames

UTC = datetime.UTC


def spark_weighted(spark, table: pa.Table) -> tuple[pa.Table, list[tuple]]:
    frames = weighted(Frames(spark.createDataFrame(table)), "src")
    letters = [tuple(r) for r in frames.dead_letters.collect()] if frames.dead_letters is not None else []
    return frames.data.toArrow(), letters


@pytest.mark.parametrize("weights", [
    pa.array(["+I", "-u", "+U", "delete", "upsert", None, "x" * 60, "Insert"], pa.string()),
    pa.array([1, -1, 3, 0, None, 2**40, -7, 1], pa.int64()),
    pa.array([1.0, -1.0, 2.5, 0.0, None, 1e10, float("nan"), -1.5e-5], pa.float64()),
])
def test_rows_and_dead_letters_are_a_spark_jobs(spark, weights: pa.Array) -> None:
    n = len(weights)
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "small": pa.array([1, None, -3, 4, 5, 6, 7, 8], pa.int32()),
        "name": pa.array(['a "quoted" \\ name', "tab\there", "é ü 中", None, "\x01ctl", "/", "", "nl\n"], pa.string()),
        "flag": pa.array([True, False, None, True, False, True, None, False], pa.bool_()),
        "price": pa.array([1.0, -0.0, 1234567.0, 1e7, 0.001, 1e-4, None, 3.25], pa.float64()),
        "day": pa.array([datetime.date(2026, 1, 1), None, datetime.date(1999, 12, 31)] * 2 + [None, None], pa.date32()),
        "ts": pa.array([datetime.datetime(2026, 1, 1, 0, 0, 2, 123456, tzinfo=UTC), None] * 4, pa.timestamp("us", tz="UTC")),
        ("_op" if pa.types.is_string(weights.type) else "_diff"): weights,
    })
    assert arrow_weight_problem(table.schema, "src") is None
    want_rows, want_letters = spark_weighted(spark, table)
    rows, letters = arrow_weighted(table, "src")
    assert rows.equals(want_rows.cast(rows.schema)) and rows.schema.field("_diff").type == want_rows.schema.field("_diff").type
    assert want_letters and [tuple(r.values()) for r in letters.to_pylist()] == want_letters


def test_what_they_cannot_weigh_or_word_as_spark_is_refused_naming_the_column() -> None:
    both = pa.schema([("a", pa.int64()), ("_op", pa.string()), ("_diff", pa.int64())])
    assert "both _op and _diff" in arrow_weight_problem(both, "s")
    assert "field '_diff' is string" in arrow_weight_problem(pa.schema([("_diff", pa.string())]), "s")
    assert "column 'm' is decimal128(10, 2)" in arrow_weight_problem(
        pa.schema([("m", pa.decimal128(10, 2)), ("_diff", pa.int64())]), "s")
    assert arrow_weight_problem(pa.schema([("m", pa.decimal128(10, 2))]), "s") is None  # no revisions: as it is
    with pytest.raises(SpecError, match="field '_op' is int64"):
        arrow_weighted(pa.table({"_op": pa.array([1], pa.int64())}), "s")
