"""``eddyline explain``: what one epoch of a network becomes on Spark."""

from __future__ import annotations

from eddyline.api.network import NetworkSpec
from eddyline.api.units import format_duration_ms
from eddyline.plan.keygroups import RoutingTable


def _ranges(kgs: list[int]) -> str:
    if not kgs:
        return "-"
    out, start, prev = [], kgs[0], kgs[0]
    for k in kgs[1:] + [None]:  # type: ignore[list-item]
        if k is not None and k == prev + 1:
            prev = k
            continue
        out.append(f"{start}" if start == prev else f"{start}–{prev}")
        if k is not None:
            start = prev = k
    return ", ".join(out)


def explain(
    spec: NetworkSpec, lanes: int, physical_plans: dict[str, str] | None = None, rewrites: list[str] | None = None
) -> str:
    """The network as one epoch runs it; ``physical_plans``: Spark's plan per sink, if known
    (see :func:`eddyline.runtime.compile.physical_plans`); ``rewrites``: how graph rewriting
    changed it or may change it, as lines."""
    lines = [
        f"network '{spec.name}' · {spec.key_groups} key groups per stateful step · {lanes} lanes · "
        f"trigger {format_duration_ms(spec.trigger)}",
        "",
        "sources (replayable; the epoch plan logs each slice):",
    ]
    for s in spec.sources:
        p = s.params
        cap = f", at most {s.max_rows_per_epoch} per epoch" if s.max_rows_per_epoch else ""
        lines.append(
            f"  {s.name}: {s.kind} {p.model_dump(exclude_defaults=True, by_alias=True)}; offsets = {s.info.offsets}{cap}"
        )
    lines += ["", "steps:"]
    for step in spec.steps:
        desc = step.info.describe(step, spec.key_groups)
        lines.append(f"  {step.name} ← {', '.join(step.inputs)}: {desc[0]}")
        lines += [f"    {d}" for d in desc[1:]]
        if step.stateful:
            table = RoutingTable.uniform(spec.key_groups, lanes)
            for lane in range(lanes):
                lines.append(f"    lane {lane} ← key groups {_ranges(table.key_groups_of(lane))}")
    lines += ["", "sinks (staged, published atomically per epoch, then the epoch commits):"]
    for sink in spec.sinks:
        lines.append(f"  {sink.name} ← {sink.input}: {sink.info.describe(sink.params)}")
    if rewrites:
        lines += ["", "graph rewriting:", *(f"  {x}" for x in rewrites)]
    for name, plan in (physical_plans or {}).items():
        lines += ["", f"Spark physical plan of one epoch, sink '{name}':", plan.rstrip()]
    return "\n".join(lines)
