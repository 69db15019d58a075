"""Replayable sources: each one maps an offset range to a Spark DataFrame, deterministically.

The driver asks a source how far it has got (:meth:`Source.available`), picks the epoch's range
(admission control may take less), logs it in the epoch plan, and only then asks for the frame.
A replay of the plan therefore reads exactly the same rows.

* ``generator`` / ``nexmark``: offsets are row (event) numbers; rows are computed in Spark.
* ``files``: offsets are positions in the name-sorted file list; the plan records the file names,
  so files added later never change an epoch that was already planned. JSON and CSV lines are read
  raw and parsed in Spark, so a malformed line becomes a dead letter (raw text, reason, file, line)
  instead of failing the epoch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from eddyline.api.spec import Files, Generator, Nexmark, SourceSpec
from eddyline.errors import SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Offsets per epoch for an unpaced synthetic source with no ``max_rows_per_epoch``.
DEFAULT_UNPACED_BATCH = 1_000_000

BadCounter = Callable[["DataFrame"], "DataFrame"] | None


@dataclass
class Frames:
    data: DataFrame
    dead_letters: DataFrame | None = None
    #: the Parquet footers of the files ``data`` reads as they are (no declared schema), if any
    footers: list[Any] | None = None

    def facts(self, time_columns: list[str]) -> dict[str, Any] | None:
        """What observing ``data`` would find, read from the footers before anything runs: its
        rows (``rows``) and the newest value of each of ``time_columns`` in epoch ms
        (``max_t:<column>``; None when all are null). None unless every value is exact there:
        the files' row counts, and INT64 timestamps in milli- or microseconds adjusted to UTC
        (what Spark reads as TIMESTAMP) with min/max statistics in every row group that has a
        non-null value."""
        if self.footers is None:
            return None
        out: dict[str, Any] = {"rows": sum(m.num_rows for m in self.footers)}
        for col in time_columns:
            newest = None
            for meta in self.footers:
                found = _newest_ms(meta, col)
                if found is False:
                    return None
                if found is not None:
                    newest = found if newest is None else max(newest, found)
            out[f"max_t:{col}"] = newest
        return out


@dataclass
class Source:
    spec: SourceSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def available(self, elapsed_s: float) -> int:
        """How many offsets exist now (the end of the readable range)."""
        raise NotImplementedError

    def plan(self, start: int, elapsed_s: float, cursor: str | None = None, cap: int | None = None) -> dict[str, Any]:
        """The epoch's slice: ``{"start", "end"}`` plus anything a replay needs (files: the
        names, and ``cursor``, the last name read, which the commit keeps for the next plan).
        ``cap`` is admission control's limit for this epoch; ``backlog`` is what stays waiting."""
        ready = min(self.available(elapsed_s), self.spec.limit or 2**62)
        end = min(ready, start + self.batch_limit(), start + cap if cap is not None else 2**62)
        return {"start": start, "end": max(start, end), "backlog": max(0, ready - max(start, end))}

    def batch_limit(self) -> int:
        return self.spec.max_rows_per_epoch or DEFAULT_UNPACED_BATCH

    def peek(self, planned: dict[str, Any], columns: tuple[str, ...]) -> Any:
        """``columns`` of the planned slice as an Arrow table, read in the driver before the epoch
        runs, or None when this source cannot do that cheaply (the balancer's look-ahead)."""
        return None

    def following(self, planned: dict[str, Any]) -> list[str]:
        """The files the slice after ``planned`` would take if it were planned now, where
        :meth:`peek` can read them (so the look-ahead can count them early); else none."""
        return []

    def frames(
        self, spark: SparkSession, planned: dict[str, Any], partitions: int, count_bad: BadCounter = None
    ) -> Frames:
        """The slice's rows; ``count_bad`` (if given) is applied to the frame of all parsed
        records, which has a boolean ``_bad`` column, before it splits into data and dead letters."""
        raise NotImplementedError


class SyntheticSource(Source):
    """Rows computed in Spark from their offsets (``generator`` and ``nexmark``): offsets become
    available at the source's rate of event time, or all at once when ``unpaced``."""

    @property
    def params(self) -> Generator | Nexmark:
        p = self.spec.generator or self.spec.nexmark
        assert p is not None
        return p

    def _functions(self) -> tuple[Any, Any]:
        if self.spec.generator is not None:
            from eddyline.io.generator import generator_available, generator_frame

            return generator_available, generator_frame
        from eddyline.io.nexmark import nexmark_available, nexmark_frame

        return nexmark_available, nexmark_frame

    def available(self, elapsed_s: float) -> int:
        return self._functions()[0](self.params, elapsed_s)

    def batch_limit(self) -> int:
        if self.spec.max_rows_per_epoch:
            return self.spec.max_rows_per_epoch
        return DEFAULT_UNPACED_BATCH if self.params.unpaced else 2**62

    def frames(
        self, spark: SparkSession, planned: dict[str, Any], partitions: int, count_bad: BadCounter = None
    ) -> Frames:
        frame = self._functions()[1]
        return Frames(frame(spark, self.params, planned["start"], planned["end"], partitions))


class FilesSource(Source):
    _schemas: tuple[Any, Any] | None = None  # (footer schema, the Spark schema inferred from it)

    @property
    def params(self) -> Files:
        assert self.spec.files is not None
        return self.spec.files

    def _listing(self) -> list[str]:
        fs, base = _fs(self.params.path)
        try:
            infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=False))
        except (FileNotFoundError, OSError) as e:
            raise SourceError(f"source '{self.name}': cannot list {self.params.path!r}: {e}") from e
        names = [
            i.base_name
            for i in infos
            if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_"))
        ]
        return sorted(names)

    def available(self, elapsed_s: float) -> int:
        return len(self._listing())

    def _read_parquet(self, spark: SparkSession, fs: pafs.FileSystem, paths: list[str]) -> tuple[DataFrame, list[Any] | None]:
        """``spark.read.parquet`` infers the schema from the files' footers, a JVM round of 60-120
        ms per epoch. The schema Spark inferred for the first read is kept with the footer schema
        it came from; a later read whose files all have that footer schema (read here with
        pyarrow, well under a millisecond per file) passes it to the reader instead. Returns the
        frame and the footers (None if pyarrow could not read them all)."""
        try:
            footers = [_footer(fs, x) for x in paths]
            schemas = [f.schema.to_arrow_schema() for f in footers]
            same = all(f.equals(schemas[0]) for f in schemas[1:])
        except (OSError, ValueError, pa.ArrowException):  # unreadable here: let Spark read and report it
            footers, schemas, same = None, [], False
        if self._schemas is not None and same and schemas[0].equals(self._schemas[0]):
            return spark.read.schema(self._schemas[1]).parquet(*paths), footers
        df = spark.read.parquet(*paths)
        if same:
            self._schemas = (schemas[0], df.schema)
        return df, footers

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
        fs, base = _fs(p.path)
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
        names = self._listing()
        pending = [n for n in names if cursor is None or n > cursor]
        if len(names) - len(pending) != start:
            early = len(names) - len(pending) - start
            raise SourceError(
                f"source '{self.name}': {early} file(s) in {self.params.path!r} sort before "
                f"{cursor!r}, which was already read; files must arrive in name order "
                "(e.g. names that start with a timestamp or a sequence number)"
            )
        take = pending[: self.batch_limit()]  # files: admission control does not cut inside files
        return {"start": start, "end": start + len(take), "files": take, "cursor": take[-1] if take else cursor,
                "backlog": len(pending) - len(take)}

    def frames(
        self, spark: SparkSession, planned: dict[str, Any], partitions: int, count_bad: BadCounter = None
    ) -> Frames:
        from pyspark.sql import functions as F

        p = self.params
        fs, base = _fs(p.path)
        paths = [f"{base}/{n}" for n in planned.get("files", [])]
        if p.format == "parquet":
            if paths:
                df, footers = self._read_parquet(spark, fs, paths)
                if p.schema_:
                    df = df.select(
                        *[F.col(f.name).cast(f.dataType) for f in _ddl_struct(spark, p.schema_)]
                    )
                    footers = None  # the footers describe the files, not the cast columns
                return Frames(df, footers=footers)
            if not p.schema_:
                known = self._listing()
                if not known:
                    raise SourceError(
                        f"source '{self.name}': parquet directory {p.path!r} is empty; give 'schema' "
                        "so the network can be planned before files arrive"
                    )
                return Frames(spark.read.parquet(f"{base}/{known[0]}").limit(0))
            return Frames(spark.createDataFrame([], _ddl_struct(spark, p.schema_)))
        assert p.schema_ is not None
        struct = _ddl_struct(spark, p.schema_)
        lines = _read_lines(spark, [_spark_path(p.path, x) for x in paths])
        parse = "from_json" if p.format == "json" else "from_csv"
        ddl = f"{p.schema_}, _corrupt_record string".replace("'", "\\'")
        opts = "map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', '_corrupt_record')"
        df = lines.selectExpr("file", "line", "raw", f"{parse}(raw, '{ddl}', {opts}) AS _r").selectExpr(
            "*", "(_r IS NULL OR _r._corrupt_record IS NOT NULL) AS _bad"
        )
        if count_bad is not None:
            df = count_bad(df)
        data = df.where("NOT _bad").selectExpr(*[f"_r.`{f.name}` AS `{f.name}`" for f in struct])
        dead = df.where("_bad").selectExpr(
            f"'{self.name}' AS source", "file", "line", "raw", f"{_reason_sql(p.format, struct)} AS reason"
        )
        return Frames(data, dead)


def _footer(fs: pafs.FileSystem, path: str) -> Any:
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as f:
        return pq.read_metadata(f)


_TO_MS = {"milliseconds": 1, "microseconds": 1000}


def _newest_ms(meta: Any, col: str) -> int | None | bool:
    """The largest value of top-level column ``col`` in one Parquet file, in epoch ms (None: no
    non-null value), or False when the footer cannot say exactly (see :meth:`Frames.facts`)."""
    schema = meta.schema
    i = next((j for j in range(len(schema)) if schema.column(j).path == col), None)
    if i is None or schema.column(i).physical_type != "INT64":
        return False
    logical = json.loads(schema.column(i).logical_type.to_json())
    if logical.get("Type") != "Timestamp" or not logical.get("isAdjustedToUTC"):
        return False
    per_ms = _TO_MS.get(logical.get("timeUnit", ""))
    if per_ms is None:
        return False
    newest = None
    for r in range(meta.num_row_groups):
        chunk = meta.row_group(r).column(i)
        stats = chunk.statistics
        if stats is not None and stats.has_min_max:
            value = int(stats.max_raw) // per_ms  # floor, as the observation's floor(micros / 1000)
            newest = value if newest is None else max(newest, value)
        elif not (stats is not None and stats.has_null_count and stats.null_count == chunk.num_values):
            return False  # values without statistics
    return newest


def _fs(path: str) -> tuple[pafs.FileSystem, str]:
    from eddyline.storage import filesystem

    return filesystem(path)


def _ddl_struct(spark: SparkSession, ddl: str) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    t = _parse_datatype_string(ddl)
    assert isinstance(t, StructType)
    return t


def _reason_sql(fmt: str, struct: Any) -> str:
    """SQL naming the first field that does not fit, or saying the line is not JSON / CSV."""
    if fmt == "json":
        checks = ["CASE WHEN from_json(raw, 'map<string,string>') IS NULL THEN 'not a valid JSON object' END"]
        for f in struct:
            t = f.dataType.simpleString()
            text = f"get_json_object(raw, '$.{f.name}')"
            checks.append(
                f"CASE WHEN {text} IS NOT NULL AND try_cast({text} AS {t}) IS NULL "
                f"THEN concat('field ''{f.name}'': expected {t}, got ', substring({text}, 1, 80)) END"
            )
        checks.append("'record does not fit the schema'")
        return f"coalesce({', '.join(checks)})"
    n = len(struct.fields)
    return (
        f"CASE WHEN size(split(raw, ',')) != {n} "
        f"THEN concat('expected {n} CSV fields, got ', CAST(size(split(raw, ',')) AS STRING)) "
        f"ELSE 'a CSV field does not fit the schema: {struct.simpleString()}' END"
    )


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


def make_source(spec: SourceSpec) -> Source:
    return FilesSource(spec) if spec.kind == "files" else SyntheticSource(spec)
