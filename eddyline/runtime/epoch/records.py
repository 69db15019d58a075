"""What the epoch's stages hand each other. The plan and the commit are also what the checkpoint
stores (their JSON is the file format); the others live for one epoch.

::

    plan ──EpochPlan──▶ log ──▶ execute ──Staged──▶ publish ──▶ fold ──Folded──▶ commit ──EpochCommit
                                   (lanes leave LaneManifests)                      │
                                                                          report ──ProgressRecord
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from eddyline.ha.selector import Digest


@dataclass(frozen=True)
class EpochPlan:
    """Everything an epoch does, decided before it runs and logged, so a replay repeats it."""

    epoch: int
    sources: dict[str, dict[str, Any]]  # name -> {"start", "end", ...}
    watermarks: dict[str, int]  # stateful step -> watermark (ms) in force this epoch
    routing: dict[str, dict[str, Any]]  # stateful step -> RoutingTable.to_json()
    lanes: int
    end_of_stream: bool = False
    #: lookup step -> the table version this epoch joins against
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the control plane's decisions taking effect in this epoch (explained; see eddyline.control)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    #: stateful step -> {"keep": [per input], "seed", "mode", "thresholds"}: rows to shed
    shed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the controller's state once it planned this epoch, without the statistics (they are the
    #: last commit's): a replay continues from the two together
    control: dict[str, Any] = field(default_factory=dict)
    #: the lease generation of the driver that planned it (0: run without a lease)
    generation: int = 0
    #: Delay-Process-Correct (:mod:`eddyline.ha.dpc`): the sources this epoch's state lacks
    #: input from (their servers did not answer); its outputs are tentative. Empty: stable.
    tentative: list[str] = field(default_factory=list)
    #: the epoch of the commit this one continues from, when that is not the previous epoch
    #: (a correction continues from the last stable commit; 0: from the very start)
    base: int | None = None
    #: the tentative epochs whose outputs this epoch takes back before it publishes its own
    retracts: list[int] = field(default_factory=list)
    #: control lines (:mod:`eddyline.api.live`): every ``STEP.PARAM`` setting in force in this
    #: epoch, and the commands that took effect with it (id, settings, where they came from)
    settings: dict[str, Any] = field(default_factory=dict)
    applied: list[dict[str, Any]] = field(default_factory=list)
    #: the control stream's last file read once this epoch was planned (eddyline.runtime.commands)
    commands_cursor: str | None = None
    #: the network it runs (its hash; the checkpoint keeps it under networks/)
    network: str | None = None
    #: epochs whose retracted outputs this epoch puts back first (undoing a replay)
    restores: list[int] = field(default_factory=list)
    #: stateful step -> the watermark it moves to once it has taken in the epoch's rows (a step
    #: fed by stateful steps: theirs at the end of the epoch); the step commits it
    advance: dict[str, int] = field(default_factory=dict)
    planned_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpochPlan:
        return cls(**data)


@dataclass(frozen=True)
class StepCommit:
    """A stateful step's part of a commit."""

    index: dict[int, list]  # key group -> chain of state versions
    input_max: list[int]  # per input, the newest event time seen so far (ms)
    watermark: int  # reached in the epoch (:attr:`EpochPlan.advance`, else the one in force)
    routing: dict[str, Any]

    @property
    def max_event_time(self) -> int:
        """What the step's next watermark follows: the slowest input's newest event time."""
        return min(self.input_max)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": {str(k): v for k, v in self.index.items()},
            "input_max": self.input_max,
            "max_event_time": self.max_event_time,
            "watermark": self.watermark,
            "routing": self.routing,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepCommit:
        return cls(
            index={int(k): v for k, v in data["index"].items()},
            input_max=list(data["input_max"]),
            watermark=data["watermark"],
            routing=data["routing"],
        )


@dataclass(frozen=True)
class EpochCommit:
    """The single atomic step of an epoch: source offsets, state versions, watermarks, sink
    counts and the controller's state move forward together."""

    epoch: int
    source_ends: dict[str, int]
    steps: dict[str, StepCommit]
    sinks: dict[str, int]
    end_of_stream: bool = False
    #: per source, where reading resumes besides the offset (files: the last name read)
    cursors: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the controller's state after it observed this epoch (:class:`eddyline.control.state.ControllerState`)
    control: dict[str, Any] = field(default_factory=dict)
    #: the lease generation of the driver that committed it (0: run without a lease)
    generation: int = 0
    #: the sources this commit's state lacks input from (see :attr:`EpochPlan.tentative`)
    tentative: list[str] = field(default_factory=list)
    #: a tentative commit's last stable ancestor (0: none, the run started tentative)
    stable: int | None = None
    #: the control-line settings its epoch ran with (:attr:`EpochPlan.settings`)
    settings: dict[str, Any] = field(default_factory=dict)
    commands_cursor: str | None = None
    committed_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "steps": {name: s.to_json() for name, s in self.steps.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpochCommit:
        steps = {name: StepCommit.from_json(s) for name, s in data["steps"].items()}
        return cls(**{**data, "steps": steps})


@dataclass(frozen=True)
class LaneManifest:
    """What one lane's task left for the driver: its key groups' new state versions and the
    statistics the control plane and the progress report read (``data``: the whole file)."""

    data: dict[str, Any]

    @property
    def chains(self) -> dict[str, list]:
        return self.data["chains"]

    @property
    def input_rows(self) -> int:
        return int(self.data["input_rows"])

    @property
    def output_rows(self) -> int:
        return int(self.data["output_rows"])

    @property
    def state_rows(self) -> int:
        return int(self.data["state_rows"])

    @property
    def state_bytes(self) -> int:
        return int(self.data["state_bytes"])

    @property
    def metrics(self) -> dict[str, int]:
        return self.data.get("metrics", {})


@dataclass(frozen=True)
class Staged:
    """An executed epoch: every output staged (nothing published yet) and what it observed."""

    #: observation key -> values (see :class:`eddyline.runtime.compile.EpochFrames`)
    observed: dict[str, dict[str, Any]]
    sink_rows: dict[str, int]
    dead_letters: int
    #: stateful steps whose late rows were staged, and whether shed rows were
    late_steps: tuple[str, ...]
    shed_rows: bool
    #: seconds the epoch spent building its frames (planning Spark's work) and running it
    compile_s: float
    run_s: float
    #: per sink, its output's row count and row-hash sum, when the executor computes them (the
    #: stream selector of a hot pair compares them, see :mod:`eddyline.ha.selector`)
    digests: dict[str, Digest] = field(default_factory=dict)
    #: per stateful step, its lanes' manifests when the executor holds them already (resident
    #: lanes send them back); otherwise the fold reads the files the lanes' tasks wrote
    manifests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Folded:
    """The lanes' manifests folded per stateful step: the commit's part and the statistics."""

    steps: dict[str, StepCommit]
    manifests: dict[str, list[LaneManifest]]
    loads: dict[str, Any]  # step -> eddyline.control.stats.StepLoad
    output_rows: dict[str, int]
    late_rows: dict[str, int]


@dataclass(frozen=True)
class ProgressRecord:
    """One epoch's progress, shaped like Spark's StreamingQueryProgress (``to_json``) plus
    Eddyline's own sections (routing, load, decisions, overload)."""

    data: dict[str, Any]

    @property
    def input_rows(self) -> int:
        return int(self.data["numInputRows"])

    def with_input_rate(self, seconds_since_last_epoch: float) -> ProgressRecord:
        """The record with ``inputRowsPerSecond``: its input rows over the time since the
        previous epoch of this run started (0 for the first)."""
        s = seconds_since_last_epoch
        return ProgressRecord({**self.data, "inputRowsPerSecond": self.input_rows / s if s > 0 else 0.0})

    def with_refused(self, commands: list[dict[str, Any]]) -> ProgressRecord:
        """The record with the control commands refused while its epoch was planned."""
        return ProgressRecord({**self.data, "refused": commands})

    def to_json(self) -> dict[str, Any]:
        return self.data
