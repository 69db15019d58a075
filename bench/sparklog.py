"""Where an engine's epochs (micro-batches) go, from Spark's event log.

Spark writes one JSON event a line to ``spark.eventLog.dir`` when ``spark.eventLog.enabled``
is set (``spark.eventLog.compress=false`` keeps it readable as it grows). :class:`EventLog`
reads what was added since its last read; :func:`profile` splits each epoch's wall time, given
as ``(start, end)`` in epoch seconds, into

* ``before_jobs``: from the epoch's start to its first Spark job (the engine's own planning and
  Spark planning the epoch's query),
* ``jobs``: the time at least one of the epoch's jobs ran,
* ``between_jobs`` and ``after_jobs``: the driver's time between and after them (observations,
  a second job's planning, the commit),

and each job's stages by what they run (the SQL operators of their RDDs, e.g. ``MapInArrow ·
Exchange``): their wall time and the summed run time of their tasks. A job belongs to the epoch
whose window holds its submission. Pure: JSON in, dicts out, no Spark.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: RDD scope names kept out of a stage's label: row-at-a-time operators every stage has, and
#: names of RDD plumbing rather than SQL operators
_QUIET = {"Project", "Filter", "CollectMetrics", "mapPartitionsInternal", "mapPartitions", "map",
          "DeserializeToObject", "SerializeFromObject", "WholeStageCodegen", "InputAdapter", "ColumnarToRow",
          "RowToColumnar", "AdaptiveSparkPlan", "ShuffleQueryStage", "AQEShuffleRead", "collect", "toArrow",
          "foreachPartition", "execute"}


@dataclass
class Stage:
    id: int
    label: str
    tasks: int = 0
    submitted: int | None = None  # ms
    completed: int | None = None
    task_ms: float = 0.0  # the tasks' executor run time, summed

    @property
    def wall_ms(self) -> float:
        return float(self.completed - self.submitted) if self.submitted is not None and self.completed is not None else 0.0


@dataclass
class Job:
    id: int
    submitted: int  # ms
    stage_ids: tuple[int, ...]
    completed: int | None = None


@dataclass
class Events:
    jobs: dict[int, Job] = field(default_factory=dict)
    stages: dict[int, Stage] = field(default_factory=dict)

    def add(self, e: dict[str, Any]) -> None:
        kind = e.get("Event")
        if kind == "SparkListenerJobStart":
            for info in e.get("Stage Infos", []):
                self._stage(info)
            self.jobs[e["Job ID"]] = Job(e["Job ID"], e["Submission Time"], tuple(e.get("Stage IDs", [])))
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in self.jobs:
            self.jobs[e["Job ID"]].completed = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            s = self._stage(info)
            s.submitted, s.completed = info.get("Submission Time"), info.get("Completion Time")
        elif kind == "SparkListenerTaskEnd":
            s = self.stages.get(e["Stage ID"])
            if s is not None:
                s.task_ms += float((e.get("Task Metrics") or {}).get("Executor Run Time", 0))

    def _stage(self, info: dict[str, Any]) -> Stage:
        sid = info["Stage ID"]
        if sid not in self.stages:
            self.stages[sid] = Stage(sid, stage_label(info.get("RDD Info", [])), info.get("Number of Tasks", 0))
        return self.stages[sid]


def stage_label(rdds: list[dict[str, Any]]) -> str:
    """The SQL operators a stage runs, each once, in the order its data first meets them (its
    RDDs by id), e.g. ``Scan csv · Exchange`` or ``Exchange · MapInArrow``."""
    names: list[str] = []
    for rdd in sorted(rdds, key=lambda r: r.get("RDD ID", 0)):
        scope = rdd.get("Scope")
        name = json.loads(scope).get("name", "") if scope else ""
        name = " ".join(name.split()[:2]) if name.startswith("Scan") else name.split(" ")[0]
        if name and name not in _QUIET and name not in names:
            names.append(name)
    return " · ".join(names) or "(no SQL operator)"


class EventLog:
    """Spark's event log of this application, read as it grows."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.events = Events()
        self._offset = 0
        self._path: Path | None = None

    @property
    def spark_conf(self) -> dict[str, str]:
        """The settings that make a new SparkSession write this log: one uncompressed file,
        readable as it grows."""
        return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(self.directory),
                "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}

    def read(self, spark: Any = None) -> Events:
        """Take in the events written since the last call (whole lines only). ``spark``: the
        session writing the log, whose listener bus is drained first, so that the events of the
        jobs it has run are written."""
        if spark is not None:
            spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        if self._path is None:
            found = sorted(p for p in self.directory.iterdir() if p.is_file())
            if not found:
                return self.events
            self._path = found[-1]
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].splitlines():
            if line.strip():
                self.events.add(json.loads(line))
        self._offset += end
        return self.events


def _union_ms(spans: Iterable[tuple[float, float]]) -> float:
    total, reach = 0.0, None
    for a, b in sorted(spans):
        if reach is None or a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def epoch_profile(events: Events, start_ms: float, end_ms: float) -> dict[str, Any]:
    """One epoch's wall time split as the module says, with its stages."""
    jobs = [j for j in events.jobs.values() if start_ms <= j.submitted < end_ms and j.completed is not None]
    wall = end_ms - start_ms
    if not jobs:
        return {"wall": wall, "before_jobs": wall, "jobs": 0.0, "between_jobs": 0.0, "after_jobs": 0.0,
                "job_count": 0, "stages": {}}
    spans = [(float(j.submitted), float(min(j.completed, end_ms))) for j in jobs]  # type: ignore[type-var]
    running = _union_ms(spans)
    before = min(a for a, _ in spans) - start_ms
    after = max(0.0, end_ms - max(b for _, b in spans))
    stages: dict[str, dict[str, float]] = {}
    for j in jobs:
        for sid in j.stage_ids:
            s = events.stages.get(sid)
            if s is None or s.completed is None:  # skipped (its output was already there)
                continue
            d = stages.setdefault(s.label, {"wall": 0.0, "task_ms": 0.0, "tasks": 0})
            d["wall"] += s.wall_ms
            d["task_ms"] += s.task_ms
            d["tasks"] += s.tasks
    return {"wall": wall, "before_jobs": before, "jobs": running, "between_jobs": max(0.0, wall - before - running - after),
            "after_jobs": after, "job_count": len(jobs), "stages": stages}


def profile(events: Events, windows: list[tuple[float, float]]) -> dict[str, Any]:
    """Medians over the epochs ``windows`` ((start, end) in epoch seconds) of :func:`epoch_profile`;
    a stage label's figures are medians over the epochs that ran it, with how many did."""
    per = [epoch_profile(events, a * 1000, b * 1000) for a, b in windows]
    if not per:
        return {}
    out: dict[str, Any] = {k: round(statistics.median(p[k] for p in per), 1)
                           for k in ("wall", "before_jobs", "jobs", "between_jobs", "after_jobs")}
    out["epochs"] = len(per)
    out["jobs_per_epoch"] = statistics.median(p["job_count"] for p in per)
    labels: dict[str, list[dict[str, float]]] = {}
    for p in per:
        for label, d in p["stages"].items():
            labels.setdefault(label, []).append(d)
    out["stages"] = {label: {"epochs": len(ds), "wall": round(statistics.median(d["wall"] for d in ds), 1),
                             "task_ms": round(statistics.median(d["task_ms"] for d in ds), 1),
                             "tasks": statistics.median(d["tasks"] for d in ds)}
                     for label, ds in sorted(labels.items(), key=lambda kv: -len(kv[1]))}
    return out
