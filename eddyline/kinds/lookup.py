"""``lookup: {table, key, table_key, how}``: enrich each row from a table in files.

The table is read whole and broadcast. Its version (a copy in the checkpoint, see
:mod:`eddyline.runtime.tables`) is pinned by the epoch's plan, so a replay joins against the
version the epoch first saw.
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any, Literal

from pydantic import model_validator

from eddyline.api.steps import STEPS
from eddyline.api.units import Columns, Files, Model, names
from eddyline.errors import SpecError
from eddyline.kinds.base import CompileContext, StepKind

if TYPE_CHECKING:
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
        return ("a lookup joins the table version its epoch's plan pins, read by Spark's readers "
                "(their types, a CSV's or JSON's schema inferred); resident lanes do not read tables")

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        lk = step.params
        return [f"lookup in {lk.table.path} on {lk.key} = {lk.table_key}   [broadcast join, versioned table]"]

    def compile(self, ctx: CompileContext, step: StepSpec, inputs: list[DataFrame]) -> DataFrame:
        from pyspark.sql import functions as F

        df = inputs[0]
        lk = step.params
        table = ctx.table(step)
        keys, tkeys = names(lk.key), names(lk.table_key)
        for what, cols, have in (("key", keys, df.columns), ("table_key", tkeys, table.columns)):
            unknown = [c for c in cols if c not in have]
            if unknown:
                raise SpecError(f"step '{step.name}': lookup.{what}: unknown column '{unknown[0]}'; expected one of {', '.join(have)}")
        clash = sorted((set(table.columns) - set(tkeys)) & set(df.columns))
        if clash:
            raise SpecError(
                f"step '{step.name}': lookup.table: column '{clash[0]}' is in both the stream and the table; "
                "rename it in the table or select it away upstream"
            )
        renamed = table.select(*[F.col(c).alias(f"__lk_{i}") for i, c in enumerate(tkeys)], *[c for c in table.columns if c not in tkeys])
        cond = reduce(lambda a, b: a & b, [df[k] == renamed[f"__lk_{i}"] for i, k in enumerate(keys)])
        joined = df.join(F.broadcast(renamed), on=cond, how=lk.how)
        return joined.drop(*[f"__lk_{i}" for i in range(len(tkeys))])
