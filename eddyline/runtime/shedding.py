"""Shedding before stateful steps, as the epoch plan says: the rows dropped are a pure function of
the plan and the rows, so a replay drops the same ones.

Random shedding keeps a row when a hash of (epoch seed, row content) falls below the keep
fraction; semantic shedding keeps the rows whose utility reaches the quantile the plan carries
(last epoch's, observed here). Offered and kept rows are observed per input; a step that
``weighs_shed_rows`` (a window) gets the weight ``_w`` = 1 / keep of every kept row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eddyline.columns import WEIGHT
from eddyline.operators.shed import random_keep_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.control import Overload
    from eddyline.api.steps import StepSpec
    from eddyline.kinds.base import CompileContext

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
