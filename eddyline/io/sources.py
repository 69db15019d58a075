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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from eddyline.api.spec import Files, Generator, Nexmark, SourceSpec
from eddyline.errors import SourceError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: Offsets per epoch for an unpaced synthetic source with no ``max_rows_per_epoch``.
DEFAULT_UNPACED_BATCH = 1_000_000

DEAD_LETTER_DDL = "source string, file string, line long, raw string, reason string"


@dataclass
class Frames:
    data: DataFrame
    dead_letters: DataFrame | None = None


@dataclass
class Source:
    spec: SourceSpec
    checkpoint_hint: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def available(self, elapsed_s: float) -> int:
        """How many offsets exist now (the end of the readable range)."""
        raise NotImplementedError

    def plan(self, start: int, elapsed_s: float) -> dict[str, Any]:
        """The epoch's slice: ``{"start", "end"}`` plus anything a replay needs."""
        end = min(self.available(elapsed_s), start + self.batch_limit())
        return {"start": start, "end": max(start, end)}

    def batch_limit(self) -> int:
        return self.spec.max_rows_per_epoch or DEFAULT_UNPACED_BATCH

    def frames(self, spark: SparkSession, planned: dict[str, Any], partitions: int) -> Frames:
        raise NotImplementedError

    def schema_frame(self, spark: SparkSession) -> DataFrame:
        """An empty frame with the source's schema (validation and ``explain``)."""
        return self.frames(spark, {"start": 0, "end": 0, "files": []}, 1).data


class GeneratorSource(Source):
    @property
    def params(self) -> Generator:
        assert self.spec.generator is not None
        return self.spec.generator

    def available(self, elapsed_s: float) -> int:
        from eddyline.io.generator import generator_available

        return generator_available(self.params, elapsed_s)

    def batch_limit(self) -> int:
        if self.spec.max_rows_per_epoch:
            return self.spec.max_rows_per_epoch
        return DEFAULT_UNPACED_BATCH if self.params.unpaced else 2**62

    def frames(self, spark: SparkSession, planned: dict[str, Any], partitions: int) -> Frames:
        from eddyline.io.generator import generator_frame

        return Frames(generator_frame(spark, self.params, planned["start"], planned["end"], partitions))


class NexmarkSource(Source):
    @property
    def params(self) -> Nexmark:
        assert self.spec.nexmark is not None
        return self.spec.nexmark

    def available(self, elapsed_s: float) -> int:
        from eddyline.io.nexmark import nexmark_available

        return nexmark_available(self.params, elapsed_s)

    def batch_limit(self) -> int:
        if self.spec.max_rows_per_epoch:
            return self.spec.max_rows_per_epoch
        return DEFAULT_UNPACED_BATCH if self.params.unpaced else 2**62

    def frames(self, spark: SparkSession, planned: dict[str, Any], partitions: int) -> Frames:
        from eddyline.io.nexmark import nexmark_frame

        return Frames(nexmark_frame(spark, self.params, planned["start"], planned["end"], partitions))


class FilesSource(Source):
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

    def batch_limit(self) -> int:
        return self.spec.max_rows_per_epoch or self.params.max_files_per_epoch or 2**62

    def plan(self, start: int, elapsed_s: float) -> dict[str, Any]:
        names = self._listing()
        end = min(len(names), start + self.batch_limit())
        return {"start": start, "end": max(start, end), "files": names[start:end]}

    def frames(self, spark: SparkSession, planned: dict[str, Any], partitions: int) -> Frames:
        from pyspark.sql import functions as F

        p = self.params
        fs, base = _fs(p.path)
        paths = [f"{base}/{n}" for n in planned.get("files", [])]
        if p.format == "parquet":
            if paths:
                df = spark.read.parquet(*paths)
                if p.schema_:
                    df = df.select(*[F.col(f.name).cast(f.dataType) for f in _ddl_struct(spark, p.schema_)])
                return Frames(df)
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
        first = int(planned.get("start", 0))
        lines = _read_lines(spark, paths, first, partitions)
        corrupt = "_corrupt_record"
        parse_schema = f"{p.schema_}, {corrupt} string"
        opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
        if p.format == "json":
            parsed = F.from_json(F.col("raw"), parse_schema, opts)
        else:
            parsed = F.from_csv(F.col("raw"), parse_schema, opts)
        df = lines.select("file", "line", "raw", parsed.alias("_r"))
        bad = F.col(f"_r.{corrupt}").isNotNull() | F.col("_r").isNull()
        data = df.where(~bad).select(*[F.col(f"_r.{f.name}").alias(f.name) for f in struct])
        dead = df.where(bad).select(
            F.lit(self.name).alias("source"),
            "file",
            "line",
            "raw",
            _reason(p.format, struct).alias("reason"),
        )
        return Frames(data, dead)


def _fs(path: str) -> tuple[pafs.FileSystem, str]:
    from eddyline.state.store import filesystem

    return filesystem(path)


def _ddl_struct(spark: SparkSession, ddl: str) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    t = _parse_datatype_string(ddl)
    assert isinstance(t, StructType)
    return t


def _reason(fmt: str, struct: Any) -> Column:
    """Name the first field that does not fit, or say the line is not valid JSON / CSV."""
    from pyspark.sql import functions as F

    if fmt == "json":
        whole = F.when(
            F.from_json(F.col("raw"), "map<string,string>").isNull(), F.lit("not a valid JSON object")
        )
        checks = []
        for f in struct:
            text = F.get_json_object(F.col("raw"), f"$.{f.name}")
            fits = F.expr(f"try_cast(get_json_object(raw, '$.{f.name}') AS {f.dataType.simpleString()})")
            checks.append(
                F.when(
                    text.isNotNull() & fits.isNull(),
                    F.concat(
                        F.lit(f"field '{f.name}': expected {f.dataType.simpleString()}, got "),
                        F.substring(text, 1, 80),
                    ),
                )
            )
        reason = whole
        for c in checks:
            reason = F.coalesce(reason, c)
        return F.coalesce(reason, F.lit("record does not fit the schema"))
    expected = len(struct.fields)
    n_fields = F.size(F.split(F.col("raw"), ","))
    return F.when(
        n_fields != expected,
        F.concat(F.lit(f"expected {expected} CSV fields, got "), n_fields.cast("string")),
    ).otherwise(F.lit("a CSV field does not fit the schema: " + struct.simpleString()))


def _read_lines(spark: SparkSession, paths: list[str], first_index: int, partitions: int) -> DataFrame:
    """Raw lines as ``(file string, line long, raw string)``, via Spark's Python Data Source API."""
    _register_lines_source(spark)
    return (
        spark.read.format("eddyline_lines")
        .option("paths", json.dumps(paths))
        .schema("file string, line long, raw string")
        .load()
    )


_REGISTERED: set[int] = set()


def _register_lines_source(spark: SparkSession) -> None:
    if id(spark) in _REGISTERED:
        return
    from eddyline.io.lines import LinesDataSource

    spark.dataSource.register(LinesDataSource)
    _REGISTERED.add(id(spark))


def make_source(spec: SourceSpec) -> Source:
    return {"generator": GeneratorSource, "nexmark": NexmarkSource, "files": FilesSource}[spec.kind](spec)


def empty_table(ddl: str) -> pa.Table:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    t = _parse_datatype_string(ddl)
    assert isinstance(t, StructType)
    return to_arrow_schema(t).empty_table()
