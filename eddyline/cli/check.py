"""``validate`` and ``explain``: a spec checked, and the plan it makes, before anything runs."""

from __future__ import annotations

from typing import Annotated

import typer

from eddyline.cli.common import Master, SpecArg, fail, load, spark
from eddyline.errors import CheckpointError, EddylineError


def validate(
    spec: SpecArg,
    offline: Annotated[bool, typer.Option(help="skip Spark's analysis of expressions and types")] = False,
    master: Master = None,
) -> None:
    """Check a spec: structure, graph, SQL expressions and types. Exit 2 when invalid."""
    try:
        net = load(spec)
        from eddyline.facade import check_inputs

        check_inputs(net)
        if not offline:
            from eddyline.facade import validate as analyze

            analyze(net, spark(master))
    except EddylineError as e:
        raise fail(e) from None
    typer.echo(f"ok: network '{net.name}': {len(net.sources)} sources, {len(net.steps)} steps, {len(net.sinks)} sinks")


def explain(
    spec: SpecArg,
    lanes: Annotated[int | None, typer.Option(help="lanes per stateful step")] = None,
    spark_plan: Annotated[bool, typer.Option(help="also print Spark's physical plan per sink")] = True,
    checkpoint: Annotated[str | None, typer.Option(
        help="explain the network this checkpoint runs now (after live changes and rewrites)")] = None,
    rules: Annotated[bool, typer.Option(help="list the graph rewriting rules and stop")] = False,
    master: Master = None,
) -> None:
    """Show the physical plan: Spark stages, pushed-down expressions, kernels, key groups → lanes."""
    from eddyline.kinds.rewrite import RULES
    from eddyline.plan.explain import explain as render

    if rules:
        for r in RULES.values():
            typer.echo(f"{r.name} ({r.kind} steps)\n  when: {r.condition}\n  does: {r.effect}")
        return
    try:
        net = load(spec)
        net, rewritten = _in_force(net, checkpoint) if checkpoint else (net, [])
        session = spark(master) if spark_plan else None
        n = lanes or net.lanes or (session.sparkContext.defaultParallelism if session else 2)
        plans = None
        if session is not None:
            from eddyline.runtime.compile import physical_plans

            plans = physical_plans(net, session, n)
        typer.echo(render(net, n, plans, rewritten + _may_rewrite(net)))
        typer.echo(_execution(net))
    except EddylineError as e:
        raise fail(e) from None


def _execution(net) -> str:  # noqa: ANN001
    """How Spark would run the network's epochs (docs/execution.md)."""
    from eddyline.io.sinks import make_sink
    from eddyline.io.sources import make_source
    from eddyline.runtime.residentmode import resident_problem

    why = resident_problem(net, {s.name: make_source(s) for s in net.sources}, {s.name: make_sink(s) for s in net.sinks})
    said = f"execution: {net.execution}"
    if why is None:
        return f"{said} (resident lanes take this network: execution: resident or auto runs it without a Spark job an epoch)"
    return f"{said} (resident lanes do not take it: {why})"


def _in_force(net, checkpoint: str):  # noqa: ANN202
    """The network ``checkpoint`` runs now, and the rewrites that made it, as lines."""
    from eddyline.api.validate import spec_from_raw
    from eddyline.runtime.checkpoint import Checkpoint

    ck = Checkpoint(checkpoint)
    meta = ck.metadata()
    if meta is None:
        raise CheckpointError(f"checkpoint {checkpoint!r}: no run has started there")
    applied = meta.get("applied")
    if applied:
        net = spec_from_raw(ck.read_network(applied["hash"]))
    lines = []
    for r in meta.get("rewrites", []):
        lines += [f"rewritten at epoch {r['epoch']} by {r['rule']} (step '{r['step']}'):", *(f"  {x}" for x in r["summary"])]
    return net, lines


def _may_rewrite(net) -> list[str]:  # noqa: ANN001
    """Where the network's enabled rewrite rules fit, as lines."""
    from eddyline.kinds.rewrite import fitting

    cfg = net.control.rewrite
    if cfg is None:
        return []
    raw, lines = net.as_dict(), []
    for s in net.stateful_steps():
        found = fitting(net, raw, s.name, cfg.rules)
        if found is not None:
            lines += [f"step '{s.name}' may be rewritten by {found[0]} when it is a hot spot:", *(f"  {x}" for x in found[1].summary)]
    return lines
