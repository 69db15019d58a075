"""The ``files`` source and sink: a directory of Parquet, JSON-lines or CSV files.

As a source, offsets are positions in the name-sorted file list; the plan records the file names,
so files added later never change an epoch that was already planned. A malformed JSON or CSV line
becomes a dead letter (raw text, reason, file, line) instead of failing the epoch. Files of a flat
schema are decoded by Arrow's JSON and CSV readers in the Python workers (:mod:`.textrecords`,
faster than Spark's own readers); JSON of nested schemas, and CSV with a type Arrow's reader does
not take, are read raw and parsed in Spark (:mod:`.records`). Parquet files are read with pyarrow
in the tasks too, by a frame kept while the files' footer schema stays (Spark's reader would
need a new frame, and new frames behind it, every epoch); a slice of mixed footers, or of a type
whose values pyarrow and Spark read differently, goes to Spark's reader.

As a sink, writing is two steps so that an epoch's output appears all at once and a replay never
duplicates: :meth:`FilesTarget.staging` receives the rows where no reader looks
(``path/_staging/g=G/…``), and :meth:`FilesTarget.publish` renames them to ``path/epoch=NNNNNNNNNN``,
replacing whatever an earlier, crashed attempt published. The runtime publishes before it
commits the epoch; a crash in between replays the epoch, which stages and publishes the same rows
again.

Tentative epochs (Delay-Process-Correct, :mod:`eddyline.ha.dpc`) publish to
``path/_tentative/epoch=N`` instead, which readers of ``path`` skip (Spark, Arrow and Hive skip
names that start with ``_``) and readers who want them read on purpose. The epoch that corrects
them moves them to ``path/_corrections/epoch=M/retracted/epoch=N`` and publishes the stable rows
in ``path/epoch=M`` as usual.

Under a lease (:mod:`eddyline.ha.lease`) the staging is the driver's generation's gate
(``path/_staging/g=G/epoch=N``, :class:`~eddyline.storage.Gate`), and every move into place,
aside or back starts or passes there. The driver that takes the lease over opens its own gate
before it writes anything, which revokes the older one's: a driver that was frozen past its lease
finds, when it wakes, that the file system refuses its publish.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from eddyline.api.registry import SINKS, SOURCES
from eddyline.api.units import Files
from eddyline.columns import DIFF
from eddyline.errors import SinkError, SourceError
from eddyline.io.records import ddl_struct, decode, split_decoded
from eddyline.io.sinks import Sink, SinkKind
from eddyline.io.sources import BadCounter, EpochSlice, Frames, Source, SourceKind, footer_facts
from eddyline.io.textrecords import TextSchema, arrow_schema, file_batches, shipped
from eddyline.storage import Gate, filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from eddyline.api.sinks import SinkSpec
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
            self._schemas = (schema, spark.read.parquet(path).schema)
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
        if self.params.format == "parquet" and not self.feeds_state:
            return None
        if planned.get("files"):  # an empty slice: the frame in use reads nothing
            self._one_task = len(planned["files"]) == 1
        key = self._frame_key(planned)
        return None if key is None else (key, self._one_task)

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
        share its bytes by them (:func:`_task_pieces`), and every task, and a replay, must split
        the same way."""
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
        take = pending[: self.batch_limit()]  # files: admission control does not cut inside files
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
                _, base = filesystem(p.path)
                return Frames(spark.read.parquet(f"{base}/{next(iter(known))}").limit(0))
            return Frames(spark.createDataFrame([], ddl_struct(spark, p.schema_)))
        fs, base = filesystem(p.path)
        paths = [f"{base}/{n}" for n in planned.get("files", [])]
        assert p.schema_ is not None
        if arrow_schema(p.schema_) is not None:
            return self._text_frames(spark, planned, partitions, count_bad, columns)
        lines = _read_lines(spark, [_spark_path(p.path, x) for x in paths])
        if p.header:
            lines = lines.where("line > 1")
        return decode(spark, lines, p.format, p.schema_, self.name, count_bad)

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
        read = functools.partial(_parquet_files, p.path, EpochSlice(self.name), partitions, target)
        df = spark.range(0, partitions, 1, partitions).mapInArrow(read, ship)
        if declared is not None:
            df = df.select(*[F.col(f.name).cast(f.dataType) for f in declared if f.name.lower() in wanted])
        return Frames(df)

    def _text_frames(
        self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int, count_bad: BadCounter,
        columns: frozenset[str] | None,
    ) -> Frames:
        """Arrow's readers in the Python workers (io/textrecords.py), the tasks sharing the
        slice's bytes (:func:`_task_pieces`)."""
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
        read = functools.partial(_text_files, p.format, bool(p.header), p.path, slice_, tasks, schema, ship)
        df = spark.range(0, tasks, 1, tasks).mapInArrow(read, ddl)
        return split_decoded(df, list(ship), self.name, count_bad)


def _footer(fs: pafs.FileSystem, path: str) -> Any:
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as f:
        return pq.read_metadata(f)


def _schema(footer: Any) -> pa.Schema:
    return footer.schema.to_arrow_schema().remove_metadata()


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


def _task_numbers(batches: Iterator[pa.RecordBatch]) -> Iterator[int]:
    """In a Spark task: the task numbers that arrive in ``batches`` (a frame's ``range`` rows)."""
    for batch in batches:
        yield from batch.column(0).to_pylist()


def _task_files(slice_: EpochSlice, tasks: int, batches: Iterator[pa.RecordBatch]) -> Iterator[str]:
    """In a Spark task: the names of task i's share of the slice's files (every ``tasks``-th),
    for each task number i that arrives in ``batches``."""
    names = slice_.get().get("files", [])
    for task in _task_numbers(batches):
        yield from names[task::tasks]


def _parquet_files(
    directory: str, slice_: EpochSlice, tasks: int, target: pa.Schema, batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: its share of the slice's Parquet files, the ``target`` columns cast to
    its types."""
    fs, base = filesystem(directory)
    for name in _task_files(slice_, tasks, batches):
        with fs.open_input_file(f"{base}/{name}") as f:
            for b in pq.ParquetFile(f).iter_batches(columns=target.names, use_threads=False):
                yield b if b.schema.equals(target) else b.cast(target)


def _text_files(
    fmt: Any, header: bool, directory: str, slice_: EpochSlice, tasks: int, schema: TextSchema,
    ship: tuple[str, ...], batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: its share of the slice's bytes (:func:`_task_pieces`), decoded (the
    ``ship`` columns handed on)."""
    fs, base = filesystem(directory)
    planned = slice_.get()
    for task in _task_numbers(batches):
        for name, lo, hi in _task_pieces(planned, tasks, task):
            with fs.open_input_file(f"{base}/{name}") as f:
                begin, text = _records_between(f, lo, hi)
            yield from file_batches(
                fmt, name, text, schema, header=header and begin == 0, ship=ship,
                first_line=functools.partial(_line_at, fs, f"{base}/{name}", begin),
            )


def _task_pieces(planned: dict[str, Any], tasks: int, task: int) -> list[tuple[str, int, int | None]]:
    """Task ``task``'s pieces of a text slice, ``(file, lo, hi)``: the slice's files laid end to
    end and cut into ``tasks`` runs of about as many bytes, so that five files on two tasks take
    two and a half files' time rather than three. A piece holds the records that start in bytes
    ``[lo, hi)`` of its file (``hi`` None: to its end). A plan without sizes (logged before they
    were) gives every ``tasks``-th file whole."""
    names: list[str] = planned.get("files", [])
    sizes: list[int] | None = planned.get("sizes")
    if sizes is None or len(sizes) != len(names):
        return [(n, 0, None) for n in names[task::tasks]]
    total = sum(sizes)
    first, last = total * task // tasks, total * (task + 1) // tasks
    pieces: list[tuple[str, int, int | None]] = []
    at = 0
    for name, size in zip(names, sizes, strict=True):
        lo, hi = max(first, at), min(last, at + size)
        if lo < hi:
            pieces.append((name, lo - at, None if hi == at + size else hi - at))
        at += size
    return pieces


def _records_between(f: Any, lo: int, hi: int | None) -> tuple[int, bytes]:
    """The lines of the open file ``f`` that start in bytes ``[lo, hi)`` (``hi`` None: to the
    end), and where the first of them starts. A line starts at 0 or after a line break, so a
    piece starts after the first break at or after ``lo - 1`` and ends after the first at or
    after ``hi - 1``: pieces that meet at a byte share no line and miss none."""
    begin = 0 if lo == 0 else _break_at_or_after(f, lo - 1)
    if begin is None or (hi is not None and begin >= hi):  # no line starts in the piece
        return lo, b""
    if hi is None:
        f.seek(begin)
        return begin, f.read()
    end = _break_at_or_after(f, hi - 1)
    f.seek(begin)
    return begin, f.read((f.size() if end is None else end) - begin)


def _break_at_or_after(f: Any, at: int) -> int | None:
    """The position just after the first line break at or after byte ``at`` of ``f``, None if
    there is none."""
    step = 1 << 16
    while True:
        chunk = f.read_at(step, at)
        if not chunk:
            return None
        i = chunk.find(b"\n")
        if i >= 0:
            return at + i + 1
        at += len(chunk)


def _line_at(fs: pafs.FileSystem, path: str, begin: int) -> int:
    """The line number (from 1) of the line that starts at byte ``begin`` of ``path``: asked for
    only when a piece has a dead letter or a blank line, so the bytes before it are read then (in
    blocks, so that a late piece of a large file needs no copy of all that comes before it)."""
    line, at = 1, 0
    with fs.open_input_file(path) as f:
        while at < begin:
            block = f.read_at(min(1 << 24, begin - at), at)
            if not block:
                break
            line += block.count(b"\n")
            at += len(block)
    return line


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




def epoch_dir(epoch: int) -> str:
    return f"epoch={epoch:010d}"


#: in each epoch's directory a driver under a lease publishes: its lease generation
GENERATION_FILE = "_generation"


class FilesTarget:
    """A directory that receives one sub-directory per epoch, written through a
    :class:`~eddyline.storage.Gate`: staged in ``path/_staging/g=G[/writer]/epoch=N``, moved into
    place from there, so that once a newer lease generation opened its gate here the file system
    refuses an older one's publish, retraction or restore."""

    def __init__(self, files: Files, generation: int = 0):
        """``generation``: the lease generation of the driver that writes (0: no lease)."""
        self.files = files
        self.fs, self.base = filesystem(files.path)
        self.gate = Gate(files.path, generation)

    @property
    def generation(self) -> int:
        return self.gate.generation

    @property
    def writer(self) -> str:
        """Names this driver's part of the staging when two drivers write the same path (a hot pair)."""
        return self.gate.writer

    @writer.setter
    def writer(self, writer: str) -> None:
        if writer != self.gate.writer:
            self.gate = Gate(self.files.path, self.gate.generation, writer)

    def fence(self, generation: int) -> None:
        """Write under lease generation ``generation`` from now on, revoking the older ones'
        (:class:`~eddyline.errors.Fenced` if a newer one took over)."""
        self.fs.create_dir(self.base, recursive=True)
        self.gate.open(generation)

    def staging(self, epoch: int) -> str:
        return self.gate.staging(epoch_dir(epoch))

    def discard(self, epoch: int) -> None:
        """Drop what was staged for ``epoch`` (the other driver of a hot pair published it)."""
        self.gate.clear(self.staging(epoch))

    def final(self, epoch: int, tentative: bool = False) -> str:
        return f"{self.base}/{'_tentative/' if tentative else ''}{epoch_dir(epoch)}"

    def spark_uri(self, path: str) -> str:
        return path if "://" in self.files.path else f"file://{path}"

    def publish(self, epoch: int, tentative: bool = False) -> None:
        src, dst = self.staging(epoch), self.final(epoch, tentative)
        if self.fs.get_file_info(src).type == pafs.FileType.NotFound:
            self.gate.check()  # gone with a revoked gate, not merely nothing staged
            return
        try:
            if self.generation:  # which lease generation published it: readers skip names with '_'
                self.gate.put(f"{src}/{GENERATION_FILE}", str(self.generation).encode())
            self.gate.ready().publish(src, dst)
        except OSError as e:
            raise SinkError(f"cannot publish epoch {epoch} to {dst}: {e}") from e

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        """Move the ``epochs``' output (tentative or not: a replay takes stable epochs back)
        aside, into ``_corrections/epoch=<at_epoch>/retracted``."""
        gate = self.gate.ready()
        for epoch in epochs:
            dst = f"{self._aside(at_epoch)}/{epoch_dir(epoch)}"
            for src in (self.final(epoch, tentative=True), self.final(epoch)):
                try:  # nothing there: nothing published, or retracted by an earlier attempt
                    gate.move(src, dst)
                except OSError as e:
                    raise SinkError(f"cannot retract epoch {epoch} from {src}: {e}") from e

    def restore(self, at_epoch: int) -> None:
        """Put back what epoch ``at_epoch`` retracted (undoing a replay), as stable epochs."""
        gate = self.gate.ready()
        aside = self._aside(at_epoch)
        for info in self.fs.get_file_info(pafs.FileSelector(aside, allow_not_found=True)):
            dst = f"{self.base}/{info.base_name}"
            if self.fs.get_file_info(dst).type != pafs.FileType.NotFound:
                continue  # put back by an earlier attempt
            try:
                gate.move(info.path, dst)
            except OSError as e:
                raise SinkError(f"cannot put epoch output {info.path} back: {e}") from e

    def _aside(self, at_epoch: int) -> str:
        return f"{self.base}/_corrections/{epoch_dir(at_epoch)}/retracted"


class FilesSink(Sink):
    rewinds = True

    def __init__(self, spec: SinkSpec):
        super().__init__(spec)
        self.target = FilesTarget(spec.params)
        self.revisions = Revisions(self.target) if spec.params.retract == "revisions" else None

    def stage(self, df: DataFrame, epoch: int) -> None:
        self.target.writer = self.writer
        if self.revisions is not None and DIFF not in df.columns:
            df = df.selectExpr("*", f"CAST(1 AS BIGINT) AS {DIFF}")
        write_frame(df, self.target, epoch, in_driver=self.small_epoch)

    def fence(self, generation: int) -> None:
        super().fence(generation)
        self.target.writer = self.writer
        self.target.fence(generation)

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        if self.revisions is not None:
            self.revisions.write(epoch)
        self.target.publish(epoch, tentative)

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        if self.revisions is not None:
            self.revisions.take_back(epochs, at_epoch)
        else:
            self.target.retract(epochs, at_epoch)

    def restore(self, at_epoch: int) -> None:
        if self.revisions is not None:
            self.revisions.put_back(at_epoch)
        else:
            self.target.restore(at_epoch)

    def drop(self, epoch: int) -> None:
        self.target.discard(epoch)


class Revisions:
    """A files sink's epochs taken back and put back as revisions (``retract: revisions``).

    Nothing published moves (but tentative epochs, which readers of the changelog never saw):
    the epoch that takes epoch N back carries N's rows with ``_diff`` negated
    (``retract-N.parquet``), the one that puts it back carries them as they were
    (``restore-N.parquet``). Whether N is in force is counted from those files in the published
    epochs before the one at work, so a replayed epoch (whose staging starts afresh) writes the
    same files again and nothing twice. The driver reads the rows it writes back: at most the
    epochs a replay reaches over, which the network's ``history`` bounds."""

    RETRACT, RESTORE = "retract-", "restore-"

    def __init__(self, target: FilesTarget):
        self.target = target
        self._due: dict[str, list[int]] = {}  # file prefix -> epochs, written at the next publish

    def take_back(self, epochs: list[int], at_epoch: int) -> None:
        fs = self.target.fs
        tentative = [e for e in epochs if fs.get_file_info(self.target.final(e, tentative=True)).type != pafs.FileType.NotFound]
        self.target.retract(tentative, at_epoch)
        in_force = self._in_force(at_epoch)
        self._due[self.RETRACT] = [e for e in epochs if e not in tentative and in_force[e] > 0]

    def put_back(self, replayed: int) -> None:
        """Put back what epoch ``replayed`` took back (written at the next publish): none of it
        is in force, since replays are undone latest first and once (the engine refuses others)."""
        self._due[self.RESTORE] = self._marks(self.target.final(replayed)).get(self.RETRACT, [])

    def write(self, epoch: int) -> None:
        due, self._due = self._due, {}
        fs, staged = self.target.fs, self.target.staging(epoch)
        for prefix, epochs in due.items():
            for e in epochs:
                rows = self._rows(e)
                if rows is None:
                    continue
                if prefix == self.RETRACT:
                    rows = rows.set_column(rows.schema.get_field_index(DIFF), DIFF, pc.negate(rows[DIFF]))
                self.target.gate.makedirs(staged)
                pq.write_table(rows, f"{staged}/{prefix}{e:010d}.parquet", filesystem=fs, compression="snappy",
                               store_decimal_as_integer=True)

    def _published(self, before: int) -> Iterator[tuple[int, pafs.FileInfo]]:
        for info in self.target.fs.get_file_info(pafs.FileSelector(self.target.base, allow_not_found=True)):
            name = info.base_name
            if info.type == pafs.FileType.Directory and name.startswith("epoch=") and int(name[6:]) < before:
                yield int(name[6:]), info

    def _marks(self, path: str) -> dict[str, list[int]]:
        marks: dict[str, list[int]] = {}
        for info in self.target.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
            for prefix in (self.RETRACT, self.RESTORE):
                if info.base_name.startswith(prefix):
                    marks.setdefault(prefix, []).append(int(info.base_name[len(prefix):].split(".")[0]))
        return marks

    def _in_force(self, before: int) -> Counter[int]:
        """How many times each epoch's rows count in the epochs published before ``before``."""
        count: Counter[int] = Counter()
        for e, info in self._published(before):
            count[e] += 1
            marks = self._marks(info.path)
            count.update(marks.get(self.RESTORE, []))
            count.subtract(marks.get(self.RETRACT, []))
        return count

    def _rows(self, epoch: int) -> pa.Table | None:
        """Epoch ``epoch``'s own rows (not the revisions it carries), or None if it wrote none."""
        fs = self.target.fs
        files = [i.path for i in fs.get_file_info(pafs.FileSelector(self.target.final(epoch), allow_not_found=True))
                 if i.base_name.endswith(".parquet") and not i.base_name.startswith((self.RETRACT, self.RESTORE))]
        return pq.read_table(files, filesystem=fs, partitioning=None) if files else None


def write_frame(df: DataFrame, target: FilesTarget, epoch: int, in_driver: bool = False) -> None:
    """Write ``df`` as the epoch's staged output, replacing whatever an earlier attempt staged.

    ``in_driver``: the output is expected to be small; Parquet is then collected and written by
    the driver. Spark's file writer costs hundreds of milliseconds whatever the size (a writer per
    task, the commit protocol's directories and renames); a few thousand rows collect and write
    in a fraction of that. Both write the same Parquet types (see :func:`_parquet_options`)."""
    fmt = target.files.format
    gate = target.gate.ready()
    path = target.staging(epoch)
    if in_driver and fmt == "parquet":
        table = df.toArrow()
        gate.clear(path)
        gate.makedirs(path)
        pq.write_table(table, f"{path}/part-00000-driver.snappy.parquet", filesystem=target.fs,
                       compression="snappy", store_decimal_as_integer=True)
        return
    writer = df.write
    if fmt == "csv":  # RFC 4180: a quote inside a quoted field is doubled (Spark's default: \")
        writer = writer.option("header", target.files.header is not False).option("escape", '"')
    if isinstance(target.fs, pafs.LocalFileSystem):
        # Hadoop's local file system (without its native library) forks a `chmod` for every
        # directory it creates; a job's commit protocol creates three before the job starts
        # (the output, `_temporary`, `_temporary/0`) and one more in the first task. Created
        # here they cost next to nothing and Hadoop finds them present. The job's
        # commit removes `_temporary` with everything in it. Overwriting would delete them
        # again, so the earlier attempt's output is removed here and the job appends.
        gate.clear(path)
        gate.makedirs(f"{path}/_temporary/0/_temporary")
        writer = writer.mode("append")
    else:
        writer = writer.mode("overwrite")
    with _parquet_options(df.sparkSession, fmt):
        writer.format(fmt).save(target.spark_uri(path))


@contextmanager
def _parquet_options(spark: SparkSession, fmt: str) -> Iterator[None]:
    """Spark writes timestamps as INT64 microseconds, as pyarrow does (Spark's default, INT96, is
    deprecated in Parquet and read back as nanoseconds without a time zone), so that a sink's
    files have one schema whether an epoch was written by Spark or by the driver."""
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key) if fmt == "parquet" else "TIMESTAMP_MICROS"
    if before == "TIMESTAMP_MICROS":
        yield
        return
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        spark.conf.set(key, before)


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


@SINKS.register
class FilesSinkKind(SinkKind):
    key = "files"
    params = Files
    live_params = ("path",)

    def check(self, sink: SinkSpec) -> list[str]:
        if sink.params.schema_ is not None:
            return ["files.schema: a sink writes its input's schema; remove 'schema'"]
        if sink.params.header is not None and sink.params.format != "csv":
            return [f"files.header: only CSV files have a header line, not {sink.params.format}"]
        if sink.params.retract == "revisions" and sink.params.format != "parquet":
            return [f"files.retract: revisions are written as Parquet; set format: parquet (not {sink.params.format})"]
        return []

    def describe(self, params: Any) -> str:
        return f"{params.path} ({params.format}, one epoch=N directory per epoch)"

    def make(self, spec: SinkSpec, console: Any = None) -> FilesSink:
        return FilesSink(spec)
