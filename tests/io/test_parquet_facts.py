"""A Parquet slice's row count and newest event times, read from the files' footers, are exactly
what observing the rows in Spark would find, or unknown (None) when the footers cannot say."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from eddyline.io.sources import footer_facts

T0 = 1_767_225_600_000  # 2026-01-01 in ms


def footer(table: pa.Table, **kwargs) -> pq.FileMetaData:
    out = io.BytesIO()
    pq.write_table(table, out, **kwargs)
    return pq.read_metadata(io.BytesIO(out.getvalue()))


def ts(values_ms: list[int | None], unit: str = "us", tz: str | None = "UTC") -> pa.Array:
    scale = {"ms": 1, "us": 1000, "ns": 1_000_000}[unit]
    return pa.array([None if v is None else v * scale + (scale - 1) for v in values_ms], pa.timestamp(unit, tz=tz))


def test_rows_and_newest_time_over_files_and_row_groups() -> None:
    a = footer(pa.table({"t": ts([T0 + 5, None, T0 + 1, T0 + 9, T0 + 2])}), row_group_size=2)
    b = footer(pa.table({"t": ts([T0 + 7, T0 + 3], unit="ms")}))
    assert a.num_row_groups == 3
    # microseconds are floored to ms, as the observation's floor(unix_micros / 1000) does
    assert footer_facts([a, b], ["t"]) == {"rows": 7, "max_t:t": T0 + 9}
    assert footer_facts([a, b], []) == {"rows": 7}


def test_a_column_of_nulls_has_no_newest_time() -> None:
    nulls = footer(pa.table({"t": ts([None, None])}))
    assert footer_facts([nulls], ["t"]) == {"rows": 2, "max_t:t": None}


def test_unknown_when_the_footers_cannot_say_exactly() -> None:
    table = pa.table({"t": ts([T0, T0 + 1]), "naive": ts([T0, T0 + 1], tz=None), "nanos": ts([T0, T0], unit="ns"),
                      "n": pa.array([1, 2], pa.int64())})
    meta = footer(table)
    for col in ("naive", "nanos", "n", "missing"):  # not what Spark reads as a UTC TIMESTAMP
        assert footer_facts([meta], ["t", col]) is None, col
    no_stats = footer(table, write_statistics=False)
    assert footer_facts([meta, no_stats], ["t"]) is None
    assert footer_facts([meta, no_stats], []) == {"rows": 4}
    assert footer_facts([], ["t"]) == {"rows": 0, "max_t:t": None}  # no files: no rows
