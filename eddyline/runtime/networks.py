"""The network in force, and the engine's parts that follow from it.

A network is put in force at the start (the one the checkpoint holds: a live change's, even when
the driver was started with the spec it was created with) and again at an epoch boundary by a
change of network (``eddyline apply``, an undo, a rewrite) or when added steps caught up with
their sources. Putting one in force rebuilds the sources, outputs, controller, planner and
executor (sinks that did not change stay open) and restores the controller from the last commit.
Control-line settings are applied on top of the network as written.

:class:`Networks` is the engine's side that does this; :class:`~eddyline.runtime.engine.Engine`
mixes it in and owns the attributes it declares.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eddyline.api.change import NetworkDiff, history_starts, with_catch_ups
from eddyline.api.live import carried, with_settings
from eddyline.api.network import NetworkSpec
from eddyline.api.units import Files
from eddyline.api.validate import spec_from_raw
from eddyline.control.controller import Controller
from eddyline.control.state import ControllerState
from eddyline.errors import SpecError
from eddyline.io.files import FilesTarget
from eddyline.io.sinks import Sink, make_sink
from eddyline.io.sources import Source, make_source
from eddyline.runtime.admission import catch_ups_after
from eddyline.runtime.checkpoint import RUN_ONLY, Checkpoint, network_hash
from eddyline.runtime.compile import EpochCompiler
from eddyline.runtime.epoch.execute import Executor
from eddyline.runtime.epoch.plan import Planner
from eddyline.runtime.epoch.publish import Outputs
from eddyline.runtime.epoch.records import EpochCommit
from eddyline.runtime.livechange import LiveChange
from eddyline.runtime.lookahead import LookAhead
from eddyline.runtime.replica import Following, HotPair, Leading
from eddyline.runtime.residentmode import ResidentExecutor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eddyline.api.sinks import SinkSpec
    from eddyline.ha.lease import Lease
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.faults import Faults
    from eddyline.runtime.inbox import Inbox
    from eddyline.runtime.upkeep import Cleanups


class Networks:
    """Builds the engine's parts from the network in force and switches networks."""

    # the engine's own, made in Engine.__init__
    spark: SparkSession
    ckpt: Checkpoint
    pair: HotPair | None
    lease: Lease | None
    faults: Faults
    reporter: ProgressReporter | None
    inbox: Inbox
    lanes: int
    cleanups: Cleanups
    generation: int  # (a property of the engine)
    _lead: Callable[[], None]  # a follower took the lease over
    _given_sinks: dict[str, Sink]
    _retain: int | None
    _attached: bool  # the sources receive (upstream backup) while run() runs
    _change: LiveChange  # the last change of network, as the checkpoint records it
    # made here, from the network in force
    base_spec: NetworkSpec
    spec: NetworkSpec
    settings: dict[str, Any]
    network_id: str
    retain_epochs: int
    sources: dict[str, Source]
    outputs: Outputs
    controller: Controller
    lookahead: LookAhead
    compiler: EpochCompiler
    _plans: Planner
    planner: Planner | Leading | Following
    executor: Executor

    def _build(self, spec: NetworkSpec, keep: dict[str, Sink] | None = None) -> None:
        """The parts of the engine that follow from the network: made at the start and again
        when a live change (:mod:`eddyline.api.change`) puts another network in force.
        ``keep``: sinks still open from the network before (unchanged), used as they are."""
        spark, checkpoint, pair, lease = self.spark, self.ckpt.location, self.pair, self.lease
        self.base_spec = spec
        self.network_id = network_hash(spec.as_dict())  # names the network in plans and the checkpoint
        # added steps still catching up read copies of running sources (api.change.catch_ups)
        self.spec = spec = with_catch_ups(spec, self._change.catch_up)
        self.settings = {}
        self.retain_epochs = self._retain or spec.history
        sinks = {**self._given_sinks, **(keep or {})}
        sinks = {s.name: sinks.get(s.name) or self._make_sink(s) for s in spec.sinks}
        self.sources: dict[str, Source] = {s.name: make_source(s) for s in spec.sources}
        overload = spec.control.overload
        self.outputs = Outputs(
            sinks=sinks,
            dead_letters=FilesTarget(
                spec.dead_letters or Files(path=f"{self.ckpt.location.rstrip('/')}/dead-letters", format="json")
            ),
            late={
                s.name: FilesTarget(target)
                for s in spec.stateful_steps()
                if (target := s.info.late_target(s.params)) is not None
            },
            shed=FilesTarget(overload.shed_sink) if overload is not None and overload.shed_sink is not None else None,
            selector=pair.selector if pair is not None else None,
        )
        self.controller = Controller(spec, max_lanes=spark.sparkContext.defaultParallelism)
        self.lookahead = LookAhead(spec.key_groups)
        self.compiler = EpochCompiler(spark, spec, self.sources, checkpoint, self.faults, gate=self.ckpt.gate)
        self._plans = Planner(
            spec, self.sources, self.lanes, self.controller, self.lookahead, self.compiler.tables, self.ckpt.read_commit
        )
        self.planner: Planner | Leading | Following = self._plans
        old = getattr(self, "executor", None)
        if old is not None:  # (a resident stage of the network before ends here)
            old.close()
        execution, why = spec.execution, None
        self.executor = Executor(spec, self.compiler, self.outputs)
        if execution != "job":
            try:  # (it checks the network, and runs it over empty slices: what it cannot take is found)
                _slots_checked(spec, self.lanes, spark.sparkContext.defaultParallelism)
                resident = ResidentExecutor(spec, self.compiler, self.outputs, self.ckpt)
                if pair is not None:
                    resident.check_digests()
                self.executor = resident
            except SpecError as e:
                if execution == "resident":
                    raise
                why = str(e).removeprefix("execution: resident: ")
        self.executor.why = why
        if spec.execution == "auto" and why is not None:
            self._note(f"execution: auto runs a Spark job an epoch: {why}")
        if pair is not None:  # both drivers stage the outputs: apart, with digests to compare
            self.executor.digests = True
            for out in [*self.outputs.sinks.values(), *self.outputs.targets()]:
                out.writer = pair.writer
            self.planner = (Leading(self._plans, pair) if lease is not None
                            else Following(self._plans, pair, self.controller, self._lead, self.ckpt))

    def _merge_caught_up(self, last: EpochCommit | None) -> None:
        """Copies that have read as far as their sources: from the next epoch on their steps
        read the sources themselves, with the state they have (the rows are the same from here
        on). Recorded in the checkpoint's metadata (``caught_up``) before the next epoch is planned."""
        if last is None or not self._change.catch_up or isinstance(self.planner, Following):
            return
        ends, cursors = last.source_ends, last.cursors
        done = [c for c, (s, _) in self._change.catch_up.items()
                if c in ends and ends[c] >= ends.get(s, 0) and cursors.get(c) == cursors.get(s)]
        if not done:
            return
        self._change = dataclasses.replace(
            self._change, catch_up={c: v for c, v in self._change.catch_up.items() if c not in done})
        self.ckpt.record_caught_up(self._change.to_json()["catch_up"], done, last.epoch + 1)
        settings = self.settings
        self._rebuild(self.base_spec, last)
        self._use_settings(settings)

    def _switch(self, command: dict[str, Any], last: EpochCommit | None) -> None:
        """Put the command's network in force from the next epoch (its plan logs the command):
        recorded in the checkpoint first, so that a driver that dies from here on comes back
        with it."""
        self.cleanups.finish()  # (a cleanup judges which steps' state to keep by the network in force)
        new = spec_from_raw(command["network"])
        raw = new.as_dict()  # canonical: the same network always has the same hash
        if network_hash(raw) == self.network_id:
            return  # in force already (switched while idle, the plan to log it still to come)
        start = command.get("start_epoch")
        copies = catch_ups_after(command, new, self.base_spec, self._change.catch_up)
        change = LiveChange(
            (last.epoch if last else 0) + 1, tuple(sorted(command.get("reset") or ())), dict(command.get("inherit") or {}),
            {n: (o, int(start)) for n, o in history_starts(self.base_spec, new).items()}
            | {c: (o, int(start)) for c, (o, _) in copies.items() if c not in self._change.catch_up} if start else {},
            copies)
        made_by = command.get("rewrite")
        self.ckpt.record_change(new.fingerprint(), self.ckpt.store_network(raw), change.to_json(),
                                {k: made_by[k] for k in ("rule", "step", "summary")} if made_by else None)
        self._change = change
        before, settings = self.base_spec, self.settings
        self._rebuild(new, last)
        self._use_settings(carried(before, new, settings))  # (logged with the plan about to be made)

    def _adopt_applied_network(self, changed: NetworkDiff | None) -> None:
        """Run the network the checkpoint holds in force: the one a live change applied, even
        when started with the network it was created with (a supervisor's unchanged command
        line). Started with a spec that differs from it (``changed``, see
        :meth:`Checkpoint.restart_change`), it runs the network in force and queues the spec's
        change for the next epoch boundary, as ``eddyline apply`` would."""
        meta = self.ckpt.metadata() or {}
        applied = meta.get("applied")
        if applied:
            self._change = LiveChange.from_json(applied)
        in_force = self.ckpt.in_force(meta)
        if in_force is not None and in_force != self.network_id:
            given = self.base_spec
            self._rebuild(spec_from_raw(self.run_as_given(self.ckpt.read_network(in_force))), None)
            if changed is not None and not changed.empty:
                self._queue_restart_change(given, changed)
        elif self._change.catch_up:  # its added steps go on catching up on their copies
            self._rebuild(self.base_spec, None)

    def run_as_given(self, raw: dict[str, Any]) -> dict[str, Any]:
        """A stored network ``raw`` run the way this run was asked to (:data:`RUN_ONLY`)."""
        given = self.base_spec.as_dict()
        return {**{k: v for k, v in raw.items() if k not in RUN_ONLY}, **{k: given[k] for k in RUN_ONLY if k in given}}

    def _queue_restart_change(self, given: NetworkSpec, changed: NetworkDiff) -> None:
        """The change a restart's spec makes, queued (once) for the next epoch boundary."""
        raw = given.as_dict()
        digest = network_hash(raw)
        if not any(isinstance(c.get("network"), dict) and network_hash(c["network"]) == digest
                   for c in self.inbox.pending()):
            self.inbox.submit_network(raw, [], origin="restart")
        self._note(f"the spec differs from the network in checkpoint {self.ckpt.location}: applying the changed "
                   f"network at the next epoch boundary ({'; '.join(changed.lines())})")

    def _note(self, text: str) -> None:
        if self.reporter is not None:
            self.reporter.note(text)

    def _rebuild(self, spec: NetworkSpec, last: EpochCommit | None) -> None:
        """Another network in force: unchanged sinks stay open, everything else is made anew;
        the controller continues from the last commit where its steps are still there."""
        old = self.spec
        keep = {n: s for n, s in self.outputs.sinks.items()
                if any(x.name == n and x == old.node(n) for x in spec.sinks)}
        for name, sink in self.outputs.sinks.items():
            if name not in keep and hasattr(sink, "close"):
                sink.close()
        attached = self._attached
        if attached:
            for source in self.sources.values():
                source.detach()
        self.lookahead.close()
        checkpoint_id = self.executor.checkpoint_id
        self._build(spec, keep)
        self.executor.checkpoint_id = checkpoint_id
        if last is not None:
            with contextlib.suppress(Exception):  # a state for steps that are gone: decide afresh
                self._restore(last.control)
        if attached:
            for name, source in self.sources.items():
                source.attach(self.ckpt.location, last.source_ends.get(name, 0) if last else 0)
        self._open_gates()

    def _use_settings(self, settings: dict[str, Any]) -> None:
        """Run with the network as written plus ``settings`` (validated: a plan logged them)."""
        if settings == self.settings:
            return
        spec = with_catch_ups(with_settings(self.base_spec, settings), self._change.catch_up)
        old, self.settings, self.spec = self.spec, settings, spec
        self.compiler.spec = self._plans.spec = self.executor.spec = spec
        self.controller.reconfigure(spec)
        moved = [s for s in spec.sinks if s != old.node(s.name)]  # a sink's target changed
        for sink in moved:  # (the executor opens the new one before its first epoch)
            before = self.outputs.sinks[sink.name]
            if hasattr(before, "close"):
                before.close()
            self.outputs.sinks[sink.name] = self._make_sink(sink)
        if moved:
            self._open_gates()

    def _make_sink(self, spec: SinkSpec) -> Sink:
        sink = make_sink(spec, self.reporter.console if self.reporter else None)
        sink.history = self.retain_epochs  # how far back a replay can go: what a rewinding sink keeps
        return sink

    def _open_gates(self) -> None:
        """Write under our lease generation (a follower's: the leader's) from now on, in the
        checkpoint and every sink: each store then refuses the writes of an older generation
        (:class:`~eddyline.storage.Gate`, :meth:`eddyline.io.sinks.Sink.fence`)."""
        # A cleanup under way moves files through the checkpoint's gate of the generation it
        # started under; opening a newer one revokes that gate (in this very process), and the
        # cleanup's next move would fail as if another driver had fenced this one.
        self.cleanups.finish()
        generation = self.generation
        if self.lease is None and self.pair is not None:
            cur = self.pair.leader()
            generation = cur.generation if cur is not None else 0
        self.ckpt.fence(generation)
        for out in [*self.outputs.sinks.values(), *self.outputs.targets()]:
            out.fence(generation)

    def _restore(self, control: dict) -> None:
        """Continue with the controller state of the last commit and, on top of it, of the plan
        being replayed (as it was once that plan was made)."""
        if control:
            self.controller.restore(ControllerState.model_validate(control))


def _slots_checked(spec: NetworkSpec, lanes: int, slots: int) -> None:
    """A resident stage holds a task slot a lane: the most lanes the network may run on (its
    lanes, a rescale's ``max_lanes`` or planned counts) must fit Spark's slots (SpecError), or
    the stage could not start at the epoch that needs them."""
    scale = spec.control.scale
    most = max([lanes, *(() if scale is None else (scale.max_lanes or 0, *scale.schedule.values()))])
    if most > slots:
        raise SpecError(f"execution: resident: up to {most} lanes (lanes, control.scale) need as many task slots; "
                        f"Spark has {slots}")
