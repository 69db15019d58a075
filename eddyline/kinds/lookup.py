"""``lookup: {table, key, table_key, how}``: enrich each row from a table in files.

The table is read whole and broadcast. Its version (a copy in the checkpoint, see
:mod:`eddyline.io.tables`) is pinned by the epoch's plan, so a replay joins against the
version the epoch first saw. Resident lanes read a Parquet table's pinned version on Arrow and
join on it as Spark's broadcast join does (:meth:`LookupKind.lane_run`).
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any, Literal

from pydantic import model_validator

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Files, Model, names
from eddyline.errors import SpecError
from eddyline.kinds.base import CompileContext, LaneFeed, StepKind

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from eddyline.api.steps import StepSpec


class Lookup(Model):
    """Enrich each row from a table in files (stream-to-table join), reloaded when it changes.

    The table is read whole and broadcast; each version used is copied into the checkpoint so
    that a replayed epoch joins against the version it first saw.
    """

    table: Files
    key: Columns
    table_key: Columns
    how: Literal["inner", "left"] = "inner"

    @model_validator(mode="after")
    def _arity(self) -> Lookup:
        if len(names(self.key)) != len(names(self.table_key)):
            raise ValueError("table_key: expected as many columns as key")
        return self


@STEPS.register
class LookupKind(StepKind):
    key = "lookup"
    params = Lookup

    def reads_plan(self, params: Any) -> bool:
        return True  # the table version the plan pins

    def pinned_table(self, params: Any) -> Files:
        """The files whose version the epoch plan pins."""
        return params.table

    def revisions(self, params: Any) -> str | None:
        return "a retraction could meet a newer version of the table than the row it takes back did"

    def resident_problem(self, step: StepSpec) -> str | None:
        table = step.params.table
        if table.format != "parquet":
            if table.schema_ is None:
                return (f"lookup.table: a {table.format} table's schema is inferred by Spark's reader, "
                        "which resident lanes do not run")
            return (f"lookup.table: a {table.format} table is parsed by Spark's reader (its nulls, malformed "
                    "values, quoting), which resident lanes do not run")
        if table.schema_ is not None:
            return "lookup.table: a parquet table with a declared schema is cast by Spark"
        return None

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        lk = step.params
        return [f"lookup in {lk.table.path} on {lk.key} = {lk.table_key}   [broadcast join, versioned table]"]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        from pyspark.sql import functions as F

        df = inputs[0]
        lk = step.params
        table = ctx.table(step)
        keys, tkeys = names(lk.key), names(lk.table_key)
        _columns_checked(step, df.columns, table.columns)
        renamed = table.select(*[F.col(c).alias(f"__lk_{i}") for i, c in enumerate(tkeys)], *[c for c in table.columns if c not in tkeys])
        cond = reduce(lambda a, b: a & b, [df[k] == renamed[f"__lk_{i}"] for i, k in enumerate(keys)])
        joined = df.join(F.broadcast(renamed), on=cond, how=lk.how)
        return joined.drop(*[f"__lk_{i}" for i in range(len(tkeys))])

    def lane_run(self, feed: LaneFeed, step: StepSpec, inputs: list[pa.Table]) -> pa.Table:
        """Spark's broadcast join of :meth:`compile` on the lane's rows: each row with every row
        of the pinned table version whose keys equal its keys (a null key matches nothing; a
        ``left`` lookup keeps a row without a match, its table columns null), in the lane's row
        order, matches in the table's order; the stream's columns, then the table's but its keys.
        Keys of two integer types are compared as BIGINT, as Spark widens them; keys of other
        differing types, of floating point (whose NaN and -0.0 Spark normalises) or nested are refused."""
        import numpy as np
        import pyarrow as pa

        (rows,) = inputs
        lk = step.params
        table = feed.table(step)
        keys, tkeys = names(lk.key), names(lk.table_key)
        _columns_checked(step, rows.column_names, table.column_names)
        left, right = [], []
        for k, tk in zip(keys, tkeys, strict=True):
            a, b = rows.schema.field(k).type, table.schema.field(tk).type
            if pa.types.is_floating(a) or pa.types.is_floating(b):
                raise SpecError(f"step '{step.name}': lookup.key: resident lanes do not join on floating point "
                                f"keys ('{k}' is {a}, '{tk}' is {b}; Spark normalises their NaN and -0.0)")
            if pa.types.is_nested(a) or pa.types.is_nested(b):
                raise SpecError(f"step '{step.name}': lookup.key: resident lanes join on scalar keys; '{k}' is {a}, "
                                f"table_key '{tk}' is {b}")
            if a != b and not (pa.types.is_integer(a) and pa.types.is_integer(b)):
                raise SpecError(f"step '{step.name}': lookup.key: resident lanes join keys of one type or of two "
                                f"integer types; '{k}' is {a}, table_key '{tk}' is {b} (Spark coerces them)")
            common = a if a == b else pa.int64()
            left.append(rows.column(k).cast(common))
            right.append(table.column(tk).cast(common))
        names_ = [f"__lk_{i}" for i in range(len(keys))]
        probe = pa.table([*left, pa.array(np.arange(rows.num_rows, dtype=np.int64))], names=[*names_, "__lk_row"])
        build = pa.table([*right, pa.array(np.arange(table.num_rows, dtype=np.int64))], names=[*names_, "__lk_match"])
        joined = probe.join(build, keys=names_, join_type="inner" if lk.how == "inner" else "left outer",
                            use_threads=False)  # (a null key matches nothing in Arrow's join too)
        joined = joined.sort_by([("__lk_row", "ascending"), ("__lk_match", "ascending")])
        at, match = joined.column("__lk_row"), joined.column("__lk_match")
        rest = [c for c in table.column_names if c not in tkeys]
        out = rows.take(at)
        for c in rest:
            column = table.column(c).take(match)
            out = out.append_column(table.schema.field(c).with_nullable(True), column)
        return out


def _columns_checked(step: StepSpec, stream: list[str], table: list[str]) -> None:
    """The keys exist on their sides and no other column is on both (SpecError naming the field)."""
    lk = step.params
    tkeys = names(lk.table_key)
    for what, cols, have in (("key", names(lk.key), stream), ("table_key", tkeys, table)):
        unknown = [c for c in cols if c not in have]
        if unknown:
            raise SpecError(f"step '{step.name}': lookup.{what}: unknown column '{unknown[0]}'; expected one of {', '.join(have)}")
    clash = sorted((set(table) - set(tkeys)) & set(stream))
    if clash:
        raise SpecError(
            f"step '{step.name}': lookup.table: column '{clash[0]}' is in both the stream and the table; "
            "rename it in the table or select it away upstream"
        )
