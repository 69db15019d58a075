"""``filter`` and ``select`` steps over Arrow, without Spark: their Spark SQL translated to DuckDB's.

The per-epoch-job engine runs these steps as Spark SQL in the JVM. A resident epoch
(:mod:`eddyline.runtime.residentmode`) runs no Spark job, so its stateless steps run here: the
expressions are parsed as Spark SQL by sqlglot, written as DuckDB SQL, and the few Spark functions
DuckDB lacks or names otherwise are rewritten on the way (:data:`SPARK_ONLY`). A translation is
checked against the input's schema when the step is compiled (:meth:`SqlStep.check`), so an
expression DuckDB cannot run is refused before the first epoch, naming the step and the
expression, never halfway through one.

Spark's ``TIMESTAMP`` is an instant; DuckDB's plain ``TIMESTAMP`` is a wall-clock time. Results
of DuckDB's are read as UTC instants, the time zone Eddyline's sessions run in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

#: Spark functions DuckDB names otherwise: Spark's name -> DuckDB's (same arguments)
SPARK_ONLY = {
    "timestamp_micros": "make_timestamp",
    "timestamp_millis": "epoch_ms",
    "unix_micros": "epoch_us",
    "unix_millis": "epoch_ms",
    "unix_seconds": "epoch",
}


class SqlStepError(ValueError):
    """An expression that cannot run on Arrow here (its message names what and why)."""


def duckdb_expression(spark_sql: str) -> str:
    """One Spark SQL expression (``a + 1 AS b``, a condition) as DuckDB SQL."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(spark_sql, read="spark")
    except sqlglot.errors.ParseError as e:
        raise SqlStepError(f"{spark_sql!r} is not Spark SQL: {str(e).splitlines()[0]}") from None

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Anonymous) and node.name.lower() in SPARK_ONLY:
            return exp.Anonymous(this=SPARK_ONLY[node.name.lower()], expressions=node.expressions)
        return node

    return tree.transform(rename).sql(dialect="duckdb")


@dataclass
class SqlStep:
    """A ``filter`` (``condition``) or a ``select`` (``expressions``) run by DuckDB over Arrow."""

    name: str
    condition: str | None = None
    expressions: tuple[str, ...] = ()
    _sql: str = field(init=False, default="")
    _con: Any = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.condition is None) == (not self.expressions):
            raise ValueError("a SQL step is a filter (condition) or a select (expressions)")
        try:
            if self.condition is not None:
                self._sql = f"SELECT * FROM input WHERE {duckdb_expression(self.condition)}"
            else:
                self._sql = "SELECT " + ", ".join(duckdb_expression(e) for e in self.expressions) + " FROM input"
        except SqlStepError as e:
            raise SqlStepError(f"step '{self.name}': {e}") from None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_con": None}  # a connection stays in its process (a lane opens its own)

    def check(self, schema: pa.Schema) -> pa.Schema:
        """The output schema for an input of ``schema``; :class:`SqlStepError` if DuckDB cannot
        run the step's SQL on it."""
        return self.run(schema.empty_table()).schema

    def run(self, table: pa.Table) -> pa.Table:
        import duckdb

        if self._con is None:
            self._con = duckdb.connect()
        self._con.register("input", table)
        try:
            out = self._con.sql(self._sql).to_arrow_table()
        except duckdb.Error as e:
            what = self.condition if self.condition is not None else ", ".join(self.expressions)
            raise SqlStepError(f"step '{self.name}': DuckDB cannot run {what!r} on Arrow "
                               f"({str(e).splitlines()[0]})") from None
        finally:
            self._con.unregister("input")
        return as_instants(out)


def as_instants(table: pa.Table) -> pa.Table:
    """DuckDB's wall-clock timestamps and views as the types Spark hands Python: timestamps in
    UTC, plain strings."""
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_timestamp(t) and t.tz is None:
            t = pa.timestamp(t.unit, tz="UTC")
        elif pa.types.is_string_view(t):
            t = pa.string()
        fields.append(f.with_type(t))
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)
