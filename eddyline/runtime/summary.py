"""What a call of :meth:`Engine.run <eddyline.runtime.engine.Engine.run>` did (:class:`RunSummary`)
and what it carries from one turn of its loop to the next."""

from __future__ import annotations

from dataclasses import dataclass, field

from eddyline.runtime.epoch.records import ProgressRecord


@dataclass
class RunSummary:
    epochs: int = 0
    last_epoch: int = 0
    input_rows: int = 0
    output_rows: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    late_rows: int = 0
    replayed: int = 0
    #: keep-alive jobs run while idle, so Spark kept the lanes' Python workers (see WORKER_KEEPALIVE_S)
    worker_keepalives: int = 0

    def add(self, epoch: int, record: ProgressRecord, replayed: bool) -> None:
        r = record.to_json()
        self.epochs += 1
        self.last_epoch = epoch
        self.input_rows += r["numInputRows"]
        self.dead_letters += r["deadLetters"]
        self.late_rows += r["lateRows"]
        self.replayed += int(replayed)
        for s in r["sinks"]:
            self.output_rows[s["description"]] = self.output_rows.get(s["description"], 0) + s["numOutputRows"]


@dataclass
class RunState:
    """What one call of :meth:`Engine.run` carries from one turn of its loop to the next."""

    until_idle: bool
    started_at: float  # when the checkpoint's run started (wall clock): the planner's elapsed time
    summary: RunSummary = field(default_factory=RunSummary)
    prev_start: float | None = None  # when the last epoch started (monotonic)
    thawed: bool = False  # the heap was frozen by this run: thaw it when it ends
