"""The shape of what a ``postgres`` sink writes, from its input's Spark schema: each column with
its PostgreSQL type, the key, and whether the input carries revisions. Inputs the sink cannot
write are refused here, before anything touches the database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eddyline.api.units import names
from eddyline.columns import DIFF
from eddyline.errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql.types import StructField, StructType

    from eddyline.io.postgres.params import Postgres

#: the column of the target table that marks the rows of tentative epochs
TENTATIVE = "tentative"

# Spark type name -> (the type as PostgreSQL's format_type() prints it, the name COPY's binary
# format knows it by). The first is also valid DDL, so one spelling serves both purposes.
_TYPES: dict[str, tuple[str, str]] = {
    "LongType": ("bigint", "int8"),
    "IntegerType": ("integer", "int4"),
    "ShortType": ("smallint", "int2"),
    "ByteType": ("smallint", "int2"),
    "DoubleType": ("double precision", "float8"),
    "FloatType": ("real", "float4"),
    "StringType": ("text", "text"),
    "BooleanType": ("boolean", "bool"),
    "TimestampType": ("timestamp with time zone", "timestamptz"),
    "TimestampNTZType": ("timestamp without time zone", "timestamp"),
    "DateType": ("date", "date"),
    "BinaryType": ("bytea", "bytea"),
}


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # as format_type() prints it
    copy_type: str


@dataclass(frozen=True)
class Layout:
    """What the sink writes: the table's columns (the input's, without ``_op``) and the key."""

    columns: tuple[Column, ...]
    key: tuple[str, ...]
    changelog: bool  # the input carries revisions (a _diff column)
    tentative: bool = False  # the table has the column TENTATIVE, which the sink writes

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def copy_types(self) -> list[tuple[str, str]]:
        """Each column with the name COPY's binary format knows its type by."""
        return [(c.name, c.copy_type) for c in self.columns]


def column_of(field: StructField, sink: str) -> Column:
    from pyspark.sql.types import DecimalType

    t = field.dataType
    if isinstance(t, DecimalType):
        return Column(field.name, f"numeric({t.precision},{t.scale})", "numeric")
    known = _TYPES.get(type(t).__name__)
    if known is None:
        raise SinkError(
            f"sink '{sink}': column {field.name!r} has type {t.simpleString()}, which the postgres "
            "sink cannot write; cast it to a number, string, boolean, date, timestamp or binary"
        )
    return Column(field.name, *known)


def layout_of(schema: StructType, params: Postgres, sink: str, tentative: bool = False) -> Layout:
    key = names(params.key)
    present = set(schema.fieldNames())
    changelog = DIFF in present
    if tentative and TENTATIVE in present:
        raise SinkError(
            f"sink '{sink}': its input has a column {TENTATIVE!r}, the name of the column the "
            "sink adds to mark the rows of tentative epochs (its network has max_delay); rename "
            "the input's column"
        )
    if changelog and params.mode == "append":
        raise SinkError(
            f"sink '{sink}': its input carries revisions (column {DIFF}: +1 puts a row in, -1 "
            "takes it back); appending them would add a row per change. Use mode: upsert with "
            "key: <the input's key column(s)>, or a files sink (it keeps the _diff column)"
        )
    for k in key:
        if k not in present:
            raise SinkError(
                f"sink '{sink}': key column {k!r} is not in its input (columns: "
                f"{', '.join(f for f in schema.fieldNames() if f != DIFF)})"
            )
    columns = tuple(column_of(f, sink) for f in schema.fields if f.name != DIFF)
    return Layout(columns, key, changelog, tentative)
