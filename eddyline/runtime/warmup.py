"""A standby driver made ready to lead while it waits for the checkpoint's lease.

The first epoch of a process is slow, mostly in the JVM: classes load and methods are compiled
for every kind of node the epoch's plan has (the sources' readers, the Arrow hand-offs to
Python, the lane shuffle, the sinks' writers), and Spark's Python workers start and import
pyarrow, numpy and the kernels. A standby would pay all of it between taking the lease and its
first commit. :meth:`Standby.rehearse` pays it before: it runs the last committed epoch's plan
again (or, without one, an epoch over empty slices) through a compiler and executor of its own
whose every write goes to a scratch directory, deleted afterwards:

* the scratch directory is where the checkpoint is: a local temporary directory, or a prefix
  ``_rehearsal/<id>`` on the checkpoint's object store, so that on a cluster the lanes and the
  sinks' tasks write where the driver reads, through the same code as the real epochs;
* the lanes start from **empty state** and write their state and manifests under the scratch
  directory (so nothing of the checkpoint's state is read, and the workers' state cache, keyed
  by the state's location, holds nothing the real epochs could mistake for theirs);
* a ``files`` sink writes its format there; any other kind's rows are collected into the
  driver as Arrow, as those sinks stage them (``console``, ``memory``, ``nats``, ``postgres``),
  and dropped; no sink object of the engine is used, none is opened or published, so no server
  is written to;
* dead letters, late rows and shed rows are written there too.

It reads what a replay would read: the checkpoint's last commit and plan, the sources' slice of
that plan (a ``nats_core`` source is not attached in a standby, so it has no log to read: its
slice fails and the rehearsal falls back to the empty epoch), a lookup table's pinned copy. No
source is attached and nothing is planned, logged, published or committed.

A standby started before its leader committed anything can only rehearse an empty epoch, which
leaves the shapes that carry rows cold. While it waits, :meth:`Standby.catch_up` rehearses the
first committed epoch once there is one, in a thread of its own, so the lease is polled as
before; a takeover cancels a rehearsal still running (:meth:`Standby.stop`): leading comes first.
:meth:`Standby.keep_warm` keeps the Python workers, which Spark stops after a minute idle, alive. The engine needs nothing of this to lead: it reads the
checkpoint afresh when it starts to run (after the lease is taken).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eddyline import objectstore
from eddyline.api.units import Files
from eddyline.eventtime import NO_WATERMARK
from eddyline.io.files import FilesTarget, write_frame
from eddyline.io.sinks import Sink
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.compile import EpochCompiler
from eddyline.runtime.engine import Engine
from eddyline.runtime.epoch.execute import Executor
from eddyline.runtime.epoch.publish import Outputs
from eddyline.runtime.epoch.records import EpochPlan
from eddyline.runtime.upkeep import WORKER_KEEPALIVE_S, touch_python_workers

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from eddyline.api.sinks import SinkSpec


@dataclass(frozen=True)
class Rehearsal:
    """What :meth:`Standby.rehearse` ran, in ``seconds``: the plan of ``epoch`` again (None: an
    empty epoch); ``error``: why the last plan, or with ``ran`` false also the empty epoch,
    could not run."""

    epoch: int | None
    seconds: float
    error: str | None = None
    ran: bool = True

    def describe(self) -> str:
        if not self.ran:
            return f"rehearsal failed after {self.seconds:.1f} s ({self.error})"
        what = f"epoch {self.epoch}" if self.epoch is not None else "an empty epoch"
        failed = f" (the last epoch's plan failed: {self.error})" if self.error is not None else ""
        return f"{what} rehearsed in {self.seconds:.1f} s{failed}"


class Standby:
    """Keeps a driver that waits for the lease ready to run ``engine``'s next epoch."""

    #: the job tag of a rehearsal's jobs (those still running are cancelled when the lease is
    #: ours); a tag, not a job group, which the epoch's own labels set (``job_labels``)
    JOB_TAG = "eddyline-rehearsal"
    #: how often, while it waits, a standby that rehearsed no committed epoch looks for one
    LOOK_S = 1.0

    def __init__(self, engine: Engine, keepalive_s: float = WORKER_KEEPALIVE_S,
                 say: Callable[[str], None] | None = None):
        """``say``: where a rehearsal run in the background reports (the driver's log)."""
        self.engine = engine
        self.keepalive_s = keepalive_s
        self.say = say
        self._used_at = time.monotonic()  # when the Python workers last ran a task of ours
        #: the last rehearsal (None: none yet), one running in the background, when it last looked
        self.last: Rehearsal | None = None
        self._behind: threading.Thread | None = None
        self._looked_at = float("-inf")
        self._stopped = threading.Event()

    def rehearse(self) -> Rehearsal:
        """Run the last committed epoch's plan again, writing only to a scratch directory; if
        there is none or it fails, an epoch over empty slices. A failure is only reported: the
        real epochs do not depend on the rehearsal."""
        self.last = self._rehearse(self._last_plan())
        return self.last

    def _rehearse(self, plan: EpochPlan | None, fall_back: bool = True) -> Rehearsal:
        t0 = time.monotonic()
        error = None
        try:
            if plan is not None:
                try:
                    self._run(plan)
                    return Rehearsal(plan.epoch, time.monotonic() - t0)
                except Exception as e:  # its input is gone (retention, a log's deleted segment)
                    error = _first_line(e)
                    if not fall_back:
                        return Rehearsal(plan.epoch, time.monotonic() - t0, error, ran=False)
            try:
                self._run(self._empty_plan())
            except Exception as e:  # the first real epoch will say why
                return Rehearsal(None, time.monotonic() - t0, _first_line(e), ran=False)
            return Rehearsal(None, time.monotonic() - t0, error)
        finally:
            self._used_at = time.monotonic()

    def catch_up(self) -> bool:
        """While the standby waits: if no committed epoch was rehearsed yet and there is one now
        (looked for every :data:`LOOK_S`), rehearse it in a thread. Returns whether one started."""
        if (self._behind is not None or self._stopped.is_set() or (self.last is not None and self.last.epoch)
                or time.monotonic() - self._looked_at < self.LOOK_S):
            return False
        self._looked_at = time.monotonic()
        plan = self._last_plan()
        if plan is None:
            return False

        def run() -> None:
            self.engine.spark.sparkContext.addJobTag(self.JOB_TAG)
            done = self._rehearse(plan, fall_back=False)
            if self._stopped.is_set():
                return  # cancelled by a takeover: whatever it says is not news
            self.last = done
            if self.say is not None:
                self.say(f"standby ready: {done.describe()}")

        self._behind = threading.Thread(target=run, name="eddyline-rehearsal", daemon=True)
        self._behind.start()
        return True

    def stop(self, wait_s: float = 1.0) -> None:
        """The lease is ours: cancel a rehearsal still running in the background (its jobs are
        cancelled; what it wrote is in its scratch directory, dropped as it ends)."""
        self._stopped.set()
        if self._behind is None or not self._behind.is_alive():
            return
        self.engine.spark.sparkContext.cancelJobsWithTag(self.JOB_TAG)
        self._behind.join(wait_s)

    def keep_warm(self, force: bool = False) -> bool:
        """Once ``keepalive_s`` passed since the Python workers last ran a task of ours (or
        with ``force``), run a keep-alive task on each; returns whether it did."""
        if not force and time.monotonic() - self._used_at < self.keepalive_s:
            return False
        if self._behind is not None and self._behind.is_alive():
            return False  # a rehearsal is keeping them busy
        self._used_at = time.monotonic()
        try:
            touch_python_workers(self.engine.spark)
        except Exception:  # a speed-up only: the first epoch reports what Spark cannot do
            return False
        return True

    # ------------------------------------------------------------------ the rehearsal
    def _last_plan(self) -> EpochPlan | None:
        ckpt = self.engine.ckpt
        try:
            last = ckpt.latest_commit()
            return ckpt.read_plan(last.epoch) if last is not None else None
        except Exception:  # no checkpoint yet, or its plan was cleaned up: an empty epoch
            return None

    def _empty_plan(self) -> EpochPlan:
        """An epoch that reads nothing, with the routing a fresh run starts from."""
        spec, lanes = self.engine.spec, self.engine.lanes
        stateful = spec.stateful_steps()
        return EpochPlan(
            epoch=1,
            sources={n: {"start": 0, "end": 0, "files": []} for n in self.engine.sources},
            watermarks={s.name: NO_WATERMARK for s in stateful},
            routing={s.name: RoutingTable.uniform(spec.key_groups, lanes).to_json() for s in stateful},
            lanes=lanes,
        )

    def _run(self, plan: EpochPlan) -> None:
        """The plan once per executor, all at once. Each executor's JVM compiles the epoch's
        code and each starts its own Python workers, so an executor that ran none of the
        rehearsal is as cold as without one; run one after the other, the rehearsals' few tasks
        may all land on one executor, run side by side they fill them all. Raises the first
        failure."""
        copies = max(1, self._executors())
        if copies == 1:
            self._run_once(plan)
            return
        failed: list[BaseException] = []

        def one() -> None:
            self.engine.spark.sparkContext.addJobTag(self.JOB_TAG)  # (a thread's tags are its own)
            try:
                self._run_once(plan)
            except BaseException as e:  # noqa: BLE001 (reported by the caller's thread)
                failed.append(e)

        runs = [threading.Thread(target=one, name=f"eddyline-rehearsal-{i}", daemon=True) for i in range(copies)]
        for t in runs:
            t.start()
        for t in runs:
            t.join()
        if failed:
            raise failed[0]

    def _executors(self) -> int:
        """The application's executors (0 in local mode, where the driver runs the tasks)."""
        try:
            return int(self.engine.spark.sparkContext._jsc.sc().getExecutorIds().size())
        except Exception:  # noqa: BLE001 (a speed-up only)
            return 0

    def _run_once(self, plan: EpochPlan) -> None:
        engine, real = self.engine, self.engine.outputs
        scratch, drop = self._scratch()

        def moved(target: FilesTarget, name: str) -> FilesTarget:
            return FilesTarget(target.files.model_copy(update={"path": f"{scratch}/{name}"}))

        try:
            # no fault hook (a test's --crash-at is meant for the real epochs); the lanes'
            # heartbeat frames are shared, so the real epochs find them built
            compiler = EpochCompiler(engine.spark, engine.spec, engine.sources, f"{scratch}/checkpoint")
            compiler.heartbeats = engine.compiler.heartbeats
            outputs = Outputs(
                sinks={s.name: _ScratchSink(s, f"{scratch}/sinks/{s.name}") for s in engine.spec.sinks},
                dead_letters=moved(real.dead_letters, "dead-letters"),
                late={step: moved(t, f"late/{step}") for step, t in real.late.items()},
                shed=moved(real.shed, "shed") if real.shed is not None else None,
            )
            Executor(engine.spec, compiler, outputs).execute(plan, None)  # None: from empty state
        finally:
            drop()

    def _scratch(self) -> tuple[str, Callable[[], None]]:
        """Where a rehearsal writes, and what deletes it: beside the checkpoint (see above)."""
        location = self.engine.ckpt.location
        if not objectstore.is_object_store(location):
            path = tempfile.mkdtemp(prefix="eddyline-rehearsal-")
            return path, lambda: shutil.rmtree(path, ignore_errors=True)
        where = f"{location.rstrip('/')}/_rehearsal/{uuid.uuid4().hex[:12]}"

        def drop() -> None:
            store, key = objectstore.at(where)
            try:
                if keys := store.list(f"{key}/"):
                    store.delete(keys)
            except Exception:  # noqa: BLE001 (a rehearsal's leftovers are harmless: named apart)
                pass

        return where, drop


class _ScratchSink(Sink):
    """Stands in for a sink in a rehearsal: a ``files`` sink writes its format into the scratch
    directory; any other kind collects its rows as Arrow (as those sinks stage) and drops them.
    It is never opened or published."""

    def __init__(self, spec: SinkSpec, path: str):
        super().__init__(spec)
        params = spec.params
        self.target = FilesTarget(params.model_copy(update={"path": path})) if isinstance(params, Files) else None

    def stage(self, df: DataFrame, epoch: int) -> None:
        if self.target is not None:
            write_frame(df, self.target, epoch)
        else:
            df.toArrow()


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]
