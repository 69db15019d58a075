"""The dashboard's sections, drawn on the server as HTML and SVG from the progress records.

Pure functions of (network, records, status): no JavaScript chart library is needed, nothing is
fetched at run time, and every picture can be tested without a browser. Each section is one
function returning an HTML fragment; :func:`sections` gives them all by element id. The network
drawn is the one in force when the page asks (a live ``apply``, an undo or a replay with another
network changes it); :func:`graph_shape` tells the page when to draw it again.

An SVG clips what it draws outside its box, so each picture is at least as wide as its own
labels (:func:`_text_width`), and each sits in a block of its own: an inline picture put the
routing strip beside the heat map, over the heat map's axis label.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from html import escape
from typing import Any

from eddyline.api.network import NetworkSpec
from eddyline.observe.commands import command_effects, describe_command

#: epochs shown in the heat maps and the epoch chart
WINDOW = 40
#: lane colours (routing strips, legend): distinguishable, also for common colour blindness
LANE_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")
STAGES = (("planning", "#9ecae9"), ("execution", "#4e79a7"), ("publish", "#f28e2b"), ("commit", "#59a14f"),
          ("cleanup", "#bab0ac"))
DECISION_MARKS = {"rescale": "R", "balance": "M", "spread": "S", "placement": "P", "chaos": "C", "rewrite": "W",
                  "overload": "O"}


def lane_colour(lane: int) -> str:
    return LANE_COLOURS[lane % len(LANE_COLOURS)]


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _text_width(text: str, px: int = 11) -> int:
    """About how wide ``text`` is drawn in the page's sans-serif at ``px`` (a little over, never under)."""
    return int(len(text) * px * 0.62) + 4


def _human(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


# ----------------------------------------------------------------------------- graph
def node_rates(record: dict[str, Any] | None) -> dict[str, float]:
    """Rows per second through each node the record measures, over the epoch's duration:
    sources (rows read), stateful steps (rows they received), sinks (rows written)."""
    if not record:
        return {}
    seconds = max(record["durationMs"]["triggerExecution"], 1.0) / 1000
    rates = {s["description"]: s.get("numInputRows", 0) / seconds for s in record.get("sources", [])}
    rates |= {op["operatorName"]: op.get("numRowsUpdated", 0) / seconds for op in record.get("stateOperators", [])}
    rates |= {s["description"]: s.get("numOutputRows", 0) / seconds for s in record.get("sinks", [])}
    return rates


def critical_path(net: NetworkSpec, record: dict[str, Any] | None) -> list[str]:
    """The source-to-sink path whose stateful steps' makespans (slowest lane's busy time) add up
    to the most: what bounds the epoch. The overload controller's own path when it reports one."""
    if record and (record.get("overload") or {}).get("criticalPath"):
        return list(record["overload"]["criticalPath"])
    if record is None:
        return []
    cost = {step: max(load.get("laneBusyMs") or [0.0]) for step, load in (record.get("load") or {}).items()}
    best: dict[str, tuple[float, list[str]]] = {s.name: (0.0, [s.name]) for s in net.sources}
    for step in net.topological():
        c, path = max((best[i] for i in step.inputs if i in best), key=lambda x: x[0], default=(0.0, []))
        best[step.name] = (c + cost.get(step.name, 0.0), [*path, step.name])
    ends = [(best[s.input][0], [*best[s.input][1], s.name]) for s in net.sinks if s.input in best]
    c, path = max(ends, key=lambda x: x[0], default=(0.0, []))
    return path if c > 0 else []


def graph_shape(net: NetworkSpec | None) -> str:
    """A short digest of what the graph draws (the nodes, their kinds, the edges): it changes
    when a change of network adds, removes or rewires a node."""
    if net is None:
        return "-"
    nodes = [("source", s.name, ()) for s in net.sources] + [(s.kind, s.name, tuple(s.inputs)) for s in net.steps] + [
        ("sink", s.name, (s.input,)) for s in net.sinks]
    return hashlib.sha256(repr(nodes).encode()).hexdigest()[:12]


def graph_svg(net: NetworkSpec, record: dict[str, Any] | None) -> str:
    """The network as boxes in columns (sources left, sinks right), each with its rate, the
    critical path in orange."""
    edges = [(i, s.name) for s in net.steps for i in s.inputs] + [(s.input, s.name) for s in net.sinks]
    depth: dict[str, int] = {s.name: 0 for s in net.sources}
    for step in net.topological():
        depth[step.name] = 1 + max((depth.get(i, 0) for i in step.inputs), default=0)
    last = max(depth.values(), default=0) + 1
    for sink in net.sinks:
        depth[sink.name] = last
    kinds = {s.name: "source" for s in net.sources} | {s.name: s.kind for s in net.steps} | {
        s.name: "sink" for s in net.sinks}
    stateful = {s.name for s in net.steps if s.stateful}
    columns: dict[int, list[str]] = {}
    for name in kinds:
        columns.setdefault(depth[name], []).append(name)
    w, h, gx, gy = 150, 48, 60, 18
    pos = {name: (12 + d * (w + gx), 12 + i * (h + gy)) for d, names in columns.items() for i, name in enumerate(names)}
    width = 24 + (last + 1) * (w + gx) - gx
    height = 24 + max(len(v) for v in columns.values()) * (h + gy) - gy
    rates = node_rates(record)
    hot = critical_path(net, record)
    on_path = set(zip(hot, hot[1:], strict=False))
    out = [f'<svg class="graph" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="network graph">']
    for a, b in edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        x1, y1, y2 = x1 + w, y1 + h / 2, y2 + h / 2
        colour, stroke = ("#e8710a", 3) if (a, b) in on_path else ("#999", 1.5)
        out.append(f'<path d="M{x1},{y1} C{x1 + gx / 2},{y1} {x2 - gx / 2},{y2} {x2},{y2}" fill="none" '
                   f'stroke="{colour}" stroke-width="{stroke}"/>')
    for name, (x, y) in pos.items():
        border = "#e8710a" if name in hot else "#555"
        fill = "#eef3fa" if name in stateful else "#fff"
        rate = f"{_human(rates[name])} rows/s" if name in rates else ""
        out.append(f'<g class="node" data-node="{_e(name)}"><rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" '
                   f'fill="{fill}" stroke="{border}" stroke-width="{2.5 if name in hot else 1}"/>'
                   f'<text x="{x + 8}" y="{y + 18}" font-weight="bold">{_e(name)}</text>'
                   f'<text x="{x + 8}" y="{y + 36}" class="dim">{_e(kinds[name])}{" · " + rate if rate else ""}</text></g>')
    out.append("</svg>")
    caption = (f'<p class="dim">critical path: {" → ".join(_e(n) for n in hot)}</p>' if hot
               else '<p class="dim">critical path: not measured yet</p>')
    return "".join(out) + caption


# ----------------------------------------------------------------------------- per step
def heatmap_svg(step: str, records: list[dict[str, Any]]) -> str:
    """Lanes (rows) x recent epochs (columns), shaded by the lane's busy time; above a column, a
    letter for each decision on the step that took effect in that epoch (M move, R rescale,
    S split, P placement, C drill, W rewrite)."""
    window = [r for r in records if step in (r.get("load") or {})][-WINDOW:]
    if not window:
        return f'<p class="dim">{_e(step)}: no epochs yet</p>'
    lanes = max(len(r["load"][step].get("laneBusyMs") or []) for r in window) or 1
    peak = max((max(r["load"][step].get("laneBusyMs") or [0.0]) for r in window), default=0.0) or 1.0
    cw, ch, top, left = 16, 16, 16, 44
    axis = f'epochs {window[0]["batchId"]}–{window[-1]["batchId"]} · darkest = {peak:.0f} ms'
    width, height = max(left + cw * len(window) + 4, left + _text_width(axis)), top + ch * lanes + 18
    out = [f'<svg class="heatmap" data-step="{_e(step)}" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="lane load of {_e(step)}">']
    for lane in range(lanes):
        out.append(f'<text x="2" y="{top + lane * ch + 12}" class="dim">lane {lane}</text>')
    for col, r in enumerate(window):
        busy = r["load"][step].get("laneBusyMs") or []
        x = left + col * cw
        for lane in range(lanes):
            if lane < len(busy):
                share = busy[lane] / peak
                out.append(f'<rect x="{x}" y="{top + lane * ch}" width="{cw - 1}" height="{ch - 1}" '
                           f'fill="rgba(214,39,40,{0.08 + 0.92 * share:.3f})"><title>epoch {r["batchId"]} lane {lane}: '
                           f'{busy[lane]:.0f} ms busy</title></rect>')
            else:
                out.append(f'<rect x="{x}" y="{top + lane * ch}" width="{cw - 1}" height="{ch - 1}" fill="#eee"/>')
        marks = [d for d in r.get("decisions", []) if d.get("step") == step]
        if marks:
            letters = "".join(DECISION_MARKS.get(d["kind"], "?") for d in marks)
            what = "; ".join(f'{d["kind"]} ({(d.get("why") or {}).get("reason", "")})' for d in marks)
            out.append(f'<text x="{x}" y="12" class="mark" data-epoch="{r["batchId"]}">{_e(letters)}'
                       f'<title>epoch {r["batchId"]}: {_e(what)}</title></text>')
    out.append(f'<text x="{left}" y="{height - 3}" class="dim axis">{_e(axis)}</text></svg>')
    return "".join(out)


def routing_svg(step: str, routing: dict[str, Any]) -> str:
    """Key groups in a row, each coloured by its lane; split key groups outlined."""
    assignment = routing.get("assignment") or []
    spread = {int(k) for k in (routing.get("spread") or {})}
    if not assignment:
        return ""
    per_row = 64
    cw = 9
    rows = (len(assignment) + per_row - 1) // per_row
    width, height = per_row * cw + 2, rows * cw + 2
    out = [f'<svg class="routing" data-step="{_e(step)}" data-version="{routing.get("version")}" '
           f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="key groups of {_e(step)} by lane">']
    for kg, lane in enumerate(assignment):
        x, y = 1 + (kg % per_row) * cw, 1 + (kg // per_row) * cw
        edge = ' stroke="#000" stroke-width="1.5"' if kg in spread else ""
        out.append(f'<rect x="{x}" y="{y}" width="{cw - 1}" height="{cw - 1}" fill="{lane_colour(lane)}"{edge}>'
                   f'<title>key group {kg} → lane {lane}</title></rect>')
    out.append("</svg>")
    legend = " ".join(f'<span class="swatch" style="background:{lane_colour(i)}"></span>lane {i} '
                      f'({n} key groups)' for i, n in enumerate(routing.get("keyGroupsPerLane") or []))
    return "".join(out) + f'<p class="dim">routing v{_e(routing.get("version"))}: {legend}</p>'


def steps_html(records: list[dict[str, Any]]) -> str:
    """Per stateful step: its lane-load heat map and its routing."""
    if not records:
        return '<p class="dim">no epochs yet</p>'
    last = records[-1]
    parts = []
    for step, routing in (last.get("routing") or {}).items():
        lanes = routing["lanes"]
        parts.append(f'<div class="step" id="step-{_e(step)}"><h3>{_e(step)} · {lanes} lane{"s" if lanes != 1 else ""}</h3>'
                     f'<div class="lanes">{heatmap_svg(step, records)}</div>'
                     f'<div class="keygroups">{routing_svg(step, routing)}</div></div>')
    return "".join(parts) or '<p class="dim">no stateful steps</p>'


# ----------------------------------------------------------------------------- epochs
def epochs_svg(records: list[dict[str, Any]]) -> str:
    """Each recent epoch's duration, split into its stages."""
    window = records[-WINDOW:]
    if not window:
        return '<p class="dim">no epochs yet</p>'
    peak = max(r["durationMs"]["triggerExecution"] for r in window) or 1.0
    top, axis = f"{peak:.0f} ms", f'epochs {window[0]["batchId"]}–{window[-1]["batchId"]}'
    bw, hgt, left = 14, 120, max(44, _text_width(top) + 4)
    width = max(left + bw * len(window) + 4, left + _text_width(axis))
    out = [f'<svg class="epochs" viewBox="0 0 {width} {hgt + 20}" width="{width}" height="{hgt + 20}" role="img" '
           f'aria-label="epoch durations"><text x="0" y="12" class="dim">{top}</text>'
           f'<text x="0" y="{hgt}" class="dim">0</text>']
    for col, r in enumerate(window):
        y = float(hgt)
        for stage, colour in STAGES:
            ms = r["durationMs"].get(stage, 0.0)
            h = hgt * ms / peak
            y -= h
            out.append(f'<rect x="{left + col * bw}" y="{y:.1f}" width="{bw - 2}" height="{h:.1f}" fill="{colour}">'
                       f'<title>epoch {r["batchId"]} {stage}: {ms:.0f} ms</title></rect>')
    out.append(f'<text x="{left}" y="{hgt + 16}" class="dim axis">{axis}</text></svg>')
    legend = " ".join(f'<span class="swatch" style="background:{c}"></span>{s}' for s, c in STAGES)
    return "".join(out) + f'<p class="dim">{legend}</p>'


def epochs_table(records: list[dict[str, Any]]) -> str:
    rows = []
    for r in reversed(records[-10:]):
        state = sum(op["numRowsTotal"] for op in r.get("stateOperators", []))
        flags = " ".join(f for f, on in (("replay", r.get("replayed")), ("tentative", r.get("tentative")),
                                          ("corrects " + ",".join(map(str, r.get("retracts") or [])), r.get("retracts")))
                         if on)
        rows.append(f'<tr><td>{r["batchId"]}</td><td>{_human(r["numInputRows"])}</td>'
                    f'<td>{r["durationMs"]["triggerExecution"]:.0f} ms</td><td>{_human(sum((r.get("backlog") or {}).values()))}</td>'
                    f'<td>{_e((r.get("eventTime") or {}).get("watermark") or "-")}</td><td>{_human(state)}</td>'
                    f'<td>{r.get("deadLetters", 0)}</td><td>{_e(flags)}</td></tr>')
    return ('<table><tr><th>epoch</th><th>input</th><th>duration</th><th>backlog</th><th>watermark</th>'
            f'<th>state rows</th><th>dead letters</th><th></th></tr>{"".join(rows)}</table>')


# ----------------------------------------------------------------------------- decisions
def decisions(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every decision of the records, newest first, with what was measured once known (the
    later records' ``recentDecisions`` carry it)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        for d in [*r.get("decisions", []), *r.get("recentDecisions", [])]:
            key = (d.get("epoch"), d.get("step"), d.get("kind"), str(d.get("action")))
            if key not in seen or d.get("measured"):
                seen[key] = d
    return sorted(seen.values(), key=lambda d: d.get("epoch", 0), reverse=True)


def _brief(d: dict[str, Any] | None, limit: int = 120) -> str:
    text = ", ".join(f"{k}={v}" for k, v in (d or {}).items() if k not in ("laneLoadMs", "scores", "laneBusyMs"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def decisions_html(records: list[dict[str, Any]]) -> str:
    """The controller's decisions and the operator's commands that took effect, newest first: a
    routing request that moved key groups is its decision (why: reason=operator); any other
    command, or a routing request that changed nothing, a row of kind ``operator`` saying so."""
    rows = [(int(d.get("epoch") or 0), _decision_row(d)) for d in decisions(records)]
    rows += [(e.epoch, _operator_row(e.command, e.epoch, e.text)) for e in command_effects(records).values()
             if not e.decisions]
    if not rows:
        return '<p class="dim">no decisions yet</p>'
    rows.sort(key=lambda row: row[0], reverse=True)
    return ('<table><tr><th>epoch</th><th>step</th><th>kind</th><th>action</th><th>why</th>'
            f'<th>expected makespan ms</th><th>measured</th></tr>{"".join(row for _, row in rows[:25])}</table>')


def _decision_row(d: dict[str, Any]) -> str:
    command = (d.get("why") or {}).get("command")
    by = f' data-command="{_e(command)}"' if command else ""
    return (f'<tr class="decision" data-kind="{_e(d.get("kind"))}"{by}><td>{d.get("epoch")}</td><td>{_e(d.get("step"))}</td>'
            f'<td>{_e(d.get("kind"))}</td><td>{_e(_brief(d.get("action")))}</td><td>{_e(_brief(d.get("why")))}</td>'
            f'<td>{_e((d.get("expected") or {}).get("makespanMs", "-"))}</td>'
            f'<td>{_e((d.get("measured") or {}).get("makespanMs", "pending"))}</td></tr>')


def _operator_row(c: dict[str, Any], epoch: int, effect: str) -> str:
    route = c.get("route") if isinstance(c.get("route"), dict) else {}
    steps = route.get("step") or ", ".join(sorted({str(k).split(".", 1)[0] for k in c.get("set") or {}})) or "-"
    why = f'operator: command {c.get("id")}' + (f' from {c["from"]}' if c.get("from") else "")
    if route:
        why += f" · {effect}"
    return (f'<tr class="decision" data-kind="operator" data-command="{_e(c.get("id"))}"><td>{epoch}</td>'
            f'<td>{_e(steps)}</td><td>operator</td><td>{_e(describe_command(c))}</td><td>{_e(why)}</td>'
            '<td>-</td><td>-</td></tr>')


# ----------------------------------------------------------------------------- the rest
def shedding_html(records: list[dict[str, Any]]) -> str:
    last = next((r for r in reversed(records) if r.get("overload")), None)
    if last is None:
        return '<p class="dim">no load shedding configured (control.overload)</p>'
    o = last["overload"]
    shed = "".join(f'<tr><td>{_e(s)}</td><td>{", ".join(f"{k:.3f}" for k in v.get("keep") or [])}</td>'
                   f'<td>{sum(v.get("offered") or [])}</td><td>{sum(v.get("kept") or [])}</td></tr>'
                   for s, v in (o.get("shed") or {}).items())
    quality = ", ".join(f'{_e(k)}: kept {v["keptFraction"]:.3f}' for k, v in (o.get("quality") or {}).items())
    lp = next((d["why"] for d in last.get("decisions", []) if d.get("kind") == "overload"), {})
    utility = (f' LP: expected utility {lp["expectedUtility"]} ({_e(lp.get("status", ""))}).'
               if "expectedUtility" in lp else "")
    errors = "".join(
        f'<tr class="estimate"><td>{_e(step)}</td><td>{_e(name)}</td><td>{e.get("windows", 0)}</td>'
        f'<td>{_pct(a.get("meanRelError"))}</td><td>{_pct(a.get("maxRelError"))}</td></tr>'
        for step, e in (o.get("estimates") or {}).items() for name, a in (e.get("aggregates") or {}).items())
    estimates = ('<table><tr><th>step</th><th>estimate</th><th>windows</th><th>mean ± (95 %)</th><th>largest ±</th>'
                 f'</tr>{errors}</table>' if errors else "")
    return (f'<p>epoch {last["batchId"]}: bound {o.get("boundMs")} ms, expected {o.get("expectedMs")} ms, measured '
            f'{o.get("measuredMs")} ms ({"within" if o.get("withinBound") else "over"} the bound); lag '
            f'{o.get("lagSeconds")} s</p><table><tr><th>step</th><th>keep fraction (per input)</th><th>offered</th><th>kept</th>'
            f'</tr>{shed}</table><p>quality per output: {quality or "-"}.{utility} Counts and sums behind a shed '
            'point are estimates: their confidence half-widths relative to the estimate, over the windows of '
            f'the epoch, below (each row of the output carries its own as <code>&lt;name&gt;_error</code>).</p>{estimates}')


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.2f} %"


def _lag(lag: dict[str, int] | None, shown: int = 3) -> str:
    """A partitioned source's most lagging partitions (kafka: ``topic/partition``), if any lag."""
    behind = sorted(((n, part) for part, n in (lag or {}).items() if n > 0), reverse=True)
    if not behind:
        return ""
    more = f", {len(behind) - shown} more" if len(behind) > shown else ""
    return f' <span class="dim">({", ".join(f"{_e(part)} {_human(n)}" for n, part in behind[:shown])}{more})</span>'


def io_html(records: list[dict[str, Any]]) -> str:
    if not records:
        return '<p class="dim">no epochs yet</p>'
    last = records[-1]
    def status(s: dict[str, Any]) -> str:  # a server's health, for sources and sinks that talk to one
        retries = f" ({s['retries']} retries)" if s.get("retries") else ""
        return f"{s.get('status') or 'ok'}{retries}"

    rows = []
    discarded: dict[str, int] = {}  # over the records shown: offsets gone before they were read
    for r in records:
        for s in r.get("sources", []):
            discarded[s["description"]] = discarded.get(s["description"], 0) + int(s.get("discarded") or 0)
    for s in last.get("sources", []):
        gone = discarded.get(s["description"], 0)
        lost = f'; <span class="error">{gone:,} discarded by the stream before they were read</span>' if gone else ""
        rows.append(f'<tr><td>source</td><td>{_e(s["description"])}</td><td>{_human(s.get("numInputRows", 0))}</td>'
                    f'<td>{_human(s.get("backlog", 0))}{_lag(s.get("lag"))}</td><td>{_e(status(s))}{lost}</td></tr>')
    for s in last.get("sinks", []):
        rows.append(f'<tr><td>sink</td><td>{_e(s["description"])}</td><td>{_human(s.get("numOutputRows", 0))}</td>'
                    f'<td></td><td>{_e(status(s))}</td></tr>')
    return ('<table><tr><th></th><th>name</th><th>rows this epoch</th><th>backlog</th><th>status</th></tr>'
            f'{"".join(rows)}</table>')


def status_html(records: list[dict[str, Any]], status: dict[str, Any]) -> str:
    last = records[-1] if records else None
    state = "paused" if status.get("paused") else "running" if status.get("live") else "stopped"
    parts = [f'<span class="badge {state}" id="run-state">{state}</span>']
    if last:
        parts.append(f'last epoch <b id="last-epoch">{last["batchId"]}</b> · {_human(last["numInputRows"])} rows · '
                     f'{last["durationMs"]["triggerExecution"]:.0f} ms')
    driver = (last or {}).get("driver") or status.get("lease")
    if driver:
        role = driver.get("role", "leader") + (f': {driver["state"]}' if driver.get("state") else "")
        parts.append(f'driver {_e(driver.get("holder"))} (<span id="driver-role">{_e(role)}</span>, lease generation '
                     f'{_e(driver.get("generation"))})')
    tentative = [r["batchId"] for r in records if r.get("tentative")]
    corrected = [r["batchId"] for r in records if r.get("retracts")]
    if tentative or corrected:
        parts.append(f"tentative epochs {tentative or '-'}, corrections at {corrected or '-'}")
    if last:
        state = sum(op["memoryUsedBytes"] for op in last.get("stateOperators", []))
        parts.append(f"state {state / 1e6:.1f} MB")
    return " · ".join(parts)


def commands_html(commands: list[dict[str, Any]], records: list[dict[str, Any]] | None = None) -> str:
    """The control calls, newest first, each with its outcome: for one applied, what it did once
    its epoch reported (the same words as its row in Decisions), or the epoch it takes effect in."""
    if not commands:
        return '<p class="dim">no control calls yet</p>'
    effects = command_effects(records or [])
    reported = max((r["batchId"] for r in records or []), default=0)

    def outcome(c: dict[str, Any]) -> str:
        done = c.get("outcome", "waiting")
        if done != "applied" or "pause" in c or "resume" in c:  # a pause is in force as soon as it is closed
            return str(done)
        effect = effects.get(str(c.get("id")))
        if effect is not None:
            return f"applied — {effect.text}" if "route" in c else "applied"
        return f"applied, takes effect in epoch {c['epoch']}" if int(c.get("epoch") or 0) > reported else "applied"

    rows = "".join(f'<tr data-command="{_e(c.get("id"))}"><td>{_e(c.get("id"))}</td><td>{_e(c.get("from", ""))}</td>'
                   f'<td>{_e(describe_command(c))}</td><td class="outcome">{_e(outcome(c))}</td><td>{_e(c.get("epoch", ""))}</td>'
                   f'<td>{_e(c.get("reason", ""))}</td></tr>'
                   for c in reversed(commands[-15:]))
    return ('<table><tr><th>id</th><th>from</th><th>what</th><th>outcome</th><th>epoch</th><th>reason</th></tr>'
            f"{rows}</table>")


def sections(net: NetworkSpec | None, records: list[dict[str, Any]], status: dict[str, Any],
             commands: list[dict[str, Any]]) -> dict[str, str]:
    """Every section of the page, by element id."""
    last = records[-1] if records else None
    return {
        "status": status_html(records, status),
        "graph": graph_svg(net, last) if net is not None else '<p class="dim">network unknown</p>',
        "steps": steps_html(records),
        "decisions": decisions_html(records),
        "shedding": shedding_html(records),
        "epochs": epochs_svg(records) + epochs_table(records),
        "io": io_html(records),
        "commands": commands_html(commands, records),
    }
