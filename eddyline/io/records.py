"""Decoding text records (JSON objects, CSV lines) against a declared schema, inside Spark, with
every record that does not fit kept as a dead letter that says why. Shared by the sources that
read text: ``files`` (JSON-lines and CSV files) and ``nats`` (one record per message).

The input is a frame of ``(file, line, raw)``: where the record came from (a file name and line
number, or a stream name and sequence) and its text. The records are parsed with Spark's own
PERMISSIVE parser; the reason is worked out only for the records that failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eddyline.io.sources import BadCounter, Frames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def to_json_column(df: DataFrame, also: tuple[str, ...] = ()) -> DataFrame:
    """Each row of ``df`` as one JSON object (column ``v``), timestamps to the microsecond (Spark's
    default format stops at the millisecond) so that decoding gives back the very same values.
    ``also``: SQL expressions over the row selected before ``v`` (a record's key, say)."""
    cols = ", ".join(f"`{c}`" for c in df.columns)
    return df.selectExpr(*also, f"to_json(struct({cols}), map('timestampFormat', \"{_TIMESTAMP}\")) AS v")


_TIMESTAMP = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"


def split_decoded(df: DataFrame, columns: list[str], source: str, count_bad: BadCounter = None) -> Frames:
    """Records decoded elsewhere (:mod:`eddyline.io.textrecords`, in the Python worker) into
    ``columns`` plus ``_file``, ``_line``, ``_raw``, ``_reason`` (null for a record that fits):
    the data and the dead letters, as :func:`decode` gives them."""
    df = df.selectExpr("*", "_reason IS NOT NULL AS _bad")
    if count_bad is not None:
        df = count_bad(df)
    data = df.where("NOT _bad").selectExpr(*[f"`{c}`" for c in columns])
    dead = df.where("_bad").selectExpr(
        f"'{source}' AS source", "_file AS file", "_line AS line", "_raw AS raw", "_reason AS reason"
    )
    return Frames(data, dead)


def decode(
    spark: SparkSession, lines: DataFrame, fmt: str, schema: str, source: str, count_bad: BadCounter = None
) -> Frames:
    """``lines`` (``file``, ``line``, ``raw``) parsed as ``fmt`` (``json`` or ``csv``) into the
    columns of ``schema`` (Spark DDL), and the dead letters (``source``, ``file``, ``line``,
    ``raw``, ``reason``). ``count_bad`` sees the frame of all records with a boolean ``_bad``."""
    struct = ddl_struct(spark, schema)
    parse = "from_json" if fmt == "json" else "from_csv"
    ddl = f"{schema}, _corrupt_record string".replace("'", "\\'")
    opts = "map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', '_corrupt_record'"
    opts += ", 'escape', '\"', 'nullValue', '\\u0000')" if fmt == "csv" else ")"  # RFC 4180, as io/textrecords.py
    bad = "_r IS NULL OR _r._corrupt_record IS NOT NULL"
    if fmt == "json":  # a declared field must be there (null is a value); looked up only when null
        nulls = " OR ".join(f"_r.`{f.name}` IS NULL" for f in struct)
        bad += f" OR (({nulls}) AND size(array_except({_names(struct)}, json_object_keys(raw))) > 0)"
    df = lines.selectExpr("file", "line", "raw", f"{parse}(raw, '{ddl}', {opts}) AS _r").selectExpr(
        "*", f"({bad}) AS _bad"
    )
    if count_bad is not None:
        df = count_bad(df)
    data = df.where("NOT _bad").selectExpr(*[f"_r.`{f.name}` AS `{f.name}`" for f in struct])
    dead = df.where("_bad").selectExpr(
        f"'{source}' AS source", "file", "line", "raw", f"{_reason_sql(fmt, struct)} AS reason"
    )
    return Frames(data, dead)


def ddl_struct(spark: SparkSession, ddl: str) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    t = _parse_datatype_string(ddl)
    assert isinstance(t, StructType)
    return t


def _reason_sql(fmt: str, struct: Any) -> str:
    """SQL naming the first field that does not fit, or saying the line is not JSON / CSV."""
    if fmt == "json":
        checks = [
            "CASE WHEN from_json(raw, 'map<string,string>') IS NULL THEN 'not a valid JSON object' END",
            f"CASE WHEN size(array_except({_names(struct)}, json_object_keys(raw))) > 0 THEN concat('missing "
            f"field(s): ', array_join(array_except({_names(struct)}, json_object_keys(raw)), ', ')) END",
        ]
        for f in struct:
            t = f.dataType.simpleString()
            text = f"get_json_object(raw, '$.{f.name}')"
            # a string does not cast to a nested type: parse the field's JSON text as one
            nested = t.startswith(("array<", "map<", "struct<"))
            parsed = f"from_json({text}, '{t}')" if nested else f"try_cast({text} AS {t})"
            checks.append(
                f"CASE WHEN {text} IS NOT NULL AND {parsed} IS NULL "
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


def _names(struct: Any) -> str:
    return "array(" + ", ".join("'" + f.name.replace("'", "\\'") + "'" for f in struct) + ")"
