"""Prometheus metrics, derived from the progress records (the one source of what an epoch did).

Every record a running network reports updates them (:meth:`Metrics.observe`); the dashboard
serves them at ``/metrics``. Counters count what the epochs reported since this process started
(Prometheus' usual reset on restart); gauges hold the last epoch's value.

======================================  ===========  ==============================================
name                                    type         from the progress record
======================================  ===========  ==============================================
``eddyline_epochs_total``               counter      one per record (``replayed`` epochs included)
``eddyline_input_rows_total``           counter      ``numInputRows``
``eddyline_source_input_rows_total``    counter      ``sources[].numInputRows``, label ``source``
``eddyline_source_discarded_total``     counter      ``sources[].discarded``: offsets the source no longer
                                                     held when read (a stream's limits), ``source``
``eddyline_output_rows_total``          counter      ``sinks[].numOutputRows``, label ``sink``
``eddyline_dead_letters_total``         counter      ``deadLetters``
``eddyline_late_rows_total``            counter      ``lateRows``
``eddyline_decisions_total``            counter      ``decisions[]``, labels ``step``, ``kind``
``eddyline_shed_rows_total``            counter      ``overload.shed`` offered − kept, label ``step``
``eddyline_epoch_duration_seconds``     histogram    ``durationMs.triggerExecution``
``eddyline_last_epoch``                 gauge        ``batchId``
``eddyline_watermark_seconds``          gauge        ``eventTime.watermark`` (Unix seconds)
``eddyline_backlog_rows``               gauge        ``backlog``, label ``source``
``eddyline_partition_lag``              gauge        ``sources[].lag`` (kafka): offsets a partition holds
                                                     beyond what was read, ``source``, ``partition``
``eddyline_state_rows``                 gauge        ``stateOperators[].numRowsTotal``, ``step``
``eddyline_state_bytes``                gauge        ``stateOperators[].memoryUsedBytes``, ``step``
``eddyline_lanes``                      gauge        ``routing.<step>.lanes``
``eddyline_lane_key_groups``            gauge        ``routing.<step>.keyGroupsPerLane``, ``lane``
``eddyline_lane_busy_seconds``          gauge        ``load.<step>.laneBusyMs``, ``step``, ``lane``
``eddyline_keep_fraction``              gauge        ``overload.shed.<step>.keep[i]``, ``step``, ``input``
``eddyline_estimate_relative_error``    gauge        ``overload.estimates.<step>``: mean 95 % half-width
                                                     / estimate, labels ``step``, ``aggregate``
``eddyline_lease_generation``           gauge        ``driver.generation``
``eddyline_leading``                    gauge        1 while this driver leads (``driver``)
``eddyline_follower_state``             gauge        1 for a hot follower's state; ``state``: joining,
                                                     copying, following (``driver.state``)
``eddyline_tentative``                  gauge        1 while the last epoch was tentative (DPC)
``eddyline_paused``                     gauge        1 while an operator's pause is in force
======================================  ===========  ==============================================
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: epoch durations span a few tens of milliseconds (tiny epochs) to minutes (a backlog)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.epochs = Counter("eddyline_epochs", "Epochs run (replays included)", registry=r)
        self.input_rows = Counter("eddyline_input_rows", "Rows the sources delivered", registry=r)
        self.source_rows = Counter("eddyline_source_input_rows", "Rows per source", ["source"], registry=r)
        self.discarded = Counter("eddyline_source_discarded", "Offsets a source no longer held when they were read",
                                 ["source"], registry=r)
        self.output_rows = Counter("eddyline_output_rows", "Rows written per sink", ["sink"], registry=r)
        self.dead_letters = Counter("eddyline_dead_letters", "Malformed records sent to dead letters", registry=r)
        self.late_rows = Counter("eddyline_late_rows", "Rows behind the watermark", registry=r)
        self.decisions = Counter("eddyline_decisions", "Control decisions taking effect", ["step", "kind"], registry=r)
        self.shed_rows = Counter("eddyline_shed_rows", "Rows dropped by load shedding", ["step"], registry=r)
        self.duration = Histogram("eddyline_epoch_duration_seconds", "Epoch wall time", buckets=DURATION_BUCKETS,
                                  registry=r)
        self.last_epoch = Gauge("eddyline_last_epoch", "The last epoch reported", registry=r)
        self.watermark = Gauge("eddyline_watermark_seconds", "The smallest watermark (Unix seconds)", registry=r)
        self.backlog = Gauge("eddyline_backlog_rows", "Input not read yet, per source", ["source"], registry=r)
        self.lag = Gauge("eddyline_partition_lag", "Offsets a partition holds beyond what was read (topic/partition)",
                         ["source", "partition"], registry=r)
        self.state_rows = Gauge("eddyline_state_rows", "State rows per stateful step", ["step"], registry=r)
        self.state_bytes = Gauge("eddyline_state_bytes", "State bytes per stateful step", ["step"], registry=r)
        self.lanes = Gauge("eddyline_lanes", "Lanes per stateful step", ["step"], registry=r)
        self.lane_kgs = Gauge("eddyline_lane_key_groups", "Key groups routed to a lane", ["step", "lane"], registry=r)
        self.lane_busy = Gauge("eddyline_lane_busy_seconds", "A lane's busy time in the last epoch", ["step", "lane"],
                               registry=r)
        self.keep = Gauge("eddyline_keep_fraction", "Fraction of a step's input kept by load shedding", ["step", "input"],
                          registry=r)
        self.estimate_error = Gauge("eddyline_estimate_relative_error",
                                    "Mean 95 % confidence half-width of an estimate behind a shed point, relative to it",
                                    ["step", "aggregate"], registry=r)
        self.generation = Gauge("eddyline_lease_generation", "The lease generation this driver runs under", registry=r)
        self.leading = Gauge("eddyline_leading", "1 while this driver leads", registry=r)
        self.follower = Gauge("eddyline_follower_state", "1 for a hot follower's state (joining, copying, following)",
                              ["state"], registry=r)
        self.tentative = Gauge("eddyline_tentative", "1 while the last epoch was tentative", registry=r)
        self.paused = Gauge("eddyline_paused", "1 while an operator's pause is in force", registry=r)
        self.store_requests = Counter("eddyline_store_requests", "Requests to the checkpoint's object store, "
                                      "by who made them (driver, lanes) and kind (GET, HEAD, PUT, COPY, DELETE, LIST)",
                                      ["by", "kind"], registry=r)

    def observe(self, record: dict[str, Any]) -> None:
        """Count one epoch's progress record in."""
        self.epochs.inc()
        self.input_rows.inc(record.get("numInputRows", 0))
        self.dead_letters.inc(record.get("deadLetters", 0))
        self.late_rows.inc(record.get("lateRows", 0))
        self.duration.observe(record["durationMs"]["triggerExecution"] / 1000)
        self.last_epoch.set(record["batchId"])
        watermark = (record.get("eventTime") or {}).get("watermark")
        if watermark and watermark != "end-of-stream":
            self.watermark.set(datetime.fromisoformat(watermark.replace("Z", "+00:00")).timestamp())
        for s in record.get("sources", []):
            self.source_rows.labels(s["description"]).inc(s.get("numInputRows", 0))
            if s.get("discarded"):
                self.discarded.labels(s["description"]).inc(s["discarded"])
            for partition, lag in (s.get("lag") or {}).items():
                self.lag.labels(s["description"], partition).set(lag)
        for source, rows in (record.get("backlog") or {}).items():
            self.backlog.labels(source).set(rows)
        for s in record.get("sinks", []):
            self.output_rows.labels(s["description"]).inc(s.get("numOutputRows", 0))
        for d in record.get("decisions", []):
            self.decisions.labels(d.get("step", ""), d.get("kind", "")).inc()
        for op in record.get("stateOperators", []):
            self.state_rows.labels(op["operatorName"]).set(op["numRowsTotal"])
            self.state_bytes.labels(op["operatorName"]).set(op["memoryUsedBytes"])
        for step, routing in (record.get("routing") or {}).items():
            self.lanes.labels(step).set(routing["lanes"])
            for lane, n in enumerate(routing.get("keyGroupsPerLane") or []):
                self.lane_kgs.labels(step, str(lane)).set(n)
        for step, load in (record.get("load") or {}).items():
            for lane, ms in enumerate(load.get("laneBusyMs") or []):
                self.lane_busy.labels(step, str(lane)).set(ms / 1000)
        overload = record.get("overload") or {}
        for step, shed in (overload.get("shed") or {}).items():
            for i, keep in enumerate(shed.get("keep") or []):  # one per input of the step
                self.keep.labels(step, str(i)).set(keep)
            self.shed_rows.labels(step).inc(max(sum(shed.get("offered") or []) - sum(shed.get("kept") or []), 0))
        for step, est in (overload.get("estimates") or {}).items():
            for name, a in (est.get("aggregates") or {}).items():
                if a.get("meanRelError") is not None:
                    self.estimate_error.labels(step, name).set(a["meanRelError"])
        driver = record.get("driver")
        if driver:
            self.generation.set(driver.get("generation") or 0)
            self.leading.set(0 if driver.get("role") == "follower" else 1)
            for state in ("joining", "copying", "following"):
                self.follower.labels(state).set(int(driver.get("role") == "follower" and driver.get("state") == state))
        self.tentative.set(1 if record.get("tentative") else 0)
        for by in ("driver", "lanes"):
            for kind, n in ((record.get("storeRequests") or {}).get(by) or {}).items():
                self.store_requests.labels(by, kind).inc(n)

    def set_paused(self, paused: bool) -> None:
        self.paused.set(1 if paused else 0)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
