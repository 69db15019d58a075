"""Shedding before stateful steps, as the epoch plan says: the rows dropped are a pure function of
the plan and the rows, so a replay drops the same ones.

Random shedding keeps a row when a hash of (epoch seed, row content) falls below the keep
fraction; semantic shedding keeps the rows whose utility reaches the quantile the plan carries
(last epoch's, observed here). Offered and kept rows are observed per input; a step that
``weighs_shed_rows`` (a window) gets the weight ``_w`` = 1 / keep of every kept row.

A resident lane sheds its share of the rows the same way on Arrow (:func:`shed_tables`): the
same rows are dropped, since a crashed epoch may be replayed in the other mode. The one
difference is the utility's quantiles, which Spark approximates (``percentile_approx``) and
the lanes' driver computes exactly (:func:`utility_quantiles`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from eddyline.columns import WEIGHT
from eddyline.hashing import hashable, spark_xxhash64_of_columns
from eddyline.operators.shed import keep_mask_random, random_keep_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.control import Overload
    from eddyline.api.steps import StepSpec
    from eddyline.kinds.base import CompileContext
    from eddyline.operators.sqlsteps import SqlStep

QUANTILES = ", ".join(str(q / 20) for q in range(21))


def shed_inputs(
    ctx: CompileContext, step: StepSpec, inputs: list[DataFrame], plan: dict[str, Any] | None, cfg: Overload
) -> tuple[list[DataFrame], dict[str, DataFrame]]:
    """The inputs after shedding, and per ``step:input`` the rows shed there (only when a shed
    sink keeps them)."""
    utility = cfg.utility.get(step.name)
    kept_inputs: list[DataFrame] = []
    shed_rows: dict[str, DataFrame] = {}
    for i, df in enumerate(inputs):
        keep = float(plan["keep"][i]) if plan else 1.0
        cond = "true"
        if keep < 1.0 and plan is not None:
            cut = (plan.get("thresholds") or [None] * len(inputs))[i]
            if plan["mode"] == "semantic" and utility is not None and cut is not None:
                cond = f"coalesce(({utility}) >= {cut!r}, false)"
            else:
                content = ", ".join(f"`{c}`" for c in df.columns)
                cond = random_keep_sql(f"xxhash64({content})", keep, int(plan["seed"]) + i)
        df = df.selectExpr("*", f"{cond} AS _keep")
        aggregates = ["count(1) AS offered", "count_if(_keep) AS kept"]
        if utility is not None:
            aggregates.append(f"percentile_approx(CAST(({utility}) AS DOUBLE), array({QUANTILES}), 1000) AS q")
        df = ctx.observe(df, f"shed:{step.name}:{i}", *aggregates)
        if cfg.shed_sink is not None and keep < 1.0:
            shed_rows[f"{step.name}:{i}"] = df.where("NOT _keep").drop("_keep").selectExpr(
                f"'{step.name}' AS _step", f"{i} AS _input", f"{ctx.epoch}L AS _epoch", "*"
            )
        df = df.where("_keep").drop("_keep")
        if step.info.weighs_shed_rows and cfg.estimate:
            weight = 1.0 / keep if (plan is not None and plan["mode"] == "random") else 1.0
            df = df.selectExpr("*", f"CAST({weight!r} AS DOUBLE) AS {WEIGHT}")
        kept_inputs.append(df)
    return kept_inputs, shed_rows


# ----------------------------------------------------------------------------- resident lanes


def shed_problem(cfg: Overload, step: StepSpec, schema: pa.Schema) -> str | None:
    """Why a resident lane cannot shed ``step``'s input of ``schema`` as Spark does (None: it
    can): a row's random decision hashes every column, and Spark's hash of nested types is not
    reproduced (:func:`eddyline.hashing.hashable`)."""
    for f in schema:
        if not hashable(f.type):
            return (f"step '{step.name}': shedding hashes every column of a row; column '{f.name}' is {f.type}, "
                    "which only Spark hashes")
    return None


@dataclass
class LaneShed:
    """What a lane's shedding gave of one epoch's inputs of one step: the rows kept, the
    observations (``shed:<step>:<input>``: offered, kept), the rows shed (when a shed sink keeps
    them, as the job's ``shed`` frames are) and each input's utility values (for the driver's
    quantiles, :func:`utility_quantiles`)."""

    inputs: list[pa.Table]
    observed: dict[str, dict[str, Any]] = field(default_factory=dict)
    shed: list[pa.Table] = field(default_factory=list)
    utility: dict[str, pa.Table] = field(default_factory=dict)


def shed_tables(step: StepSpec, inputs: list[pa.Table], plan: dict[str, Any] | None, cfg: Overload,
                epoch: int) -> LaneShed:
    """:func:`shed_inputs` on Arrow, for a resident lane's share of the rows: the same rows kept
    (random: Spark's ``xxhash64`` over the row's columns in numpy, then :func:`keep_mask_random`;
    semantic: the same condition, run by DuckDB), the same counts and weights."""
    utility = cfg.utility.get(step.name)
    out = LaneShed([])
    for i, rows in enumerate(inputs):
        keep = float(plan["keep"][i]) if plan else 1.0
        mask: np.ndarray | None = None  # None: every row kept
        values: pa.Table | None = None
        cut = None
        if keep < 1.0 and plan is not None:
            cut = (plan.get("thresholds") or [None] * len(inputs))[i]
            if not (plan["mode"] == "semantic" and utility is not None and cut is not None):
                inner = spark_xxhash64_of_columns(*rows.columns) if rows.num_rows else np.zeros(0, np.int64)
                mask = keep_mask_random(inner, keep, int(plan["seed"]) + i)
                cut = None
        if utility is not None or cut is not None:
            exprs = ((f"CAST(({utility}) AS DOUBLE) AS u",) if utility is not None else ()) + (
                (f"coalesce(({utility}) >= {cut!r}, false) AS k",) if cut is not None else ())
            values = _sql_step(step.name, exprs).run(rows)
            if cut is not None:
                mask = values.column("k").to_numpy(zero_copy_only=False).astype(bool)
            if utility is not None:
                out.utility[f"{step.name}:{i}"] = values.select(["u"])
        kept = rows if mask is None else rows.filter(pa.array(mask, pa.bool_()))
        out.observed[f"shed:{step.name}:{i}"] = {"offered": rows.num_rows, "kept": kept.num_rows}
        if cfg.shed_sink is not None and keep < 1.0 and mask is not None:
            dropped = rows.filter(pa.array(~mask, pa.bool_()))
            head = pa.table({"_step": pa.array([step.name] * dropped.num_rows, pa.string()),
                             "_input": pa.array(np.full(dropped.num_rows, i, np.int32)),
                             "_epoch": pa.array(np.full(dropped.num_rows, epoch, np.int64))})
            out.shed.append(pa.Table.from_arrays([*head.columns, *dropped.columns],
                                                 names=[*head.column_names, *dropped.column_names]))
        if step.info.weighs_shed_rows and cfg.estimate:
            weight = 1.0 / keep if (plan is not None and plan["mode"] == "random") else 1.0
            kept = kept.append_column(WEIGHT, pa.array(np.full(kept.num_rows, weight), pa.float64()))
        out.inputs.append(kept)
    return out


@functools.lru_cache(maxsize=32)
def _sql_step(name: str, expressions: tuple[str, ...]) -> SqlStep:
    """A shed point's utility (and cut) in DuckDB, kept while the lane runs: an epoch's cut is
    most often the last one's."""
    from eddyline.operators.sqlsteps import SqlStep

    return SqlStep(name, expressions=expressions)


def utility_quantiles(values: list[pa.Table]) -> list[float] | None:
    """The utility's quantiles 0, 0.05, ..., 1 among the lanes' values (nulls left out), exactly:
    for quantile ``q`` of ``n`` values the ``ceil(q n)``-th smallest (the first for 0), the value
    Spark's ``percentile_approx`` approximates (within 1/1000 of ``n`` in rank, accuracy 1000).
    None: no value."""
    col = pa.chunked_array([t.column("u") for t in values], pa.float64()).drop_null() if values else None
    if col is None or not len(col):
        return None
    ordered = np.sort(col.to_numpy())
    n = ordered.size
    ranks = [max(math.ceil(q / 20 * n), 1) for q in range(21)]
    return [float(ordered[r - 1]) for r in ranks]
