"""Stage 8, report: the epoch's progress record, shaped like Spark's StreamingQueryProgress plus
Eddyline's own sections (routing, load, decisions, overload)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from eddyline.api.network import NetworkSpec
from eddyline.control.controller import Controller
from eddyline.eventtime import iso_ms
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.epoch.observe import Shedding
from eddyline.runtime.epoch.records import EpochPlan, Folded, LaneManifest, ProgressRecord, Staged


@dataclass(frozen=True)
class Timings:
    """Milliseconds per stage of one epoch."""

    planning: float  # building the Spark plan of the epoch (the control plan came before)
    execution: float
    publish: float
    commit: float  # fold, observe and commit
    cleanup: float

    @property
    def total(self) -> float:
        return self.planning + self.execution + self.publish + self.commit + self.cleanup


def report(
    spec: NetworkSpec,
    controller: Controller,
    plan: EpochPlan,
    staged: Staged,
    folded: Folded,
    shed: Shedding | None,
    ms: Timings,
    replayed: bool,
    observed_ms: float,
    wall_s: float,
    status: dict[str, dict[str, Any]] | None = None,
    driver: dict[str, Any] | None = None,
    mode: dict[str, Any] | None = None,
    committed_at: float | None = None,
    store_requests: dict[str, int] | None = None,
    execution: dict[str, Any] | None = None,
) -> ProgressRecord:
    """``observed_ms``: the epoch's duration as the overload controller observed it (up to the
    commit); ``wall_s``: seconds since the previous epoch started; ``status``: per source and
    sink name that talks to a server, how that server is doing; ``driver``: which driver leads
    (its lease), if it runs under one; ``mode``: the driver's mode and how it came to it
    (:meth:`eddyline.runtime.modes.Driver.to_json`); ``committed_at``: when the commit was written (Unix s),
    the moment the epoch's outputs count as delivered; ``store_requests``: the driver's requests to
    an object store since the previous epoch, by kind (the lanes' come with their manifests);
    ``execution``: how Spark ran the epoch (a job, or resident lanes) and, where ``auto`` chose
    jobs, why."""
    status = status or {}
    input_rows = sum(int(staged.observed.get(f"source:{s.name}", {}).get("rows") or 0) for s in spec.sources)
    total = ms.total
    watermark = min(plan.watermarks.values()) if plan.watermarks else None
    record = {
        "id": spec.name,
        "batchId": plan.epoch,
        "timestamp": iso_ms(int(time.time() * 1000)),
        **({"committedAt": iso_ms(int(committed_at * 1000))} if committed_at is not None else {}),
        "replayed": replayed,
        "numInputRows": input_rows,
        "processedRowsPerSecond": input_rows / (total / 1000) if total else 0.0,
        "durationMs": {
            "triggerExecution": round(total, 1),
            "planning": round(ms.planning, 1),
            "execution": round(ms.execution, 1),
            "publish": round(ms.publish, 1),
            "commit": round(ms.commit, 1),
            "cleanup": round(ms.cleanup, 1),
        },
        "triggerMs": spec.trigger,
        "eventTime": {"watermark": iso_ms(watermark)},
        "stateOperators": [
            _state_operator(name, manifests, folded.late_rows[name], folded.loads[name].spilled_bytes)
            for name, manifests in folded.manifests.items()
        ],
        "sources": [
            {
                "description": n,
                "startOffset": s["start"],
                "endOffset": s["end"],
                "numInputRows": int(staged.observed.get(f"source:{n}", {}).get("rows") or 0),
                # resident lanes read their own shares (eddyline.runtime.lanenetwork)
                **({"rowsByLane": staged.observed[f"source:{n}"]["lanes"]}
                   if "lanes" in staged.observed.get(f"source:{n}", {}) else {}),
                **({"backlog": s.get("backlog", 0), **status[n]} if n in status else {}),
                **({"discarded": s["discarded"]} if s.get("discarded") else {}),
                **({"lag": s["lag"]} if s.get("lag") else {}),  # per partition (kafka)
            }
            for n, s in plan.sources.items()
        ],
        "sinks": [
            {"description": n, "numOutputRows": r, **status.get(n, {})} for n, r in staged.sink_rows.items()
        ],
        "deadLetters": staged.dead_letters,
        "lateRows": sum(folded.late_rows.values()),
        "routing": {n: _routing_summary(r) for n, r in plan.routing.items()},
        "load": {n: load.to_json() for n, load in folded.loads.items()},
        "decisions": plan.decisions,
        "recentDecisions": controller.manager.recent(5),
        **({"overload": _overload(spec, controller, plan, staged, shed, observed_ms, wall_s)} if shed is not None else {}),
        "backlog": {n: s.get("backlog", 0) for n, s in plan.sources.items()},
        "endOfStream": plan.end_of_stream,
    }
    lanes = _lane_requests(folded)
    if store_requests or lanes:
        driver_made = store_requests or {}
        record["storeRequests"] = {"driver": driver_made, "lanes": lanes,
                                   "total": dict(Counter(driver_made) + Counter(lanes))}
    if driver is not None:
        record["driver"] = driver
    if mode is not None:
        record["mode"] = mode
    if execution is not None:
        record["execution"] = execution
    if plan.settings or plan.applied:  # control lines (eddyline.api.live)
        record["settings"] = plan.settings
        record["applied"] = plan.applied  # the commands that took effect in this epoch
    if plan.tentative or plan.retracts:  # Delay-Process-Correct (eddyline.ha.dpc)
        record["tentative"] = plan.tentative  # its outputs lack these sources' input
        record["retracts"] = plan.retracts  # the tentative epochs whose outputs it took back
    return ProgressRecord(record)


def _state_operator(name: str, manifests: list[LaneManifest], late: int, spilled: int) -> dict[str, Any]:
    ms = [m.data for m in manifests]
    return {
        "operatorName": name,
        "numRowsTotal": sum(m.state_rows for m in manifests),
        "numRowsUpdated": sum(m.input_rows for m in manifests),
        "memoryUsedBytes": sum(m.state_bytes for m in manifests),
        "numRowsDroppedByWatermark": late,
        "customMetrics": {
            "stateBytesWritten": sum(m["bytes_written"] for m in ms),
            "snapshots": sum(m["snapshots"] for m in ms),
            "deltas": sum(m["deltas"] for m in ms),
            "cacheHits": sum(m["cache_hits"] for m in ms),
            "cacheMisses": sum(m["cache_misses"] for m in ms),
            "spilledBytes": spilled,
            "stateSlices": sum(m.get("slices", 1) for m in ms),
            "workerPeakRssBytes": max((m["memory"]["peak"]["rss"] for m in ms if "memory" in m), default=0),
            **_summed_metrics(manifests),
            "laneMs": [m["ms"] for m in ms],
            "laneCpuMs": [m.get("cpu_ms", {}) for m in ms],
            "laneWarming": [bool(m.get("warming_at_start")) for m in ms],
            "laneGc": [m.get("gc", {}) for m in ms],
            "laneMemory": [m["memory"] for m in ms if "memory" in m],
            "laneInputRows": [m["input_rows"] for m in ms],
        },
    }


def _overload(
    spec: NetworkSpec,
    controller: Controller,
    plan: EpochPlan,
    staged: Staged,
    shed: Shedding,
    duration_ms: float,
    wall_s: float,
) -> dict[str, Any]:
    """The overload section: the bound, the prediction against the measurement, what was shed
    and the quality of each query output (the fraction of its input rows kept)."""
    overload = controller.overload
    assert overload is not None
    quality = {}
    for sink in spec.sinks:
        ratio = 1.0
        for a in sorted(n for n in spec.upstream(sink.input) if getattr(spec.node(n), "stateful", False)):
            o, k = sum(shed.offered.get(a, [])), sum(shed.kept.get(a, []))
            if o:
                ratio *= k / o
        quality[sink.name] = {"shedFraction": round(1 - ratio, 4), "keptFraction": round(ratio, 4)}
    expected = next((d["why"].get("predictedMs") for d in plan.decisions if d["kind"] == "overload"), None)
    read = sum(int(staged.observed.get(f"source:{s.name}", {}).get("rows") or 0) for s in spec.sources)
    arrival = read / wall_s if wall_s > 0 else 0.0
    backlog = sum(int(s.get("backlog", 0)) for s in plan.sources.values())
    return {
        "boundMs": overload.bound_ms,
        "withinBound": duration_ms <= overload.bound_ms,
        "expectedMs": expected,
        "measuredMs": round(duration_ms, 1),
        "lagSeconds": round(backlog / arrival, 2) if arrival else None,
        "criticalPath": overload.critical_path(),
        "shed": {
            s: {"keep": v["keep"], "offered": shed.offered.get(s), "kept": shed.kept.get(s)}
            for s, v in plan.shed.items()
        },
        "quality": quality,
        "estimates": _estimates(staged.observed),
        "hotSpots": overload.hot_spots(),
    }


def _estimates(observed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per window step behind a shed point: the windows it emitted and, per estimated aggregate,
    the mean and largest confidence half-width relative to the estimate (0.05: ±5 %)."""
    out: dict[str, Any] = {}
    for key, got in observed.items():
        if not key.startswith("estimates:"):
            continue
        aggs: dict[str, dict[str, float | None]] = {}
        for field, value in got.items():
            stat, _, name = field.partition(":")
            if name:
                rounded = None if value is None else round(float(value), 5)
                aggs.setdefault(name, {})["meanRelError" if stat == "mean" else "maxRelError"] = rounded
        out[key.split(":", 1)[1]] = {"windows": int(got.get("rows") or 0), "aggregates": aggs}
    return out


def _routing_summary(routing: dict[str, Any]) -> dict[str, Any]:
    table = RoutingTable.from_json(routing)
    return {
        "version": table.version,
        "lanes": table.lanes,
        "keyGroupsPerLane": [len(table.key_groups_of(i)) for i in range(table.lanes)],
        "spread": {str(k): [table.assignment[k], *v] for k, v in table.spread.items()},
        "assignment": list(table.assignment),  # key group -> lane (the dashboard draws it)
    }


def _lane_requests(folded: Folded) -> dict[str, int]:
    """The lanes' requests to an object store in the epoch, by kind, over every step."""
    made: Counter[str] = Counter()
    for manifests in folded.manifests.values():
        for m in manifests:
            made.update(m.data.get("store_requests") or {})
    return dict(made)


def _summed_metrics(manifests: list[LaneManifest]) -> dict[str, int]:
    """Kernel counters (windows fired, matches, ...) summed over lanes, camelCased for progress."""
    out: dict[str, int] = {}
    for m in manifests:
        for k, v in m.metrics.items():
            name = k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:])
            out[name] = out.get(name, 0) + int(v)
    return out
