"""What the driver does besides epochs: cleaning the checkpoint up behind the retained epochs
(in a background thread), keeping Spark's idle Python workers alive, and freezing its heap.

:func:`cleanup_plan` decides what a cleanup removes (pure over the commits it is given);
:func:`clean` removes it; :class:`Cleanups` runs one cleanup at a time beside the epochs.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eddyline.errors import CheckpointError
from eddyline.state.store import KeyGroupStore, drop_state, history_floor, state_steps

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.epoch.records import EpochCommit

#: PySpark stops a Python worker that has been idle for a minute (a constant in Spark's
#: PythonWorkerFactory, not a setting). The next epoch then starts new workers, which have lost
#: the lanes' state cache and must reload it (docs/perf-notes.md has the figures). An engine with
#: nothing to do for this long runs a tiny job on every core's worker instead.
WORKER_KEEPALIVE_S = 40.0


def touch_python_workers(spark: SparkSession) -> list[int]:
    """Run one keep-alive task per core, each in an idle Python worker of Spark's pool (which
    restarts its idle clock); returns the worker processes' ids."""
    from eddyline.runtime.lanes import keep_warm

    cores = spark.sparkContext.defaultParallelism
    rows = spark.range(0, cores, 1, cores).mapInArrow(keep_warm, "pid long").collect()
    return sorted(r.pid for r in rows)


class WarmWorkers:
    """While the engine waits for input, keeps Spark's Python workers (and the state they
    cache) alive: once ``keepalive_s`` passed since they last ran a task of ours, one
    keep-alive task per core (None: never)."""

    def __init__(self, keepalive_s: float | None) -> None:
        self.keepalive_s = keepalive_s
        self.used_at = time.monotonic()  # when Python workers last ran a task of ours
        self.pids: list[int] = []  # the Python workers the last keep-alive job ran in

    def used(self) -> None:
        self.used_at = time.monotonic()

    def touch(self, spark: SparkSession) -> int:
        """Returns the number of jobs run (0 or 1)."""
        if self.keepalive_s is None or time.monotonic() - self.used_at < self.keepalive_s:
            return 0
        self.used_at = time.monotonic()
        try:
            self.pids = touch_python_workers(spark)
        except Exception:  # only a speed-up: if Spark cannot run it, the next epoch reports why
            return 0
        return 1


@dataclass(frozen=True)
class CleanupPlan:
    """What a cleanup removes: everything epochs before ``keep_from`` left behind."""

    keep_from: int
    kept: list[EpochCommit]  # the commits from keep_from on, whose state files stay
    running: list[str]  # the stateful steps in force: files no kept commit names go
    dropped: list[str]  # steps a live change removed that no kept commit has: their state goes


def cleanup_plan(
    epoch: int,
    every: Sequence[EpochCommit],
    *,
    retain: int,
    within_ms: int | None,
    running: list[str],
    stored: Callable[[], list[str]],
    floor: Callable[[int], int] | None = None,
) -> CleanupPlan | None:
    """The cleanup after ``epoch``: the last ``retain`` epochs stay, and those committed within
    ``within_ms`` of the newest; ``floor`` (a state cap) may raise the first kept epoch. None:
    nothing is kept, so nothing is cleaned. ``stored``: the steps with state in the checkpoint."""
    keep_from = epoch - retain + 1
    if within_ms is not None and every:  # also what was committed within that long
        newest = max(c.committed_at for c in every)
        keep_from = min([keep_from, *(c.epoch for c in every if c.committed_at >= newest - within_ms / 1000)])
    if floor is not None:  # the oldest epochs go until their state fits the cap
        keep_from = floor(keep_from)
    # a tentative stretch may outlast the retained epochs: its correction continues from
    # the stable commit before it, which must stay (eddyline.ha.dpc)
    anchors = [c.stable for c in every if c.epoch >= keep_from and c.tentative and c.stable is not None]
    keep_from = min([keep_from, *anchors])
    kept = [c for c in every if c.epoch >= keep_from]
    if not kept:
        return None
    # a step a live change removed: its state goes once no kept commit has it (until then
    # a replay or an undo may go back to it)
    dropped = [n for n in stored() if n not in running and not any(n in c.steps for c in kept)]
    return CleanupPlan(keep_from, kept, running, dropped)


def clean(ckpt: Checkpoint, epoch: int, retain: int, within_ms: int | None, cap: int | None,
          running: list[str]) -> int | None:
    """Carry the cleanup after ``epoch`` out; returns the first epoch kept (None: none)."""
    import pyarrow as pa

    every = ckpt.commits()
    floor = None
    if cap is not None:
        def floor(keep_from: int) -> int:
            return history_floor(ckpt.location, [(c.epoch, {n: s.index for n, s in c.steps.items()}) for c in every],
                                 keep_from, cap)
    plan = cleanup_plan(epoch, every, retain=retain, within_ms=within_ms, running=running,
                        stored=lambda: state_steps(ckpt.location), floor=floor)
    if plan is None:
        return None
    for name in plan.running:
        # The schema does not matter for cleanup; only the file names and chains do.
        store = KeyGroupStore(ckpt.location, name, pa.schema([("_kg", pa.int32())]), ["_kg"])
        store.cleanup([c.steps[name].index for c in plan.kept if name in c.steps], below_epoch=plan.keep_from)
    for name in plan.dropped:
        drop_state(ckpt.location, name)
    ckpt.forget_before(plan.keep_from)
    ckpt.forget_progress()
    return plan.keep_from


class _Cleaner(threading.Thread):
    """One checkpoint cleanup in a background thread; keeps its error for the engine."""

    def __init__(self, clean: Callable[[int], None], epoch: int) -> None:
        super().__init__(name=f"eddyline-cleanup-{epoch}", daemon=True)
        self.clean, self.epoch = clean, epoch
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.clean(self.epoch)
        except BaseException as e:  # handed to the engine's thread by Cleanups.finish
            self.error = e


class Cleanups:
    """One cleanup at a time, beside the next epochs.

    The files a cleanup deletes belong to epochs no retained commit or plan refers to, and a
    new epoch only writes new files, so the two never touch the same file."""

    def __init__(self) -> None:
        self._cleaner: _Cleaner | None = None

    def start(self, clean: Callable[[int], None], epoch: int) -> None:
        """The previous cleanup is waited for (and its error raised) first."""
        self.finish()
        self._cleaner = _Cleaner(clean, epoch)
        self._cleaner.start()

    def finish(self, raise_error: bool = True, wait_s: float | None = None) -> None:
        """Wait for the cleanup under way (at most ``wait_s``: a fenced driver does not wait for
        requests to a store that may not answer; the thread is a daemon, its deletes are of files
        no retained commit reads)."""
        cleaner, self._cleaner = self._cleaner, None
        if cleaner is None:
            return
        cleaner.join(wait_s)
        if cleaner.error is not None and raise_error:
            raise CheckpointError(f"cleaning up the checkpoint after epoch {cleaner.epoch} failed: {cleaner.error}") from cleaner.error


def freeze_heap() -> bool:
    """Keep the driver's long-lived objects out of Python's cyclic collector's full collections.

    After the first epoch the modules an epoch needs are imported (pyspark, pyarrow, pandas,
    numpy, ...): over 100,000 objects that a full collection walks every time, inside whichever
    epoch's planning or commit it hits. Frozen (after a collection, so no garbage is kept) they
    are no longer walked. The lanes' Python workers do the same (``lanes.gc_clock``).

    Returns whether nothing was frozen before: the run then thaws the heap when it ends, so the
    interpreter can still free everything at exit (some extension modules report the objects
    left at exit as leaks).
    """
    thawed = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    return thawed
