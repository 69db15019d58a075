"""Versioned lookup tables for stream-to-table joins.

A lookup table lives in files that may change while the query runs. At planning time its
directory is fingerprinted (names, sizes, modification times); when the fingerprint differs from
the one the previous epoch used, the files are copied into
``<checkpoint>/tables/<step>/<fingerprint>/`` and the plan names that copy. A replayed epoch
therefore joins against exactly the version it first saw, even if the source files changed or
vanished since.

Resident lanes (no Spark job an epoch) read a Parquet table's pinned version on Arrow, with the
types Spark's reader gives it (:func:`read_arrow`), once per version and lane process.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from eddyline.api.network import NetworkSpec
from eddyline.api.units import Files
from eddyline.errors import SourceError
from eddyline.storage import Gate, filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _fingerprint(files: Files) -> tuple[str, list[pafs.FileInfo]]:
    fs, base = filesystem(files.path)
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    except (FileNotFoundError, OSError) as e:
        raise SourceError(f"lookup table {files.path!r} cannot be listed: {e}") from e
    infos = sorted((i for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_"))), key=lambda i: i.path)
    if not infos:
        raise SourceError(f"lookup table {files.path!r} has no files")
    h = hashlib.sha256()
    for i in infos:
        h.update(f"{i.path[len(base):]}\0{i.size}\0{i.mtime_ns}\n".encode())
    return h.hexdigest()[:20], infos


class LookupTables:
    def __init__(self, spec: NetworkSpec, checkpoint: str, gate: Gate | None = None):
        """``gate``: the checkpoint's, through which the copies are written (None: no lease)."""
        #: per step that reads a table whole, the table (its version pinned per epoch)
        self.steps: dict[str, Files] = {
            s.name: table for s in spec.steps if (table := s.info.pinned_table(s.params)) is not None
        }
        self.fs, self.base = filesystem(checkpoint)
        self.checkpoint = checkpoint
        self.gate = gate if gate is not None else Gate(checkpoint)

    def plan(self, previous: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per lookup step: the version this epoch uses, copying a new one in if it changed."""
        out = {}
        for step, table in self.steps.items():
            fp, infos = _fingerprint(table)
            prev = previous.get(step)
            if prev is not None and prev["fingerprint"] == fp:
                out[step] = prev
                continue
            target = f"{self.base}/tables/{step}/{fp}"
            if self.fs.get_file_info(target).type == pafs.FileType.NotFound:
                src_fs, src_base = filesystem(table.path)
                gate = self.gate.ready()
                tmp = gate.staging(f"table-{step}-{fp}")
                gate.clear(tmp)
                for info in infos:
                    rel = info.path[len(src_base) :].lstrip("/")
                    dst = f"{tmp}/{rel}"
                    gate.makedirs(dst.rsplit("/", 1)[0])
                    pafs.copy_files(info.path, dst, source_filesystem=src_fs, destination_filesystem=self.fs)
                gate.publish(tmp, target)
            out[step] = {"fingerprint": fp, "path": target}
        return out

    def location(self, version: dict[str, Any]) -> str:
        """Where a pinned version is, as :func:`eddyline.storage.filesystem` takes it (for the lanes)."""
        if "://" in self.checkpoint:
            return f"{self.checkpoint.split('://', 1)[0]}://{version['path']}"
        return str(version["path"])

    def frame(self, spark: SparkSession, step: str, version: dict[str, Any] | None) -> DataFrame:
        """The table as of ``version`` (``None``: the live files, for validation and explain)."""
        files = self.steps[step]
        if version is None:
            path = filesystem(files.path)[1]
            uri = path if "://" in files.path else f"file://{path}"
        else:
            uri = version["path"] if "://" in self.checkpoint else f"file://{version['path']}"
        reader = spark.read.format(files.format)
        if files.schema_:
            reader = reader.schema(files.schema_)
        if files.format == "csv":
            reader = reader.option("header", "true")
        return reader.load(uri)


#: the tables this process has read on Arrow, by location (a pinned version never changes)
_READ: OrderedDict[str, pa.Table] = OrderedDict()
_KEEP = 4


def read_arrow(location: str, pinned: bool = True) -> pa.Table:
    """The Parquet table at ``location`` (a pinned version's copy, or with ``pinned`` False the
    live files) on Arrow, with the columns and types Spark's reader gives it; a pinned version
    (which never changes) read once per location while it is among the last few read. ``ValueError`` naming the column for a type Spark reads otherwise (unsigned
    integers, nanosecond or zone-less timestamps...); :class:`SourceError` when it cannot be read."""
    import pyarrow.dataset as ds

    got = _READ.get(location) if pinned else None
    if got is not None:
        _READ.move_to_end(location)
        return got
    fs, base = filesystem(location)
    try:
        data = ds.dataset(base, filesystem=fs, format="parquet", ignore_prefixes=[".", "_"])
        files = data.files
        nested = [f for f in files if "=" in f[len(base):].rsplit("/", 1)[0]]
        if nested:  # Spark makes a column of a key=value directory
            raise ValueError(f"its file {nested[0]!r} is in a partition directory, whose column Spark adds")
        table = data.to_table()
    except (OSError, pa.ArrowInvalid) as e:
        raise SourceError(f"lookup table {location!r} cannot be read: {e}") from e
    schema = spark_types(table.schema)
    table = table.cast(schema)
    if not pinned:
        return table
    _READ[location] = table
    while len(_READ) > _KEEP:
        _READ.popitem(last=False)
    return table


def spark_types(schema: pa.Schema) -> pa.Schema:
    """``schema`` (a Parquet file's, as Arrow reads it) as Spark's Parquet reader types it, back
    in Arrow as Spark hands rows to Python: every column nullable, timestamps in microseconds
    (UTC), a dictionary its values. ``ValueError`` for a column Spark reads otherwise."""
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type

    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_timestamp(t) and (t.unit == "ns" or t.tz is None):
            raise ValueError(f"column '{f.name}' is {t}, which Spark reads " + (
                "as a BIGINT or not at all (spark.sql.legacy.parquet.nanosAsLong)" if t.unit == "ns" else
                "as TIMESTAMP_NTZ or TIMESTAMP (spark.sql.parquet.inferTimestampNTZ.enabled)"))
        try:
            fields.append(pa.field(f.name, to_arrow_type(from_arrow_type(t, prefer_timestamp_ntz=False), timezone="UTC"),
                                   nullable=True))
        except Exception as e:  # (pyspark's own type errors)
            raise ValueError(f"column '{f.name}' is {t}, which Spark's Parquet reader does not give as it is: "
                             f"{str(e).splitlines()[0]}") from None
    return pa.schema(fields)
