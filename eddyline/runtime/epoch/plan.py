"""Stage 1, plan: what the next epoch reads, where its watermarks stand and how its key groups
are routed — decided from the last commit and the controller, before anything runs.

Watermarks: a step fed by sources follows the newest event time its inputs committed, minus its
delay (Spark's rule: from earlier epochs, so it is part of the plan). A step fed by stateful steps
judges its rows against the smallest of their watermarks *of the previous epoch*: everything
such an ancestor emits in this epoch is at or after its previous watermark, so it is never late
downstream. Once the step has taken in the epoch's rows, it *advances* to the smallest of their
watermarks at the end of this epoch (:attr:`EpochPlan.advance`): its ancestors cannot add to
anything before that any more, so a downstream window or top-k closes in the same epoch as the
windows feeding it, not one epoch later per stateful step in between.

An epoch with no new input still runs when a watermark moved and state exists (windows may fire),
like Spark's no-data batches. With ``until_idle`` the first epoch that finds no new input ends the
run instead: an end-of-stream epoch whose watermark passes every window (as Flink does for
bounded input), in which every step first takes in what its ancestors flush, then flushes itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from eddyline.api.network import NetworkSpec
from eddyline.api.steps import StepSpec
from eddyline.control import policies
from eddyline.control.catchup import ROWS_PER_BYTE_PRIOR, Waiting
from eddyline.control.controller import Controller
from eddyline.control.state import ControllerState
from eddyline.errors import SourceUnreachable
from eddyline.eventtime import END_OF_STREAM, NO_WATERMARK
from eddyline.ha.dpc import DelayProcessCorrect, Verdict
from eddyline.io.sources import Source
from eddyline.io.tables import LookupTables
from eddyline.plan.keygroups import RoutingTable
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan
from eddyline.runtime.lookahead import LookAhead


class Planner:
    #: how often the engine asks again when there was nothing to plan (None: after the trigger
    #: interval, at most a second); a planner that is not paced by the trigger sets it
    poll_s: float | None = None

    def __init__(
        self,
        spec: NetworkSpec,
        sources: dict[str, Source],
        lanes: int,
        controller: Controller,
        lookahead: LookAhead,
        tables: LookupTables,
        read_commit: Callable[[int], EpochCommit] | None = None,
    ):
        """``read_commit``: an earlier commit of the checkpoint (a correction continues from the
        last stable one; needed with ``max_delay``)."""
        self.spec, self.sources, self.lanes = spec, sources, lanes
        self.controller, self.lookahead, self.tables = controller, lookahead, tables
        self.upstream = {s.name: spec.stateful_upstream(s) for s in self.stateful}
        self.read_commit = read_commit
        self.dpc = DelayProcessCorrect(spec.max_delay / 1000) if spec.max_delay is not None else None
        if self.dpc is not None:
            for source in sources.values():
                source.patience_s = 0.0  # one probe per plan: the planner itself waits
        #: the sources the last call found down or the state lacks: the run is not idle while
        #: there are any, even if nothing could be planned
        self.waiting_for: list[str] = []

    @property
    def stateful(self) -> list[StepSpec]:
        """The stateful steps, inputs before their readers, as the network runs now (control
        lines may have changed their parameters since the planner was made)."""
        return self.spec.stateful_steps()

    def next(
        self, last: EpochCommit | None, elapsed_s: float, until_idle: bool, rewind_to: int | None = None
    ) -> EpochPlan | None:
        """The next epoch's plan, or None when there is nothing to do (or, with ``max_delay``,
        nothing to do yet: a source is down and the delay has not passed).

        ``rewind_to``: time travel (``eddyline replay``): the epoch continues from that earlier
        commit instead of the last (0: from the start), reading again what came after it, and
        takes back what the epochs since published."""
        epoch = last.epoch + 1 if last else 1
        ended = last is not None and last.end_of_stream
        tentative: list[str] = []
        base: int | None = None
        retracts: list[int] = []
        if rewind_to is not None:
            assert last is not None
            base, retracts = rewind_to, list(range(rewind_to + 1, last.epoch + 1))
            last, ended = self._commit(rewind_to), False
            self.controller.restore(ControllerState.model_validate(last.control if last and last.control else {}))
        slices, down = self._slices(last, elapsed_s, ended)
        sized = None if ended or rewind_to is not None else self._catch_up(epoch, last, elapsed_s, slices, down)
        if self.dpc is not None and not ended:
            missing = last.tentative if last else []
            verdict = self.dpc.verdict(down, missing)
            self.waiting_for = sorted({*down, *missing})
            if verdict == Verdict.WAIT:
                return None
            if verdict == Verdict.TENTATIVE:
                tentative = self.waiting_for
            elif verdict == Verdict.CORRECT:
                assert last is not None and last.stable is not None
                stable = self._commit(last.stable)
                slices, down = self._slices(stable, elapsed_s, False)
                if down:  # gone again since the probe: correct once it answers
                    return None
                base, retracts = last.stable, list(range(last.stable + 1, last.epoch + 1))
                last = stable
                if last is not None and last.control:  # the controller goes back with the state
                    self.controller.restore(ControllerState.model_validate(last.control))
        shed: dict[str, dict[str, Any]] = {}
        overload: dict[str, Any] | None = None
        if self.controller.overload is not None and not ended:
            slices, shed, overload = self._admit(epoch, last, elapsed_s, slices, down)
        new_rows = any(s["end"] > s["start"] for s in slices.values())
        watermarks, advance = self._watermarks(last, flush=ended)
        moved = any(wm != _watermark(last, name) for name, wm in watermarks.items()) or bool(advance)
        has_state = last is not None and any(c.index for c in last.steps.values())
        end_of_stream = ended
        if not new_rows and not retracts:
            if until_idle and has_state and not ended and not tentative:
                # idle: the end-of-stream watermark passes whatever the moved one would fire
                end_of_stream = True
                watermarks, advance = self._watermarks(last, flush=True)
            elif not (moved and has_state):
                return None
        routing, decisions = self._route(epoch, last, slices, end_of_stream)
        if sized is not None:
            decisions.append(sized)
        if overload is not None:
            decisions.append(overload)
        return EpochPlan(
            epoch,
            slices,
            watermarks,
            routing,
            self.lanes,
            end_of_stream,
            self.tables.plan(last.tables if last else {}),
            decisions,
            shed,
            self.controller.snapshot(statistics=False).model_dump(mode="json"),
            tentative=tentative,
            base=base,
            retracts=retracts,
            advance=advance,
        )

    def _commit(self, epoch: int) -> EpochCommit | None:
        """Commit ``epoch`` of the checkpoint (None for 0: the start)."""
        if epoch == 0:
            return None
        assert self.read_commit is not None, "a planner with max_delay needs read_commit"
        return self.read_commit(epoch)

    # ------------------------------------------------------------------ slices
    def _slices(
        self, last: EpochCommit | None, elapsed_s: float, ended: bool
    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Every source's slice, and the sources that did not answer (with ``max_delay``: their
        slices are empty; without, their error is raised)."""
        if ended:  # sources read nothing more
            return {name: _empty_slice(name, last) for name in self.sources}, []
        slices: dict[str, dict[str, Any]] = {}
        down: list[str] = []
        for name in self.sources:
            try:
                slices[name] = self._slice(name, last, elapsed_s)
            except SourceUnreachable:
                if self.dpc is None:
                    raise
                down.append(name)
                slices[name] = _empty_slice(name, last)
        return slices, down

    def _slice(self, name: str, last: EpochCommit | None, elapsed_s: float, cap: int | None = None) -> dict[str, Any]:
        start = last.source_ends.get(name, 0) if last else 0
        cursor = last.cursors.get(name) if last else None
        return self.sources[name].plan(start, elapsed_s, cursor, cap=cap)

    def _catch_up(
        self, epoch: int, last: EpochCommit | None, elapsed_s: float, slices: dict[str, dict[str, Any]], down: list[str]
    ) -> dict[str, Any] | None:
        """Epochs sized by the backlog (:mod:`eddyline.control.catchup`): the slices of sources
        without a cap of their own cut to what one epoch should take, in place. Returns the
        decision to log, if any was cut."""
        sizer = self.controller.catch_up
        if sizer is None or self.controller.overload is not None:
            return None  # overload control's admission sizes epochs against the latency bound itself
        waiting = {
            name: Waiting(s["end"] - s["start"], tuple(s["sizes"]) if "sizes" in s else None,
                          ROWS_PER_BYTE_PRIOR["parquet" if getattr(self.sources[name].spec.params, "format", None)
                                              == "parquet" else "text"])
            for name, s in slices.items()
            if s["end"] > s["start"] and name not in down and not self.sources[name].capped()
        }
        sizing = sizer.size(epoch, waiting)
        for name, cap in sizing.caps.items():
            slices[name] = self._slice(name, last, elapsed_s, cap)
        return sizing.decision.to_json() if sizing.decision is not None else None

    def _admit(
        self, epoch: int, last: EpochCommit | None, elapsed_s: float, slices: dict[str, dict[str, Any]],
        down: list[str],
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any] | None]:
        """Admission control and shedding: the overload controller may cap what a source reads
        (files are never capped: their slices are whole files) and shed rows before stateful
        steps. Returns the slices, the shedding and the decision to report, if worth it."""
        overload = self.controller.overload
        assert overload is not None
        verdict = overload.plan(epoch, {n: s["end"] - s["start"] for n, s in slices.items()})
        for name, cap in verdict.caps.items():
            if self.sources[name].spec.kind != "files" and name not in down:
                slices[name] = self._slice(name, last, elapsed_s, cap)
        if not verdict.worth_reporting:  # also reported: when the bound cannot be met at all
            return slices, verdict.shed, None
        decision = {
            "epoch": epoch,
            "step": "*",
            "kind": "overload",
            "action": {"caps": verdict.caps, "shed": {k: v["keep"] for k, v in verdict.shed.items()}},
            "why": {**verdict.explain, "hotSpots": overload.hot_spots()},
            "expected": {"epochMs": verdict.explain.get("predictedMs")},
            "measured": None,
        }
        return slices, verdict.shed, decision

    # ------------------------------------------------------------------ watermarks
    def _watermarks(self, last: EpochCommit | None, *, flush: bool) -> tuple[dict[str, int], dict[str, int]]:
        """Every stateful step's watermark in force while it takes in the epoch's rows, and the
        steps that advance past it once they have (with the watermark they reach)."""
        out: dict[str, int] = {}
        reached: dict[str, int] = {}  # every step's watermark at the end of the epoch
        for step in self.stateful:
            prev = last.steps.get(step.name) if last else None
            prev_wm = prev.watermark if prev else NO_WATERMARK
            max_t = prev.max_event_time if prev else NO_WATERMARK
            if flush:
                observed = END_OF_STREAM
            else:
                observed = prev_wm if max_t <= NO_WATERMARK else max(prev_wm, max_t - step.watermark_delay)
            ancestors, from_sources = self.upstream[step.name]
            own = [observed] if from_sources or not ancestors else []
            wm = min([*(_watermark(last, a) for a in ancestors), *own])
            then = min([*(reached[a] for a in ancestors), *own])
            follows = step.info.watermark_follows(step)
            if follows is not None:
                wm, then = out[follows], reached[follows]
            out[step.name] = max(wm, prev_wm)
            reached[step.name] = max(then, out[step.name])
        return out, {name: wm for name, wm in reached.items() if wm > out[name]}

    # ------------------------------------------------------------------ routing
    def _route(
        self, epoch: int, last: EpochCommit | None, slices: dict[str, dict[str, Any]], end_of_stream: bool
    ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """Every stateful step's routing table: the committed one, as the manager changes it."""
        routing: dict[str, dict[str, Any]] = {}
        decisions: list[dict[str, Any]] = []
        elastic = self.spec.control.scale is not None
        for step in self.stateful:
            prev = last.steps.get(step.name) if last else None
            old = RoutingTable.from_json(prev.routing) if prev else None
            if old is None:
                table = RoutingTable.uniform(self.spec.key_groups, self.lanes)
            elif old.lanes == self.lanes or elastic:
                table = old
            else:  # restarted with another lane count: move as few key groups as possible
                counts = np.zeros(old.key_groups)
                for kg in prev.index if prev else ():
                    counts[int(kg) % old.key_groups] += 1
                moved = policies.rescale_assignment(counts, np.asarray(old.assignment), self.lanes)
                table = old.rescaled(self.lanes, moved)
            upcoming = None
            peek = None if end_of_stream else self._lookahead_input(step)
            if peek is not None:
                node, keys = peek
                upcoming = self.lookahead.counts(self.sources[node], slices[node], keys)
                # the next slice's files are counted while this epoch's job runs, for the next plan
                self.lookahead.prefetch(self.sources[node], slices[node], keys)
            table, made = self.controller.manager.plan(epoch, step.name, table, upcoming)
            decisions.extend(d.to_json() for d in made)
            routing[step.name] = table.to_json()
        return routing, decisions

    def _lookahead_input(self, step: StepSpec) -> tuple[str, tuple[str, ...]] | None:
        """The source and key columns whose counts tell ``step``'s input rows per key group
        before the epoch runs (see :mod:`eddyline.runtime.lookahead`), if ``balance.lookahead`` is
        on, the step's lanes receive its input rows as they are, and it reads a source directly
        or through steps that pass the key columns on unchanged (a filter only thins the rows,
        so the source's counts still tell where the load goes); whether the counts are cheap
        there is up to the source."""
        balance = self.spec.control.balance
        if balance is None or not balance.lookahead or step.name not in self.controller.manager.steps:
            return None
        keys = step.key_columns
        if not step.info.rows_reach_lanes or step.input is None or not keys:
            return None
        node = step.input
        while node not in self.sources:
            up = self.spec.step(node)
            if not up.info.passes_keys(up.params, keys) or up.input is None:
                return None
            node = up.input
        return node, tuple(keys)


def _empty_slice(name: str, last: EpochCommit | None) -> dict[str, Any]:
    """A slice that reads nothing and leaves the source where the commit left it."""
    end = last.source_ends.get(name, 0) if last else 0
    cursor = last.cursors.get(name) if last else None
    return {"start": end, "end": end, "files": [], **({"cursor": cursor} if cursor is not None else {})}


def _watermark(last: EpochCommit | None, step: str) -> int:
    return last.steps[step].watermark if last and step in last.steps else NO_WATERMARK
