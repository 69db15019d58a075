"""``eddyline explain``: what one epoch of a network becomes on Spark."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eddyline.api.spec import NetworkSpec, StepSpec, format_duration_ms
from eddyline.plan.keygroups import RoutingTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def _describe_step(step: StepSpec, key_groups: int) -> list[str]:
    if step.filter is not None:
        return [f"filter  {step.filter}   [Spark SQL, JVM]"]
    if step.select is not None:
        return [f"select  {', '.join(step.select)}   [Spark SQL, JVM]"]
    if step.union is not None:
        return [f"union of {', '.join(step.union)}   [Spark union, no shuffle]"]
    if step.udf is not None:
        return [f"udf {step.udf.function} ({step.udf.batch} batches)   [Python, mapInArrow, no shuffle]"]
    if step.lookup is not None:
        return [f"lookup in {step.lookup.table.path} on {step.lookup.key} = {step.lookup.table_key}   [broadcast join, versioned table]"]
    wa = step.window_aggregate
    if wa is None:
        params = step.params.model_dump(exclude_defaults=True, by_alias=True)
        keyed = "both inputs keyed by their join keys, tagged _side" if step.join is not None else "rows keyed by key group"
        return [
            f"{step.kind}  {params}",
            f"  1. JVM: {keyed}; _kg = pmod(xxhash64(keys), {key_groups})",
            "  2. shuffle: repartition(lanes, routing value of _kg), one heartbeat row per lane",
            f"  3. Python per lane (mapInArrow): the {step.kind} kernel against its key groups' state",
        ]
    w = wa.window
    kind = f"sliding {format_duration_ms(w.size)} every {format_duration_ms(w.slide_ms)}" if w.slide else f"tumbling {format_duration_ms(w.size)}"
    keys = ", ".join(wa.keys) or "(global: one key group)"
    aggs = ", ".join(f"{n}={t}" for n, t in wa.aggregates.items())
    return [
        f"window_aggregate  key {keys}; {kind} on {wa.time}; {aggs}",
        f"  1. JVM: assign windows ({w.size // w.slide_ms} per row), drop windows past end + lateness "
        f"({format_duration_ms(wa.allowed_lateness)}), count late rows",
        f"  2. JVM: _kg = pmod(xxhash64({keys if wa.keys else ''}), {key_groups}); partial aggregates per (_kg, keys, window_start)",
        "  3. shuffle: repartition(lanes, routing value of _kg)   [lane i = partition i]",
        "  4. Python per lane (mapInArrow): load key-group state, merge partials, fire windows with "
        f"end <= watermark (delay {format_duration_ms(wa.watermark_delay)}), write state versions",
    ]


def explain(spec: NetworkSpec, lanes: int, spark: SparkSession | None = None) -> str:
    lines = [
        f"network '{spec.name}' · {spec.key_groups} key groups per stateful step · {lanes} lanes · "
        f"trigger {format_duration_ms(spec.trigger)}",
        "",
        "sources (replayable; the epoch plan logs each slice):",
    ]
    for s in spec.sources:
        p = s.params
        cap = f", at most {s.max_rows_per_epoch} per epoch" if s.max_rows_per_epoch else ""
        offsets = "file positions (name order)" if s.kind == "files" else "row numbers"
        lines.append(f"  {s.name}: {s.kind} {p.model_dump(exclude_defaults=True, by_alias=True)}; offsets = {offsets}{cap}")
    lines += ["", "steps:"]
    for step in spec.steps:
        desc = _describe_step(step, spec.key_groups)
        lines.append(f"  {step.name} ← {', '.join(step.inputs)}: {desc[0]}")
        lines += [f"    {d}" for d in desc[1:]]
        if step.stateful:
            table = RoutingTable.uniform(spec.key_groups, lanes)
            for lane in range(lanes):
                lines.append(f"    lane {lane} ← key groups {_ranges(table.key_groups_of(lane))}")
    lines += ["", "sinks (staged, published atomically per epoch, then the epoch commits):"]
    for sink in spec.sinks:
        target = sink.files.path + f" ({sink.files.format}, one epoch=N directory per epoch)" if sink.files else sink.kind
        lines.append(f"  {sink.name} ← {sink.input}: {target}")
    if spark is not None:
        from eddyline.runtime.compile import empty_epoch

        frames = empty_epoch(spark, spec, lanes)
        for sink in spec.sinks:
            plan = frames.nodes[sink.input]._jdf.queryExecution().executedPlan().toString()
            lines += ["", f"Spark physical plan of one epoch, sink '{sink.name}':", plan.rstrip()]
    return "\n".join(lines)
