"""Stages 3–8 of one logged epoch, in order: execute, publish, fold, observe, commit, report.

The engine hands itself in as :class:`Parts`: the stages read the network's parts it holds
(which a change of network replaces between epochs) and tell its fault hook each boundary they
pass; they change nothing in it but its :class:`EpochClock` and the cleanup they start.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from eddyline import objectstore
from eddyline.errors import EddylineError, EngineError, task_error_line
from eddyline.runtime.epoch.commit import commit
from eddyline.runtime.epoch.fold import fold
from eddyline.runtime.epoch.observe import observe
from eddyline.runtime.epoch.publish import publish
from eddyline.runtime.epoch.report import Timings, report
from eddyline.runtime.faults import FaultPoint

if TYPE_CHECKING:
    from eddyline.api.network import NetworkSpec
    from eddyline.control.controller import Controller
    from eddyline.ha.lease import Lease
    from eddyline.io.sources import Source
    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.epoch.execute import Executor
    from eddyline.runtime.epoch.publish import Outputs
    from eddyline.runtime.epoch.records import EpochCommit, EpochPlan, ProgressRecord
    from eddyline.runtime.faults import Faults
    from eddyline.runtime.lookahead import LookAhead
    from eddyline.runtime.modes import Driver
    from eddyline.runtime.replica import HotPair
    from eddyline.runtime.upkeep import Cleanups


@dataclass
class EpochClock:
    """When the previous epoch of this process started, and whether one has run yet."""

    last_start: float | None = None
    cold: bool = True  # no epoch has run in this process yet
    #: this process's requests to object stores as of the previous epoch's report (or of the
    #: engine's making: the process may have made others before, another engine's among them)
    requests: Counter[str] = field(default_factory=lambda: objectstore.REQUESTS.copy())

    def store_requests(self) -> dict[str, int]:
        """The driver's requests to object stores since the previous epoch's report (its
        background work, a cleanup or a heartbeat, included)."""
        made = objectstore.requests_since(self.requests)
        self.requests = objectstore.REQUESTS.copy()
        return made

    def start(self) -> tuple[float, float]:
        """This epoch starts now: (now, seconds since the previous one started; 0 for the first)."""
        now = time.monotonic()
        wall_s = now - self.last_start if self.last_start is not None else 0.0
        self.last_start = now
        return now, wall_s


class Parts(Protocol):
    """What the stages use of the engine."""

    spec: NetworkSpec
    ckpt: Checkpoint
    executor: Executor
    lookahead: LookAhead
    outputs: Outputs
    controller: Controller
    sources: dict[str, Source]
    boundaries: Faults
    lease: Lease | None
    pair: HotPair | None
    driver: Driver
    retain_epochs: int
    cleanups: Cleanups
    clock: EpochClock

    @property
    def generation(self) -> int: ...

    def cleanup(self, epoch: int) -> None: ...


def run_stages(parts: Parts, plan: EpochPlan, last: EpochCommit | None, replayed: bool) -> tuple[EpochCommit, ProgressRecord]:
    """Stages 3–8 of the logged ``plan``, continuing from ``last``: the commit and its progress record."""
    t0, wall_s = parts.clock.start()
    staged = _execute(parts, plan, last)
    parts.boundaries.reached(FaultPoint.AFTER_STAGE, plan.epoch)
    t_run = time.monotonic()
    publish(parts.outputs, staged, plan, parts.boundaries)
    parts.boundaries.reached(FaultPoint.AFTER_PUBLISH, plan.epoch)
    t_pub = time.monotonic()
    folded = fold(parts.spec, parts.ckpt, plan, last, staged, wall_s)
    for name, load in folded.loads.items():
        if load.state_rows:
            parts.executor.bytes_per_row[name] = load.state_bytes / load.state_rows
    observed_ms = (time.monotonic() - t0) * 1000
    shed = observe(parts.controller, parts.spec, plan, staged, folded, observed_ms, wall_s, cold=parts.clock.cold)
    parts.clock.cold = False
    done = commit(
        parts.ckpt, plan, last, staged, folded, parts.controller.snapshot().model_dump(mode="json"), parts.boundaries,
        generation=parts.generation, exclusive=parts.lease is not None,
    )
    parts.boundaries.reached(FaultPoint.AFTER_COMMIT, plan.epoch)
    # upstream backup (Source.committed): what no later plan reads again; a correction
    # re-reads from the last stable commit (eddyline.ha.dpc)
    stable = done if not done.tentative else parts.ckpt.read_commit(done.stable) if done.stable else None
    for name, source in parts.sources.items():
        source.committed(stable.source_ends.get(name, 0) if stable else 0, stable.cursors.get(name) if stable else None)
    t_commit = time.monotonic()
    if plan.epoch % parts.retain_epochs == 0 or parts.spec.history_bytes is not None:  # a cap: every epoch
        parts.cleanups.start(parts.cleanup, plan.epoch)
    t_cleanup = time.monotonic()
    ms = Timings(
        planning=staged.compile_s * 1000,
        execution=(t_run - t0) * 1000 - staged.compile_s * 1000,
        publish=(t_pub - t_run) * 1000,
        commit=(t_commit - t_pub) * 1000,
        cleanup=(t_cleanup - t_commit) * 1000,
    )
    return done, report(
        parts.spec, parts.controller, plan, staged, folded, shed, ms, replayed, observed_ms, wall_s, _health(parts),
        driver=_driver(parts), mode=parts.driver.to_json(), committed_at=done.committed_at,
        execution={"mode": parts.executor.mode, **({"why": parts.executor.why} if parts.executor.why else {})},
        store_requests=parts.clock.store_requests(),
    )


def _execute(parts: Parts, plan: EpochPlan, last: EpochCommit | None) -> Any:
    """Stage 3, the epoch's Spark jobs; a failed task's own message surfaces as an :class:`EngineError`."""
    try:
        # the next epoch's look-ahead counts while this one's jobs run
        return parts.executor.execute(plan, last, before_jobs=parts.lookahead.start)
    except EddylineError:
        raise
    except Exception as e:  # a Spark job failed: surface our own message if a task left one
        if parts.lease is not None:  # or it failed because a driver that took over cleared our staging
            parts.lease.check()
        line = task_error_line(e)
        if line is None:
            raise
        raise EngineError(f"epoch {plan.epoch}: {line}") from e


def _health(parts: Parts) -> dict[str, dict[str, Any]]:
    """How the servers the sources and sinks talk to are doing, by source and sink name."""
    named: list[tuple[str, Callable[[], dict[str, Any] | None]]] = [
        *((n, s.status) for n, s in parts.sources.items()), *((n, s.status) for n, s in parts.outputs.sinks.items())]
    return {name: health for name, status in named if (health := status()) is not None}


def _driver(parts: Parts) -> dict[str, Any] | None:
    """Which driver runs the epoch: a hot pair's leader or follower, or the lease's holder."""
    if parts.pair is not None:
        return parts.pair.describe(leading=parts.lease is not None)
    return parts.lease.describe() if parts.lease is not None else None
