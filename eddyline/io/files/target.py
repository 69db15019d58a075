"""Where a ``files`` sink's epochs land. Writing is two steps, so that an epoch's output
appears all at once and a replay never duplicates it: the rows are staged where no reader looks
(``path/_staging/g=G/…``), then moved to ``path/epoch=NNNNNNNNNN``, replacing whatever an earlier,
crashed attempt published. The runtime publishes before it commits the epoch, so a crash in
between replays the epoch, which stages and publishes the same rows again.

Tentative epochs (Delay-Process-Correct, :mod:`eddyline.ha.dpc`) go to ``path/_tentative/epoch=N``,
which readers of ``path`` skip (Spark, Arrow and Hive skip names starting with ``_``); the epoch
that corrects them moves them to ``path/_corrections/epoch=M/retracted/epoch=N``.

Under a lease (:mod:`eddyline.ha.lease`) the staging is the driver's generation's gate
(:class:`~eddyline.storage.Gate`) and every move starts or passes there. A driver that takes the
lease over opens its own gate before it writes, which revokes the older one's: a driver frozen
past its lease finds, when it wakes, that the file system refuses its publish.

On an object store, which renames nothing, a published epoch is copied object by object from the
staging; the target remembers the names it staged for each epoch, so that neither staging nor
publishing lists the store (:func:`~eddyline.storage.publish_objects`). A driver that takes the
lease over deletes what older generations staged there, so the store refuses a woken driver's
copies (:meth:`~eddyline.storage.Gate._open_on_store`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from eddyline.api.units import Files
from eddyline.errors import SinkError
from eddyline.storage import Gate, filesystem, is_s3, makedirs, publish_objects, write_bytes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
        #: on an object store: the files staged for each epoch not yet published, by name in
        #: the epoch's staging folder (no entry: nothing was staged)
        self._staged: dict[int, list[str]] = {}

    def staged(self, epoch: int, names: list[str], *, more: bool = False) -> None:
        """Remember what was staged for ``epoch`` (``more``: besides what was before), on an
        object store, where publishing copies exactly these."""
        if not is_s3(self.fs):
            return
        before = self._staged.get(epoch, []) if more else []
        if names and not before:  # the first staged for the epoch: its marker with them, which
            # publishing copies first (so that nothing lands once a newer generation took them)
            write_bytes(self.fs, f"{self.staging(epoch)}/{GENERATION_FILE}", str(self.generation).encode())
        self._staged[epoch] = [*before, *names]

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
        makedirs(self.fs, self.base)
        self.gate.open(generation)

    def staging(self, epoch: int) -> str:
        return self.gate.staging(epoch_dir(epoch))

    def discard(self, epoch: int) -> None:
        """Drop what was staged for ``epoch`` (the other driver of a hot pair published it)."""
        self._staged.pop(epoch, None)
        self.gate.clear(self.staging(epoch))

    def final(self, epoch: int, tentative: bool = False) -> str:
        return f"{self.base}/{'_tentative/' if tentative else ''}{epoch_dir(epoch)}"

    def spark_uri(self, path: str) -> str:
        return path if "://" in self.files.path else f"file://{path}"

    def publish(self, epoch: int, tentative: bool = False) -> None:
        src, dst = self.staging(epoch), self.final(epoch, tentative)
        if is_s3(self.fs):
            names = self._staged.pop(epoch, [])
            try:
                if names:
                    publish_objects(src, dst, names, GENERATION_FILE)
            except OSError as e:
                self.gate.check(e)  # what it staged was deleted by a newer generation: Fenced
                raise SinkError(f"cannot publish epoch {epoch} to {dst}: {e}") from e
            return
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
        write_table(df.toArrow(), target, epoch)
        return
    if is_s3(target.fs):
        target.staged(epoch, write_in_tasks(df, fmt, path, header=target.files.header is not False))
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


def write_table(table: pa.Table, target: FilesTarget, epoch: int) -> None:
    """``table`` written by this process as the epoch's staged output, replacing whatever an
    earlier attempt staged."""
    parts = prepare_parts(target, epoch)
    name = f"{parts['path']}/part-00000-driver"
    target.staged(epoch, [_write_table(table, parts["format"], target.fs, name, parts["header"])])


def prepare_parts(target: FilesTarget, epoch: int) -> dict[str, Any]:
    """The epoch's staging made empty for parts other processes write (:func:`write_part`); what
    they need to know of it."""
    gate = target.gate.ready()
    path = target.staging(epoch)
    if not is_s3(target.fs):  # (on an object store only what is named is published)
        gate.clear(path)
        gate.makedirs(path)
    return {"root": target.files.path, "path": path, "format": target.files.format,
            "header": target.files.header is not False}


def write_part(table: pa.Table, parts: dict[str, Any], part: str) -> str | None:
    """``table`` written as part ``part`` of a staging :func:`prepare_parts` made ready (from
    any process that reaches its file system); the file's name (None: no rows, no file)."""
    if not table.num_rows:
        return None
    fs, _ = filesystem(parts["root"])
    return _write_table(table, parts["format"], fs, f"{parts['path']}/part-{part}", parts["header"])


def write_in_tasks(df: DataFrame, fmt: str, path: str, *, header: bool = True) -> list[str]:
    """Write ``df`` to the object-store folder ``path`` (``bucket/key``) from Spark's tasks, one
    ``part-<partition>`` file each, with pyarrow: Spark's own S3 connector (hadoop-aws) is not
    part of PySpark, and Spark given an ``s3://`` path it cannot open would fail or, worse, take a
    bucket-less path as a local one. A retried task writes the same name again. The names
    written (partitions without rows write none)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from eddyline import objectfs, objectstore

        objectstore.adopt(store)
        got = [b for b in batches if b.num_rows]
        if got:
            name = f"{path}/part-{TaskContext.get().partitionId():05d}"
            yield pa.RecordBatch.from_pydict(
                {"name": [_write_table(pa.Table.from_batches(got), fmt, objectfs.filesystem(), name, header)]})

    from eddyline import objectstore

    store = objectstore.settings()
    return sorted(r.name for r in df.mapInArrow(write, "name STRING").collect())


def spark_text(table: pa.Table) -> pa.Table:
    """``table`` with its timestamps and dates as the text Spark's JSON and CSV writers give them
    (``yyyy-MM-dd'T'HH:mm:ss.SSS`` and ``Z`` for an instant, in the session's UTC; ``yyyy-MM-dd``),
    so a file written here reads as one Spark wrote: the same sink writes from Spark's tasks and
    from this process depending on the epoch and the mode."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            text = pc.strftime(column.cast(pa.timestamp("ms", tz=field.type.tz), safe=False), format="%Y-%m-%dT%H:%M:%S")
            column = pc.binary_join_element_wise(text, pa.scalar("Z"), "") if field.type.tz else text
        elif pa.types.is_date(field.type):
            column = pc.strftime(column, format="%Y-%m-%d")
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _csv_field(value: Any) -> str:
    """A CSV field as Spark's writer gives it: quoted only when it must be (a comma, a quote, a line
    break; an empty string, to tell it from a null, which is nothing), quotes doubled."""
    if value is None:
        return ""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if text == "" or any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _write_table(table: pa.Table, fmt: str, fs: pafs.FileSystem, name: str, header: bool) -> str:
    """``table`` as the file ``name`` + the format's suffix, serialised here and written whole
    (on an object store in one request); the file's own name."""
    out = pa.BufferOutputStream()
    if fmt == "parquet":
        pq.write_table(table, out, compression="snappy", store_decimal_as_integer=True)
        suffix = ".snappy.parquet"
    elif fmt == "csv":
        rows = zip(*(c.to_pylist() for c in spark_text(table).columns), strict=True)
        lines = [table.column_names] if header else []
        out.write("".join(",".join(map(_csv_field, line)) + "\n" for line in [*lines, *rows]).encode())
        suffix = ".csv"
    else:
        import json

        out.write("".join(json.dumps({k: v for k, v in r.items() if v is not None}, default=str, ensure_ascii=False,
                                     separators=(",", ":")) + "\n" for r in spark_text(table).to_pylist()).encode())
        suffix = ".json"
    write_bytes(fs, f"{name}{suffix}", out.getvalue().to_pybytes())
    return f"{name}{suffix}".rsplit("/", 1)[-1]


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
