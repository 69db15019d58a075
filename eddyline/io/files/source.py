"""The ``files`` source: a directory of Parquet, JSON-lines or CSV files, read in name order.

Offsets are positions in the name-sorted file list, and the plan records the file names, so
files added later never change an epoch already planned. A malformed JSON or CSV line becomes a
dead letter (raw text, reason, file, line) instead of failing the epoch. Text files of a flat
schema are decoded by Arrow's readers in the Spark tasks (:mod:`.slices`), faster than Spark's
own; nested JSON, and CSV with a type Arrow's reader does not take, are parsed in Spark
(:mod:`eddyline.io.records`). Parquet is read with pyarrow in the tasks too, by a frame kept
while the files' footer schema stays, since Spark's reader would need a new frame (and new
frames behind it) every epoch; a slice of mixed footers, or of a type pyarrow and Spark read
differently, goes to Spark's reader.

A directory on an object store (``s3://``) is read by those same readers in the tasks, never by
Spark's (PySpark has no S3 connector): Parquet files of plain types sharing one schema in each
epoch, and the lines of text files that Spark then parses (nested JSON, CSV types Arrow's reader
does not take).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from eddyline import objectstore
from eddyline.api.sources import SOURCES
from eddyline.api.units import Files
from eddyline.errors import SourceError
from eddyline.io.files.slices import lines, parquet_files, text_files, with_store
from eddyline.io.records import ddl_struct, decode, split_decoded
from eddyline.io.sources import (
    ArrowSlice,
    BadCounter,
    EpochSlice,
    Frames,
    Source,
    SourceKind,
    arrow_decoded,
    footer_facts,
)
from eddyline.io.textrecords import arrow_schema, shipped
from eddyline.storage import filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from eddyline.api.sources import SourceSpec


class FilesSource(Source):
    _schemas: tuple[Any, Any] | None = None  # (footer schema, the Spark schema inferred from it)
    #: the last Parquet slice's files and their footers (None: not all readable here)
    _slice: tuple[tuple[str, ...], list[Any] | None] = ((), [])
    #: the footer schema of the frame whose tasks read Parquet slices when they run, and a file
    #: that has it (Spark infers the frame's schema from it)
    _run_time: tuple[pa.Schema, str] | None = None

    @property
    def params(self) -> Files:
        return self.spec.params

    @functools.cached_property
    def _on_store(self) -> bool:
        """Whether the directory is on an object store, which only Eddyline's readers open."""
        return objectstore.is_object_store(self.params.path)

    def _listing(self) -> dict[str, int]:
        """The directory's files in name order, with their sizes."""
        fs, base = filesystem(self.params.path)
        try:
            infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=False))
        except (FileNotFoundError, OSError) as e:
            raise SourceError(f"source '{self.name}': cannot list {self.params.path!r}: {e}") from e
        files = {
            i.base_name: i.size
            for i in infos
            if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_"))
        }
        return dict(sorted(files.items()))

    def available(self, elapsed_s: float) -> int:
        return len(self._listing())

    def _footers(self, names: list[str]) -> list[Any] | None:
        """The Parquet footers of ``names`` (read with pyarrow, well under a millisecond a file),
        None if any cannot be read here (Spark then reads the files and reports what is wrong)."""
        if self._slice[0] != tuple(names):
            fs, base = filesystem(self.params.path)
            try:
                footers: list[Any] | None = [_footer(fs, f"{base}/{n}") for n in names]
            except (OSError, ValueError, pa.ArrowException):
                footers = None
            self._slice = (tuple(names), footers)
        return self._slice[1]

    def _spark_schema(self, spark: SparkSession, schema: pa.Schema, path: str) -> Any:
        """The schema Spark reads Parquet files of footer schema ``schema`` with, inferred from
        ``path`` (a JVM round of 60-120 ms) and kept while the footers stay the same."""
        if self._schemas is None or not self._schemas[0].equals(schema):
            self._schemas = (schema, _as_spark_reads(schema) if self._on_store else spark.read.parquet(path).schema)
        return self._schemas[1]

    def _read_parquet(self, spark: SparkSession, names: list[str]) -> DataFrame:
        """The files ``names`` read by Spark's reader, in a frame built for them (slices of mixed
        footers, or of types :func:`_plain` does not take). Spark infers their schema unless all
        have the footer schema it was last inferred for."""
        _, base = filesystem(self.params.path)
        paths = [f"{base}/{n}" for n in names]
        footers = self._footers(names)
        schemas = [_schema(f) for f in footers] if footers is not None else []
        if schemas and all(x.equals(schemas[0]) for x in schemas[1:]):
            return spark.read.schema(self._spark_schema(spark, schemas[0], paths[0])).parquet(*paths)
        return spark.read.parquet(*paths)

    def run_time_key(self, planned: dict[str, Any]) -> Hashable | None:
        """Text: always. Parquet: while the slice's files all have one footer schema of types
        :func:`_plain` takes (the key), read with pyarrow in the tasks. A frame built for the
        files (Spark's reader) would be a new frame every epoch, and so would every frame
        behind it, planned again at 100-250 ms an epoch (docs/perf-notes.md). A slice of one
        file has a key of its own: its frame has one task (the others would read nothing).

        Parquet that feeds no stateful step (:attr:`feeds_state`) is read by Spark's reader,
        planned every epoch: only stateless steps are planned again behind it, and Spark's
        vectorised reader keeps the rows in the JVM, where pyarrow in a Python worker hands
        them over (docs/perf-notes.md, "Parquet without state behind it")."""
        if self.params.format == "parquet" and not self.feeds_state and not self._on_store:
            return None
        if planned.get("files"):  # an empty slice: the frame in use reads nothing
            self._one_task = len(planned["files"]) == 1
        key = self._frame_key(planned)
        if key is None and self._on_store and self.params.format == "parquet" and planned.get("files"):
            raise SourceError(
                f"source '{self.name}': the Parquet files {planned['files'][:3]} on the object store are read by "
                "Eddyline's reader, which needs the files of one epoch to share one schema of plain types "
                f"(integers, floats, decimals, strings, binary, dates, ms/us timestamps, lists, maps, structs); "
                f"{self._unplain(planned['files'])}")
        return None if key is None else (key, self._one_task)

    def _unplain(self, names: list[str]) -> str:
        footers = self._footers(names)
        if footers is None:
            return "some cannot be read"
        schema = _schema(footers[0])
        odd = [f"{f.name} ({f.type})" for f in schema if not _plain(f.type)]
        return f"columns {odd} are not" if odd else "their schemas differ"

    def _frame_key(self, planned: dict[str, Any]) -> Hashable | None:
        p = self.params
        if p.format != "parquet":  # text: Arrow's readers in the tasks, where they take the schema
            return () if p.schema_ is not None and arrow_schema(p.schema_) is not None else None
        names = planned.get("files") or []
        if not names:  # tasks that read nothing: the frame in use does
            return self._run_time[0] if self._run_time is not None else None
        footers = self._footers(names)
        if footers is None:
            return None
        schema = _schema(footers[0])
        if not all(_plain(t) for t in schema.types) or not all(_schema(f).equals(schema) for f in footers[1:]):
            return None
        self._run_time = (schema, names[0])
        return schema

    def known(self, planned: dict[str, Any], time_columns: list[str]) -> dict[str, Any] | None:
        """A Parquet slice read as it is (no declared schema): its rows and newest times are in
        its footers."""
        if self.params.format != "parquet" or self.params.schema_:
            return None
        footers = self._footers(planned.get("files") or [])
        return None if footers is None else footer_facts(footers, time_columns)

    def batch_limit(self) -> int:
        return self.spec.max_rows_per_epoch or self.params.max_files_per_epoch or 2**62

    def capped(self) -> bool:
        return super().capped() or self.params.max_files_per_epoch is not None

    def peek(self, planned: dict[str, Any], columns: tuple[str, ...]) -> Any:
        """Parquet files without a declared schema: the key columns of the slice's files, read
        with pyarrow (a few ms for a few hundred thousand keys). Anything unreadable: None, and
        Spark reads and reports it when the epoch runs."""
        import pyarrow.parquet as pq

        p = self.params
        names = planned.get("files") or []
        if not self._peekable() or not names:
            return None
        fs, base = filesystem(p.path)
        try:
            # one thread: the look-ahead reads in a background thread of lowered priority
            return pq.read_table(
                [f"{base}/{n}" for n in names], columns=list(columns), filesystem=fs, use_threads=False
            )
        except (OSError, ValueError, KeyError, pa.ArrowException):
            return None

    def _peekable(self) -> bool:
        return self.params.format == "parquet" and not self.params.schema_

    def following(self, planned: dict[str, Any]) -> list[str]:
        if not self._peekable():
            return []
        try:  # what plan() would take next, listed again now
            return list(self.plan(planned["end"], 0.0, planned.get("cursor"))["files"])
        except SourceError:
            return []

    def plan(self, start: int, elapsed_s: float, cursor: str | None = None, cap: int | None = None) -> dict[str, Any]:
        """The next files in name order. Their sizes go into the plan too: a text slice's tasks
        share its bytes by them (:mod:`.slices`), and every task, and a replay, must split the
        same way."""
        listing = self._listing()
        names = list(listing)
        pending = [n for n in names if cursor is None or n > cursor]
        if len(names) - len(pending) != start:
            early = len(names) - len(pending) - start
            raise SourceError(
                f"source '{self.name}': {early} file(s) in {self.params.path!r} sort before "
                f"{cursor!r}, which was already read; files must arrive in name order "
                "(e.g. names that start with a timestamp or a sequence number)"
            )
        # whole files: a cap (the backlog's sizing) counts files, nothing cuts inside one
        take = pending[: min(self.batch_limit(), cap if cap is not None else 2**62)]
        return {"start": start, "end": start + len(take), "files": take, "sizes": [listing[n] for n in take],
                "cursor": take[-1] if take else cursor, "backlog": len(pending) - len(take)}

    def frames(
        self, spark: SparkSession, planned: dict[str, Any], partitions: int, count_bad: BadCounter = None,
        columns: frozenset[str] | None = None,
    ) -> Frames:
        from pyspark.sql import functions as F

        p = self.params
        if planned is None:  # tasks take the slice when they run
            partitions = self._run_time_tasks(partitions)
            if p.format != "parquet":
                return self._text_frames(spark, None, partitions, count_bad, columns)
            return self._parquet_in_tasks(spark, partitions, columns)
        if p.format == "parquet":
            names = planned.get("files", [])
            if names:
                df = self._read_parquet(spark, names)
                if p.schema_:
                    df = df.select(*[F.col(f.name).cast(f.dataType) for f in ddl_struct(spark, p.schema_)])
                return Frames(df)
            if not p.schema_:
                known = self._listing()
                if not known:
                    raise SourceError(
                        f"source '{self.name}': parquet directory {p.path!r} is empty; give 'schema' "
                        "so the network can be planned before files arrive"
                    )
                fs, base = filesystem(p.path)
                if self._on_store:
                    schema = _as_spark_reads(_schema(_footer(fs, f"{base}/{next(iter(known))}")))
                    return Frames(spark.createDataFrame([], schema))
                return Frames(spark.read.parquet(f"{base}/{next(iter(known))}").limit(0))
            return Frames(spark.createDataFrame([], ddl_struct(spark, p.schema_)))
        fs, base = filesystem(p.path)
        paths = [f"{base}/{n}" for n in planned.get("files", [])]
        assert p.schema_ is not None
        if arrow_schema(p.schema_) is not None:
            return self._text_frames(spark, planned, partitions, count_bad, columns)
        if self._on_store:
            names = planned.get("files", [])
            tasks = max(1, min(len(names), partitions))
            read = with_store(functools.partial(lines, p.path, EpochSlice(self.name, planned), tasks), p.path)
            text = spark.range(0, tasks, 1, tasks).mapInArrow(read, "file string, line long, raw string")
        else:
            text = _read_lines(spark, [_spark_path(p.path, x) for x in paths])
        if p.header:
            text = text.where("line > 1")
        return decode(spark, text, p.format, p.schema_, self.name, count_bad)

    def arrow_problem(self) -> str | None:
        p = self.params
        if p.format == "parquet":
            return "a parquet source with a declared schema is cast by Spark" if p.schema_ else None
        if arrow_schema(p.schema_ or "") is None:
            return f"its schema {p.schema_!r} has a type only Spark's {p.format} reader takes"
        return None

    def read_arrow(self, planned: dict[str, Any], columns: frozenset[str] | None = None, *,
                   task: int = 0, tasks: int = 1) -> ArrowSlice:
        """The readers of the Spark tasks (:mod:`.slices`), run here on task ``task``'s share."""
        problem = self.arrow_problem()
        if problem is not None:
            raise SourceError(f"source '{self.name}': {problem}")
        p = self.params
        one_task = iter([pa.RecordBatch.from_pydict({"task": [task]})])
        slice_ = EpochSlice(self.name, planned)
        if p.format == "parquet":
            names = planned.get("files") or list(self._listing())[:1]
            if not names:
                raise SourceError(f"source '{self.name}': parquet directory {p.path!r} is empty; a resident epoch "
                                  "needs a file to know the columns")
            fs, base = filesystem(p.path)
            footer = _schema(_footer(fs, f"{base}/{names[0]}"))
            odd = [f.name for f in footer if not _plain(f.type)]
            if odd:
                raise SourceError(f"source '{self.name}': column {odd[0]!r} is of a type pyarrow and Spark read "
                                  "differently; run this network with execution: job")
            from pyspark.sql.pandas.types import to_arrow_schema

            spark_reads = _as_spark_reads(footer)
            wanted = {n.lower() for n in shipped(tuple(spark_reads.names), columns)}
            target = pa.schema([f for f in to_arrow_schema(spark_reads, timezone="UTC") if f.name.lower() in wanted])
            batches = list(parquet_files(p.path, slice_, tasks, target, one_task)) if planned.get("files") else []
            return ArrowSlice(pa.Table.from_batches(batches, target))
        schema = arrow_schema(p.schema_ or "")
        assert schema is not None
        ship = schema.shipped(columns)
        batches = list(text_files(p.format, bool(p.header), p.path, slice_, tasks, schema, ship, one_task))
        if not batches:
            return ArrowSlice(pa.schema([schema.arrow.field(n) for n in ship]).empty_table())
        return arrow_decoded(pa.Table.from_batches(batches), ship, self.name)

    def _parquet_in_tasks(self, spark: SparkSession, partitions: int, columns: frozenset[str] | None) -> Frames:
        """The frame whose tasks read the Parquet files of the slice they are given when they run
        (task i every ``partitions``-th file) with pyarrow: only the columns the network reads
        (:func:`~eddyline.io.textrecords.shipped`), cast to the types Spark's reader gives them.
        A declared schema casts them further, in Spark, as it does the files Spark reads."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        assert self._run_time is not None, "run_time_key gave no key"
        p = self.params
        schema, first = self._run_time
        inferred = self._spark_schema(spark, schema, f"{filesystem(p.path)[1]}/{first}")
        declared = ddl_struct(spark, p.schema_) if p.schema_ else None
        wanted = {n.lower() for n in shipped(tuple((declared or inferred).names), columns)}
        ship = StructType([f for f in inferred.fields if f.name.lower() in wanted] or inferred.fields[:1])
        target = to_arrow_schema(ship, timezone="UTC")
        read = with_store(functools.partial(parquet_files, p.path, EpochSlice(self.name), partitions, target), p.path)
        df = spark.range(0, partitions, 1, partitions).mapInArrow(read, ship)
        if declared is not None:
            df = df.select(*[F.col(f.name).cast(f.dataType) for f in declared if f.name.lower() in wanted])
        return Frames(df)

    def _text_frames(
        self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int, count_bad: BadCounter,
        columns: frozenset[str] | None,
    ) -> Frames:
        """Arrow's readers in the Python workers (io/textrecords.py), the tasks sharing the
        slice's bytes (:mod:`.slices`)."""
        p = self.params
        schema = arrow_schema(p.schema_ or "")
        assert schema is not None
        ship = schema.shipped(columns)
        ddl = schema.ddl(ship)
        if planned is None:
            tasks, slice_ = partitions, EpochSlice(self.name)
        else:
            names = planned.get("files", [])
            if not names:
                return split_decoded(spark.createDataFrame([], ddl), list(ship), self.name, count_bad)
            tasks, slice_ = min(len(names), partitions), EpochSlice(self.name, planned)
        read = with_store(functools.partial(text_files, p.format, bool(p.header), p.path, slice_, tasks, schema, ship),
                          p.path)
        df = spark.range(0, tasks, 1, tasks).mapInArrow(read, ddl)
        return split_decoded(df, list(ship), self.name, count_bad)


def _footer(fs: pafs.FileSystem, path: str) -> Any:
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as f:
        return pq.read_metadata(f)


def _schema(footer: Any) -> pa.Schema:
    return footer.schema.to_arrow_schema().remove_metadata()


def _as_spark_reads(schema: pa.Schema) -> Any:
    """The schema Spark's Parquet reader gives files of footer schema ``schema`` (of types
    :func:`_plain` takes; every column nullable), without Spark opening one."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema([f.with_nullable(True) for f in schema]))


def _plain(t: pa.DataType) -> bool:
    """Whether pyarrow reads a Parquet column of type ``t`` into values that cast exactly to
    what Spark's reader gives (others, e.g. nanosecond or INT96 timestamps, unsigned integers,
    go to Spark's reader)."""
    if pa.types.is_struct(t):
        return all(_plain(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _plain(t.value_type)
    if pa.types.is_map(t):
        return _plain(t.key_type) and _plain(t.item_type)
    if pa.types.is_timestamp(t):
        return t.unit in ("ms", "us")
    return (pa.types.is_signed_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t)
            or pa.types.is_boolean(t) or pa.types.is_date32(t) or pa.types.is_decimal128(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _spark_path(directory: str, full: str) -> str:
    return full if "://" in directory else f"file://{full}"


def _read_lines(spark: SparkSession, paths: list[str]) -> DataFrame:
    """Raw lines as ``(file, line, raw)``: line numbers from 1, blank lines skipped.

    ``wholetext`` reads each file as one value, so a line's number is its position after the
    split (Spark's line reader cannot tell it), and everything stays in the JVM. A file must fit
    in one value (2 GB), which suits the record files this source is for.
    """
    if not paths:
        return spark.createDataFrame([], "file string, line long, raw string")
    return (
        spark.read.text(paths, wholetext=True)
        .selectExpr(
            "regexp_extract(input_file_name(), '[^/]*$', 0) AS file",
            "posexplode(split(value, '\\r?\\n')) AS (pos, raw)",
        )
        .selectExpr("file", "CAST(pos + 1 AS BIGINT) AS line", "raw")
        .where("trim(raw) != ''")
    )


@SOURCES.register
class FilesSourceKind(SourceKind):
    key = "files"
    params = Files
    offsets = "file positions (name order)"

    def check(self, source: SourceSpec) -> list[str]:
        p = source.params
        if p.format != "parquet" and not p.schema_:
            return [f"files.schema: a {p.format} source needs a schema (Spark DDL)"]
        if p.header is not None and p.format != "csv":
            return [f"files.header: only CSV files have a header line, not {p.format}"]
        if p.retract is not None:
            return ["files.retract: only a sink takes epochs back; remove 'retract'"]
        return []

    def unreadable(self, params: Files) -> str | None:
        if "://" in params.path or os.path.isdir(params.path):
            return None
        where = "" if os.path.isabs(params.path) else f" (a relative path is read from {os.getcwd()})"
        what = "is a file, not a directory" if os.path.exists(params.path) else "does not exist"
        return f"files.path: {params.path!r} {what}{where}; a files source reads the files of a directory"

    def columns(self, params: Files) -> tuple[str, ...] | None:
        schema = arrow_schema(params.schema_) if params.schema_ else None
        return tuple(schema.arrow.names) if schema is not None else None

    def make(self, spec: SourceSpec) -> FilesSource:
        return FilesSource(spec)
