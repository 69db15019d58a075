"""The files source: the Parquet schema Spark inferred is reused only while the files' footers match;
tasks share a text slice's bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline.api.sources import SourceSpec
from eddyline.io.files import FilesSource
from eddyline.io.files.slices import _line_at, _records_between, _task_pieces


def _source(path: str) -> FilesSource:
    return FilesSource(SourceSpec.model_validate({"name": "events", "files": {"path": path, "format": "parquet"}}))


def _write(path, name: str, table: pa.Table) -> None:
    pq.write_table(table, str(path / name))


def test_same_footers_reuse_the_schema_and_a_new_footer_is_inferred_again(spark, tmp_path):
    _write(tmp_path, "001.parquet", pa.table({"k": [1, 2], "v": [10, 20]}))
    _write(tmp_path, "002.parquet", pa.table({"k": [3], "v": [30]}))
    _write(tmp_path, "003.parquet", pa.table({"k": [4], "v": [40], "note": ["new column"]}))
    src = _source(str(tmp_path))

    first = src.frames(spark, {"files": ["001.parquet"]}, 2).data
    assert sorted(first.collect()) == [(1, 10), (2, 20)]
    assert src._schemas is not None
    cached = src._schemas[1]

    # Same footer: read with the kept schema (and the rows are right).
    second = src.frames(spark, {"files": ["002.parquet"]}, 2).data
    assert second.schema == cached
    assert second.collect() == [(3, 30)]

    # A file with another footer must not be read with the old schema: its new column would be lost.
    third = src.frames(spark, {"files": ["003.parquet"]}, 2).data
    assert third.columns == ["k", "v", "note"]
    assert third.collect() == [(4, 40, "new column")]

    # Mixed footers in one epoch: Spark infers (and the kept schema is left alone).
    mixed = src.frames(spark, {"files": ["002.parquet", "003.parquet"]}, 2).data
    assert sorted(r.k for r in mixed.collect()) == [3, 4]


def test_peek_reads_the_key_columns_of_the_planned_parquet_files_only(tmp_path):
    _write(tmp_path, "001.parquet", pa.table({"k": [1, 2], "v": [10, 20]}))
    _write(tmp_path, "002.parquet", pa.table({"k": [3], "v": [30]}))
    src = _source(str(tmp_path))
    got = src.peek({"files": ["002.parquet", "001.parquet"]}, ("k",))
    assert got.column_names == ["k"] and sorted(got.column("k").to_pylist()) == [1, 2, 3]
    assert src.peek({"files": []}, ("k",)) is None
    assert src.peek({"files": ["001.parquet"]}, ("missing",)) is None  # Spark reports it when the epoch runs
    csv = FilesSource(SourceSpec.model_validate(
        {"name": "e", "files": {"path": str(tmp_path), "format": "csv", "schema": "k BIGINT, v BIGINT"}}))
    assert csv.peek({"files": ["001.parquet"]}, ("k",)) is None


# ------------------------------------------------------------------ Parquet read in the tasks
def _typed(n: int, offset: int) -> pa.Table:
    """One row per i of a column of every type the tasks read themselves."""
    import datetime as dt
    import decimal

    ids = list(range(offset, offset + n))
    return pa.table({
        "Id": pa.array(ids, pa.int64()),
        "small": pa.array([i % 100 for i in ids], pa.int8()),
        "price": pa.array([decimal.Decimal(i) / 100 for i in ids], pa.decimal128(12, 2)),
        "at_ms": pa.array([1_767_225_600_000 + i for i in ids], pa.timestamp("ms", tz="UTC")),
        "at_us": pa.array([1_767_225_600_000_000 + i for i in ids], pa.timestamp("us", tz="UTC")),
        "local": pa.array([1_767_225_600_000_000 + i for i in ids], pa.timestamp("us")),
        "day": pa.array([dt.date(2026, 1, 1 + i % 28) for i in ids], pa.date32()),
        "name": pa.array([None if i % 3 == 0 else f"n{i}" for i in ids], pa.string()),
        "blob": pa.array([bytes([i % 256]) for i in ids], pa.binary()),
        "tags": pa.array([[i, i + 1] for i in ids], pa.list_(pa.int32())),
        "attrs": pa.array([[("k", float(i))] for i in ids], pa.map_(pa.string(), pa.float64())),
        "person": pa.array([{"city": f"c{i % 5}", "age": i % 90} for i in ids]),
    })


def _in_tasks(spark, src: FilesSource, planned: dict, columns=None):
    """The schema and rows of the frame that reads its slice in the tasks, given ``planned``."""
    from eddyline.io.sources import slice_properties

    for key, value in slice_properties({src.name: planned}).items():
        spark.sparkContext.setLocalProperty(key, value)
    try:
        df = src.frames(spark, None, 2, columns=columns).data
        return df.schema, df.collect()
    finally:
        for key in slice_properties({src.name: planned}):
            spark.sparkContext.setLocalProperty(key, None)


def test_parquet_read_in_the_tasks_gives_what_spark_reads(spark, tmp_path):
    for k in range(3):
        _write(tmp_path, f"{k:03d}.parquet", _typed(7 + k, 100 * k))
    src = _source(str(tmp_path))
    planned = {"files": ["000.parquet", "001.parquet", "002.parquet"]}
    key = src.run_time_key(planned)
    assert key is not None
    schema, rows = _in_tasks(spark, src, planned)
    want = spark.read.parquet(*[str(tmp_path / n) for n in planned["files"]])
    assert schema == want.schema
    assert sorted(rows) == sorted(want.collect())
    # only the columns the network reads (lower-case, as the spec's columns are)
    schema, rows = _in_tasks(spark, src, planned, columns=frozenset({"id", "at_us"}))
    assert schema.names == ["Id", "at_us"]
    assert sorted(rows) == sorted(want.select("Id", "at_us").collect())


def test_one_frame_reads_every_slice_of_the_same_footers(spark, tmp_path):
    _write(tmp_path, "001.parquet", pa.table({"k": [1, 2], "v": [10, 20]}))
    _write(tmp_path, "002.parquet", pa.table({"k": [3], "v": [30]}))
    _write(tmp_path, "003.parquet", pa.table({"k": [4], "v": [40], "note": ["new column"]}))
    src = _source(str(tmp_path))
    first = src.run_time_key({"files": ["001.parquet"]})
    from eddyline.io.sources import slice_properties

    df = src.frames(spark, None, 2).data  # built once
    for names, rows in ((["001.parquet"], [(1, 10), (2, 20)]), (["002.parquet"], [(3, 30)]), ([], [])):
        assert src.run_time_key({"files": names}) == first  # an empty slice keeps the frame in use
        for key, value in slice_properties({src.name: {"files": names}}).items():
            spark.sparkContext.setLocalProperty(key, value)
        assert sorted(df.collect()) == rows
    assert df.rdd.getNumPartitions() == 1  # a slice of one file: one task
    both = {"files": ["001.parquet", "002.parquet"]}
    assert src.run_time_key(both) not in (None, first)  # more files: a task per partition
    df = src.frames(spark, None, 2).data
    for key, value in slice_properties({src.name: both}).items():
        spark.sparkContext.setLocalProperty(key, value)
    assert df.rdd.getNumPartitions() == 2 and sorted(df.collect()) == [(1, 10), (2, 20), (3, 30)]
    # another footer is another key (its frame has the new column); mixed footers have none
    assert src.run_time_key({"files": ["003.parquet"]}) not in (None, first)
    assert src.run_time_key({"files": ["002.parquet", "003.parquet"]}) is None
    assert src.known({"files": ["001.parquet", "002.parquet"]}, []) == {"rows": 3}


def test_types_the_tasks_do_not_read_go_to_spark(spark, tmp_path):
    _write(tmp_path, "001.parquet", pa.table({"t": pa.array([1, 2], pa.timestamp("ns", tz="UTC"))}))
    _write(tmp_path, "002.parquet", pa.table({"u": pa.array([1, 2], pa.uint32())}))
    src = _source(str(tmp_path))
    for name in ("001.parquet", "002.parquet"):
        assert src.run_time_key({"files": [name]}) is None
    assert src.frames(spark, {"files": ["002.parquet"]}, 2).data.collect() == [(1,), (2,)]


def test_a_declared_schema_casts_what_the_tasks_read(spark, tmp_path):
    _write(tmp_path, "001.parquet", pa.table({"k": pa.array([1, 2], pa.int32()), "v": ["1.5", "-2"], "extra": [0, 0]}))
    src = FilesSource(SourceSpec.model_validate(
        {"name": "events", "files": {"path": str(tmp_path), "format": "parquet", "schema": "k BIGINT, v DOUBLE"}}))
    planned = {"files": ["001.parquet"]}
    assert src.run_time_key(planned) is not None and src.known(planned, []) is None  # the footers describe the files
    schema, rows = _in_tasks(spark, src, planned)
    assert schema.simpleString() == "struct<k:bigint,v:double>"
    assert sorted(rows, key=str) == sorted(src.frames(spark, planned, 2).data.collect(), key=str)
    assert sorted(rows, key=str) == [(1, 1.5), (2, -2.0)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.one_of(st.text("ab", min_size=1, max_size=40), st.just(""), st.just("x" * 70_000)), max_size=12),
             min_size=1, max_size=5),
    st.integers(1, 4), st.booleans(), st.booleans(),
)
def test_tasks_share_a_text_slice_s_bytes_and_every_line_is_read_once_with_its_number(files, tasks, ended, crlf):
    """Pieces of a slice's bytes, whatever the cut (inside a line, at a line break, in a blank
    line, in a line longer than a read): each file's pieces, task after task, are the file's
    bytes exactly, each starting at a line, with that line's number; no task takes more than
    its share and a line."""
    import tempfile

    fs = pafs.LocalFileSystem()
    eol = "\r\n" if crlf else "\n"
    with tempfile.TemporaryDirectory() as d:
        texts = {f"{i:03d}.txt": (eol.join(lines) + (eol if ended and lines else "")).encode()
                 for i, lines in enumerate(files)}
        for name, text in texts.items():
            (Path(d) / name).write_bytes(text)
        planned = {"files": list(texts), "sizes": [len(t) for t in texts.values()]}
        read: dict[str, list[bytes]] = {n: [] for n in texts}
        for task in range(tasks):
            took = 0
            for name, lo, hi in _task_pieces(planned, tasks, task):
                with fs.open_input_file(f"{d}/{name}") as f:
                    begin, text = _records_between(f, lo, hi)
                if not text:
                    continue
                before = b"".join(read[name])
                assert begin == len(before)  # where the file's last piece ended
                assert _line_at(fs, f"{d}/{name}", begin) == before.count(b"\n") + 1
                read[name].append(text)
                took += len(text)
            longest = max((len(x) + 2 for t in texts.values() for x in t.split(b"\n")), default=0)
            assert took <= sum(planned["sizes"]) // tasks + longest
        assert {n: b"".join(parts) for n, parts in read.items()} == texts
        # a plan logged without sizes: every tasks-th file, whole
        assert _task_pieces({"files": list(texts)}, tasks, 0) == [(n, 0, None) for n in list(texts)[::tasks]]


def test_a_text_slice_split_between_tasks_keeps_every_row_and_dead_letter_line(spark, tmp_path):
    """Two JSON files on two tasks: each task takes half the bytes, so one file is cut in two;
    the rows are all there once, and a bad record after the cut keeps its line in the file."""
    rows = [{"k": i, "v": f"r{i}"} for i in range(300)]
    lines = [json.dumps(r) for r in rows]
    lines[250] = '{"k": "oops", "v": "x"}'
    (tmp_path / "001.json").write_text("\n".join(lines[:100]) + "\n")
    (tmp_path / "002.json").write_text("\n".join(lines[100:]) + "\n")
    src = FilesSource(SourceSpec.model_validate(
        {"name": "events", "files": {"path": str(tmp_path), "format": "json", "schema": "k long, v string"}}))
    planned = src.plan(0, 0.0)
    assert planned["files"] == ["001.json", "002.json"] and len(planned["sizes"]) == 2
    assert any(hi is not None for t in range(2) for _, _, hi in _task_pieces(planned, 2, t))  # a file is cut
    frames = src.frames(spark, planned, 2)
    assert sorted(frames.data.collect()) == sorted((r["k"], r["v"]) for i, r in enumerate(rows) if i != 250)
    assert [(d.file, d.line, d.reason) for d in frames.dead_letters.collect()] == [
        ("002.json", 151, "field 'k': expected bigint, got oops")]


def test_csv_files_with_a_header_shared_by_any_number_of_tasks_give_the_same_rows_and_dead_letters(tmp_path):
    """Each file's header is skipped by the task whose piece starts the file, and only there;
    a bad line keeps its line number in its file, however the files are cut."""
    from eddyline.io.files.slices import text_files
    from eddyline.io.sources import EpochSlice
    from eddyline.io.textrecords import arrow_schema

    schema = arrow_schema("k long, v string")
    lines = [f"{i},r{i}" for i in range(120)]
    lines[77] = "x,bad"
    (tmp_path / "a.csv").write_text("k,v\n" + "\n".join(lines[:50]) + "\n")
    (tmp_path / "b.csv").write_text("k,v\n" + "\n".join(lines[50:]) + "\n")
    sizes = [(tmp_path / n).stat().st_size for n in ("a.csv", "b.csv")]
    for tasks in range(1, 5):
        slice_ = EpochSlice("s", {"files": ["a.csv", "b.csv"], "sizes": sizes})
        task_numbers = iter([pa.record_batch([pa.array(list(range(tasks)))], names=["id"])])
        rows = pa.Table.from_batches(list(text_files("csv", True, str(tmp_path), slice_, tasks, schema, ("k", "v"),
                                                      task_numbers)))
        good = [(k, v) for k, v, r in zip(*(rows.column(c).to_pylist() for c in ("k", "v", "_reason")), strict=True)
                if r is None]
        assert good == [(i, f"r{i}") for i in range(120) if i != 77]
        bad = [(f, n) for f, n, r in zip(*(rows.column(c).to_pylist() for c in ("_file", "_line", "_reason")),
                                         strict=True) if r is not None]
        assert bad == [("b.csv", 29)]  # the header, then lines 50..76 of the data: line 29 of b.csv


def test_parquet_that_feeds_no_stateful_step_is_read_by_sparks_reader(spark, tmp_path):
    """Without lanes behind it, a Parquet slice is planned with Spark's reader each epoch; with
    a stateful step behind it, it is read in the tasks by a frame kept across epochs. The
    compiler says which from the network."""
    from eddyline.api.validate import load_spec
    from eddyline.io.sources import make_source
    from eddyline.runtime.compile import EpochCompiler

    for k in range(2):
        _write(tmp_path, f"{k:03d}.parquet", pa.table({"k": [k, k + 10], "v": [1.5, 2.5]}))
    planned = {"files": ["000.parquet", "001.parquet"]}
    spec = load_spec({
        "name": "readers", "trigger": 0, "lanes": 2,
        "sources": [{"name": "counted", "files": {"path": str(tmp_path), "format": "parquet"}},
                    {"name": "copied", "files": {"path": str(tmp_path), "format": "parquet"}},
                    {"name": "text", "files": {"path": str(tmp_path / "text"), "format": "json", "schema": "k bigint"}}],
        "steps": [{"name": "n", "input": "counted", "aggregate": {"key": "k", "aggregates": {"c": "count(*)"}}},
                  {"name": "picked", "input": "copied", "select": ["k", "v * 2 AS w"]}],
        "sinks": [{"name": "a", "input": "n", "console": {}}, {"name": "b", "input": "picked", "console": {}},
                  {"name": "c", "input": "text", "console": {}}],
    })
    sources = {s.name: make_source(s) for s in spec.sources}
    EpochCompiler(spark, spec, sources, str(tmp_path / "ckpt"))
    assert [sources[n].feeds_state for n in ("counted", "copied", "text")] == [True, False, False]
    assert sources["counted"].run_time_key(planned) is not None
    assert sources["copied"].run_time_key(planned) is None
    assert sources["text"].run_time_key({"files": ["x.json"]}) is not None  # Arrow's reader either way
    df = sources["copied"].frames(spark, planned, 2).data
    assert "FileScan parquet" in df._jdf.queryExecution().executedPlan().toString()
    assert sorted(df.collect()) == [(0, 1.5), (1, 1.5), (10, 2.5), (11, 2.5)]


def test_parquet_on_the_store_that_pyarrow_would_read_otherwise_than_spark_is_refused_naming_the_column(s3):
    """On an object store only Eddyline's reader opens the files; a slice it cannot read as Spark
    would (here nanosecond timestamps) is refused before the epoch runs, naming the column."""
    import uuid

    import pytest

    from eddyline import objectfs
    from eddyline.errors import SourceError

    path = f"{s3.bucket(f'src-{uuid.uuid4().hex[:8]}')}/events"
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "t": pa.array([1, 2], pa.timestamp("ns"))})
    with objectfs.filesystem().open_output_stream(f"{path.removeprefix('s3://')}/a.parquet") as out:
        pq.write_table(table, out)
    src = _source(path)
    with pytest.raises(SourceError, match=r"source 'events'.*columns \['t \(timestamp\[ns\]\)'\] are not"):
        src.run_time_key(src.plan(0, 0.0))
