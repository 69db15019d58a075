"""The distribution manager: monitor → decide → reconfigure, one epoch at a time.

Before each epoch the engine asks :meth:`DistributionManager.plan` for every stateful step's
routing table. The manager starts from the committed table and may change it:

* **placement** (once): after ``warmup_epochs`` of statistics, or at once from a declared
  profile, key groups are placed by the greedy, correlation-based or resilient (ROD) policy;
* **rescale**: the DS2 rate model (or a scheduled change) sets a new number of lanes, moving as
  little load as possible;
* **balance**: pairwise one-way / two-way moves between the most and least loaded lanes;
* **spread** (SPREADFIRE): a key group hotter than a fair lane's share, which no move can
  balance, has its new rows split over more lanes while its state stays put;
* **chaos**: random moves, for relocation drills.

An operator may also ask for a change (:meth:`DistributionManager.request`: the control API,
``eddyline control route``): a rescale to a lane count, a rebalance now (whatever the threshold,
patience and cool-down), or key groups moved to a lane. The request is taken by the next plan
of its step, first of all stages, and becomes a decision like the policies' own (``why.reason``
is ``operator``, with the command's id).

Every change is a :class:`Decision` that says why (the statistics), what it expected (predicted
lane loads and makespan) and — a few epochs later — what was measured. Decisions travel in the
epoch plan, which is logged before the epoch runs: a replay after a crash applies the very same
routing, so moves are exactly-once like everything else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eddyline.api.network import NetworkSpec
from eddyline.control import policies
from eddyline.control.decisions import Decision, DecisionKind
from eddyline.control.drills import relocation_drill
from eddyline.control.lookahead import coming_load
from eddyline.control.state import (
    BalancerState,
    DecisionRecord,
    LoadRecord,
    ManagerState,
    ScalerState,
    fields_plain,
    plain,
)
from eddyline.control.stats import LoadHistory, StepLoad
from eddyline.plan.keygroups import RoutingTable

__all__ = [
    "MEASURE_AFTER",
    "RECENT",
    "Decision",
    "DecisionKind",
    "DistributionManager",
    "Stage",
    "StepContext",
]

#: Epochs after a decision at which its effect is measured.
MEASURE_AFTER = 2
#: Decisions shown in the progress records (the most recent ones).
RECENT = 5


@dataclass(frozen=True)
class StepContext:
    """What every policy stage of one step's plan sees: the epoch, the step, its load series
    (key groups x recent epochs), the coming epoch's input per key group if read ahead, and the
    decisions the stages before it made."""

    epoch: int
    step: str
    series: np.ndarray
    upcoming: np.ndarray | None
    earlier: tuple[Decision, ...]


#: A policy stage: the step's table as the stages before it left it -> its table and decisions.
Stage = Callable[[StepContext, RoutingTable], tuple[RoutingTable, list[Decision]]]


def _round(xs: Any) -> list[float]:
    return [round(float(x), 1) for x in xs]


@dataclass
class DistributionManager:
    spec: NetworkSpec
    max_lanes: int
    history: LoadHistory = field(init=False)
    decisions: list[Decision] = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.spec.control
        self.history = LoadHistory(self.spec.key_groups, c.history)
        steps = [s for s in self.spec.steps if s.stateful]
        self.steps = {s.name for s in steps if c.steps is None or s.name in c.steps}
        self.spreadable = {s.name for s in steps if s.info.spreadable(s.params)}
        self.balancers = {
            n: policies.Balancer(
                threshold=c.balance.threshold,
                period=c.balance.period,
                max_moves=c.balance.max_moves,
                method=c.balance.method,
                cooldown=c.balance.cooldown,
                patience=c.balance.patience,
            )
            for n in self.steps
            if c.balance is not None
        }
        scale_max = c.scale.max_lanes if c.scale and c.scale.max_lanes else self.max_lanes
        self.scalers = {
            n: policies.Scaler(
                target_utilization=c.scale.target_utilization,
                min_lanes=c.scale.min_lanes,
                max_lanes=scale_max,
                cooldown=c.scale.cooldown,
                tolerance=c.scale.tolerance,
            )
            for n in self.steps
            if c.scale is not None
        }
        #: steps of parallelism 1 (a global window: every row in key group 0), placed as whole boxes
        self.boxes = sorted(
            s.name for s in steps if s.name in self.steps and s.info.single_key_group(s.params)
        )
        self._box_lanes: dict[str, int] = {}
        self.placed: set[str] = set()
        self.profile = _read_profile(c.profile) if c.profile else {}
        #: whether any routing policy is on: without one the statistics are never looked at
        #: (and not kept in the state)
        self.routing = c.placement != "uniform" or any(
            x is not None for x in (c.balance, c.scale, c.spread, c.chaos, c.rewrite)
        )
        #: operator requests (step -> request), taken by the step's next plan
        self.requests: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ monitor

    def reconfigure(self, spec: NetworkSpec) -> None:
        """Control lines (:data:`eddyline.api.live.LIVE_CONTROL`): the same network with other
        policy settings; each policy keeps its state (cool-downs, streaks, last change)."""
        self.spec = spec
        c = spec.control
        for b in self.balancers.values():
            assert c.balance is not None
            b.threshold, b.period, b.max_moves = c.balance.threshold, c.balance.period, c.balance.max_moves
            b.cooldown, b.patience = c.balance.cooldown, c.balance.patience
        for sc in self.scalers.values():
            assert c.scale is not None
            sc.target_utilization, sc.min_lanes, sc.cooldown, sc.tolerance = (
                c.scale.target_utilization, c.scale.min_lanes, c.scale.cooldown, c.scale.tolerance)
            sc.max_lanes = c.scale.max_lanes or self.max_lanes
    def observe(self, step: str, load: StepLoad) -> None:
        """Record an epoch's statistics and measure decisions old enough to judge."""
        self.history.add(step, load)
        for d in self.decisions:
            if d.step == step and d.measured is None and load.epoch >= d.epoch + MEASURE_AFTER - 1:
                if d.kind is DecisionKind.REWRITE:  # the steps it made, each with its lanes
                    parts = {s: self._measure(s, d.epoch) for s in d.action["steps"]}
                    d.measured = {"steps": parts, "makespanMs": round(sum(p["makespanMs"] for p in parts.values()), 1)}
                else:
                    d.measured = self._measure(step, d.epoch)

    def _measure(self, step: str, since_epoch: int) -> dict[str, Any]:
        """The step's lanes' mean busy time since ``since_epoch``."""
        since = [x for x in self.history.epochs(step) if x.epoch >= since_epoch]
        if not since:
            return {"epochs": [], "laneBusyMs": [], "makespanMs": 0.0}
        lanes = max(x.lanes for x in since)
        busy = np.mean([np.pad(x.lane_busy_ms, (0, lanes - len(x.lane_busy_ms))) for x in since], axis=0)
        return {
            "epochs": [since[0].epoch, since[-1].epoch],
            "laneBusyMs": _round(busy),
            "makespanMs": round(float(busy.max()), 1),
        }

    def recent(self, n: int = RECENT) -> list[dict[str, Any]]:
        return [d.to_json() for d in self.decisions[-n:]]

    # ------------------------------------------------------------------ state
    def state(self, statistics: bool = True) -> ManagerState:
        """Everything the manager needs to decide after a restart as it would have without one:
        the statistics, the policies' hysteresis, what was placed, and of the decisions those
        still to be measured and the :data:`RECENT` ones (the others are never looked at again)."""
        keep = len(self.decisions) - RECENT
        return ManagerState(
            history={
                n: [LoadRecord.model_validate(fields_plain(x)) for x in self.history.epochs(n)]
                for n in self.history.steps()
                if self.routing and n in self.steps
            }
            if statistics
            else None,
            balancers={
                n: BalancerState.model_validate(_pick(b.state(), BalancerState))
                for n, b in self.balancers.items()
            },
            scalers={
                n: ScalerState.model_validate(_pick(x.state(), ScalerState))
                for n, x in self.scalers.items()
            },
            placed=sorted(self.placed),
            box_lanes=dict(self._box_lanes),
            decisions=[
                DecisionRecord.model_validate(plain(d.to_json()))
                for i, d in enumerate(self.decisions)
                if d.measured is None or i >= keep
            ],
        )

    def restore(self, state: ManagerState) -> None:
        """Continue from ``state`` (the balancers and scalers keep their settings from the spec;
        a state without statistics leaves the load history as it is)."""
        if state.history is not None:
            self.history.restore(
                {n: [x.model_dump() for x in loads] for n, loads in state.history.items()}
            )
        for n, b in state.balancers.items():
            if n in self.balancers:
                self.balancers[n] = policies.Balancer.from_state(
                    {**self.balancers[n].state(), **b.model_dump()}
                )
        for n, x in state.scalers.items():
            if n in self.scalers:
                self.scalers[n] = policies.Scaler.from_state(
                    {**self.scalers[n].state(), **x.model_dump()}
                )
        self.placed = set(state.placed)
        self._box_lanes = dict(state.box_lanes)
        self.decisions = [Decision(**d.model_dump()) for d in state.decisions]

    # ------------------------------------------------------------------ decide
    def check_request(self, request: dict[str, Any], lanes_cap: int, lanes_now: int) -> str:
        """The step an operator's routing request is for; raises ValueError naming what does not
        fit. ``{"step", "rebalance": true}``, ``{"step", "lanes": n}`` or ``{"step", "move":
        {key group: lane}}``; ``lanes_now``: the step's lanes in the last commit."""
        step = request.get("step")
        if step not in self.steps:
            raise ValueError(f"route: expected a stateful step the manager routes ({', '.join(sorted(self.steps))}), got {step!r}")
        actions = [k for k in ("rebalance", "lanes", "move") if k in request]
        if len(actions) != 1:
            raise ValueError("route: expected exactly one of rebalance, lanes, move")
        if "lanes" in request:
            lanes = request["lanes"]
            if self.spec.control.scale is None:
                raise ValueError(f"route {step}: the network has no control.scale, so its lane count is fixed (run with --lanes)")
            if not isinstance(lanes, int) or isinstance(lanes, bool) or not 1 <= lanes <= lanes_cap:
                raise ValueError(f"route {step}: expected lanes from 1 to {lanes_cap}, got {lanes!r}")
        if "move" in request:
            move = request["move"]
            if not isinstance(move, dict) or not move:
                raise ValueError(f"route {step}: expected move as a mapping key group -> lane")
            for kg, lane in move.items():
                if not str(kg).isdigit() or not 0 <= int(kg) < self.spec.key_groups:
                    raise ValueError(f"route {step}: key group {kg!r} is not one of 0..{self.spec.key_groups - 1}")
                if not isinstance(lane, int) or isinstance(lane, bool) or not 0 <= lane < lanes_now:
                    raise ValueError(f"route {step}: expected a lane from 0 to {lanes_now - 1} for key group {kg}, got {lane!r}")
        return str(step)

    def request(self, request: dict[str, Any]) -> None:
        """Queue an operator's routing request (checked by :meth:`check_request`) for the step's
        next plan; a later request for the same step replaces it."""
        self.requests[str(request["step"])] = request

    def plan(
        self, epoch: int, step: str, table: RoutingTable, upcoming: np.ndarray | None = None
    ) -> tuple[RoutingTable, list[Decision]]:
        """The step's routing table for ``epoch``, through the policy stages in turn (see
        :meth:`stages`), and the decisions that changed it. ``upcoming``: the epoch's input rows
        per key group, when the engine could read them ahead (``balance.lookahead``)."""
        if step not in self.steps:
            return table, []
        series = self.history.series(step)
        out: list[Decision] = []
        for stage in self.stages():
            table, made = stage(StepContext(epoch, step, series, upcoming, tuple(out)), table)
            out.extend(made)
        self.decisions.extend(out)
        del self.decisions[:-200]
        return table, out

    def stages(self) -> tuple[Stage, ...]:
        """The policy stages, in order: placement (once), rescaling, balancing (not in an epoch
        that rescales), spreading hot key groups, relocation drills. Each takes the table the
        stages before it left and returns its own table and decisions."""
        return (self._operator, self._place, self._rescale, self._balance, self._spread, self._chaos)

    def _operator(self, ctx: StepContext, table: RoutingTable) -> tuple[RoutingTable, list[Decision]]:
        """An operator's request for this step, if one waits (see :meth:`request`)."""
        req = self.requests.pop(ctx.step, None)
        if req is None:
            return table, []
        why: dict[str, Any] = {"reason": "operator", "command": req.get("id")}
        if "lanes" in req:
            return self._rescaled(ctx, table, int(req["lanes"]), why)
        if "move" in req:
            # (lanes were checked against the committed table, which this first stage starts from)
            moves = {int(kg): int(lane) for kg, lane in req["move"].items()}
            moves = {kg: lane for kg, lane in moves.items() if table.assignment[kg] != lane and lane < table.lanes}
        else:  # a rebalance now, whatever the threshold, patience and cool-down
            window = ctx.series[:, -3:]
            c = self.spec.control.balance
            found = policies.balance(window, np.asarray(table.assignment), table.lanes, threshold=0.0,
                                     max_moves=c.max_moves if c else 8, method=c.method if c else "one_way") if (
                window.size and table.lanes > 1) else []
            moves = {m.item: m.dst for m in found}
        if not moves:
            return table, []
        d = self._decision(ctx.epoch, ctx.step, DecisionKind.BALANCE, table, moves, ctx.series, why)
        return table.moved(moves), [d]

    def _place(self, ctx: StepContext, table: RoutingTable) -> tuple[RoutingTable, list[Decision]]:
        """Once, from a declared profile at once or after the warm-up."""
        c = self.spec.control
        epoch, step, series = ctx.epoch, ctx.step, ctx.series
        if c.placement == "uniform":
            self.placed.add(step)
            return table, []
        if step in self.placed:
            return table, []
        if step in self.boxes:
            if series.shape[1] < c.warmup_epochs:
                return table, []
            lane = self._place_box(step, table.lanes)
            self.placed.add(step)
            if lane == table.assignment[0]:
                return table, []
            d = self._decision(
                epoch,
                step,
                DecisionKind.PLACEMENT,
                table,
                {0: lane},
                series,
                {
                    "policy": c.placement,
                    "box": "parallelism 1: the whole step is placed",
                    "boxes": self.boxes,
                },
            )
            return table.moved({0: lane}), [d]
        prof = self.profile.get(step)
        if prof is None and series.shape[1] < c.warmup_epochs:
            return table, []
        basis = np.asarray(prof, dtype=float) if prof is not None else series
        new = policies.place_by(c.placement, basis, table.lanes)
        self.placed.add(step)
        moves = {kg: int(x) for kg, x in enumerate(new) if x != table.assignment[kg]}
        now = (
            policies.lane_loads(basis, np.asarray(table.assignment), table.lanes).mean(axis=1).max()
        )
        then = policies.lane_loads(basis, new, table.lanes).mean(axis=1).max()
        if not moves or now <= 0 or then > now * (1 - c.min_gain):
            return table, []  # not worth moving state for: the current placement is as good
        d = self._decision(
            epoch,
            step,
            DecisionKind.PLACEMENT,
            table,
            moves,
            basis,
            {
                "policy": c.placement,
                "source": "profile" if prof is not None else f"{series.shape[1]} epochs",
            },
        )
        return table.moved(moves), [d]

    def _rescale(
        self, ctx: StepContext, table: RoutingTable
    ) -> tuple[RoutingTable, list[Decision]]:
        """On schedule, or to the lane count the DS2 rate model asks for."""
        scale = self.spec.control.scale
        epoch, step, series = ctx.epoch, ctx.step, ctx.series
        if scale is None:
            return table, []
        target = scale.schedule.get(epoch)
        why: dict[str, Any] = {"reason": "schedule"}
        if target is None and scale.auto and series.shape[1] >= 2:
            arrival, true_rate = self.history.rates(step)
            target = self.scalers[step].decide(epoch, table.lanes, arrival, true_rate)
            why = {
                "reason": "rate model (DS2)",
                "arrivalRowsPerSec": round(arrival, 1),
                "trueRowsPerSecPerLane": round(true_rate, 1),
                "targetUtilization": scale.target_utilization,
                "utilization": round(arrival / (true_rate * table.lanes), 3) if true_rate else None,
            }
        if target is None:
            return table, []
        return self._rescaled(ctx, table, target, why)

    def _rescaled(
        self, ctx: StepContext, table: RoutingTable, target: int, why: dict[str, Any]
    ) -> tuple[RoutingTable, list[Decision]]:
        """``table`` rescaled to ``target`` lanes, moving as little recent load as possible."""
        epoch, step, series = ctx.epoch, ctx.step, ctx.series
        if target == table.lanes:
            return table, []
        loads = series[:, -3:].mean(axis=1) if series.size else np.zeros(table.key_groups)
        assignment = policies.rescale_assignment(loads, np.asarray(table.assignment), target)
        moved = int(np.sum(np.asarray(table.assignment) != assignment))
        after = (
            policies.lane_loads(series[:, -3:], assignment, target).mean(axis=1)
            if series.size
            else np.zeros(target)
        )
        d = Decision(
            epoch,
            step,
            DecisionKind.RESCALE,
            {"lanes": [table.lanes, target], "keyGroupsMoved": moved},
            {**why, "laneBusyMs": _round(self._lane_busy(step))},
            {
                "laneLoadMs": _round(after),
                "makespanMs": round(float(after.max()), 1) if after.size else 0.0,
            },
        )
        return table.rescaled(target, assignment), [d]

    def _balance(
        self, ctx: StepContext, table: RoutingTable
    ) -> tuple[RoutingTable, list[Decision]]:
        """Pairwise moves between the most and least loaded lanes, over the epochs since the hot
        set last shifted (or the coming epoch's input, read ahead, when it shifted); not in an
        epoch that rescales."""
        c = self.spec.control
        epoch, step, series = ctx.epoch, ctx.step, ctx.series
        if any(d.kind == DecisionKind.RESCALE or d.why.get("reason") == "operator" for d in ctx.earlier):
            return table, []  # (nor right after an operator's change: it would undo it)
        if step not in self.balancers or series.shape[1] < 2 or table.lanes <= 1:
            return table, []
        recent = series[:, -c.balance.window :] if c.balance else series
        # only what came after a shift of the hot set
        window = recent[:, -policies.since_shift(recent) :]
        ahead, foreseen = coming_load(self.history, step, recent, ctx.upcoming)
        if ahead is not None:
            window = ahead[:, None]
        moves = self.balancers[step].decide(
            epoch, window, np.asarray(table.assignment), table.lanes
        )
        if not moves:
            return table, []
        mv = {m.item: m.dst for m in moves}
        d = self._decision(
            epoch,
            step,
            DecisionKind.BALANCE,
            table,
            mv,
            window,
            {
                "policy": c.balance.method if c.balance else "",
                "threshold": c.balance.threshold if c.balance else 0,
                "scores": {str(m.item): round(m.score, 3) for m in moves},
                **(
                    {
                        "lookahead": {
                            **foreseen,
                            "note": "the coming epoch's work shifted: its input read ahead (and the held "
                            "input the watermark releases) x last epoch's ms per row worked on",
                        }
                    }
                    if ahead is not None
                    else {}
                ),
            },
        )
        return table.moved(mv), [d]

    def _spread(self, ctx: StepContext, table: RoutingTable) -> tuple[RoutingTable, list[Decision]]:
        """SPREADFIRE: split a key group hotter than a fair lane's share (on schedule or when seen)."""
        cfg = self.spec.control.spread
        epoch, step, series = ctx.epoch, ctx.step, ctx.series
        if cfg is None or step not in self.spreadable or table.lanes <= 1:
            return table, []
        wanted = [int(g) for g in cfg.schedule.get(epoch, ())]
        why: dict[str, Any] = {"reason": "schedule"}
        if not wanted and cfg.auto and series.shape[1] >= 2:
            recent = series[:, -3:].mean(axis=1)
            fair = recent.sum() / table.lanes
            hot = int(np.argmax(recent))
            if fair > 0 and recent[hot] > cfg.hot_share * fair and hot not in table.spread:
                wanted = [hot]
                latest = self.history.latest(step)
                why = {
                    "reason": "hot key group",
                    "keyGroupLoadMs": round(float(recent[hot]), 1),
                    "fairLaneLoadMs": round(float(fair), 1),
                    "hotShare": cfg.hot_share,
                    "rows": int(self.history.rows_series(step, 3)[hot].sum()),
                    "hotKeys": [
                        h
                        for h in (latest.hot_keys if latest else [])
                        if int(h["kg"]) % table.key_groups == hot
                    ],
                }
        wanted = [g for g in wanted if g not in table.spread]
        if not wanted:
            return table, []
        lane_load = (
            policies.lane_loads(series[:, -3:], np.asarray(table.assignment), table.lanes).mean(
                axis=1
            )
            if series.size
            else np.zeros(table.lanes)
        )
        spread = dict(table.spread)
        for g in wanted:
            others = [
                ln
                for ln in np.argsort(lane_load, kind="stable").tolist()
                if ln != table.assignment[g]
            ]
            spread[g] = tuple(int(x) for x in others[: cfg.fanout - 1]) or (table.assignment[g],)
        table = table.with_spread(spread)
        d = Decision(
            epoch,
            step,
            DecisionKind.SPREAD,
            {"keyGroups": {str(g): [table.assignment[g], *spread[g]] for g in wanted}},
            {**why, "laneBusyMs": _round(self._lane_busy(step))},
            {"fragments": cfg.fanout, "note": "new rows split; old state stays and is probed"},
        )
        return table, [d]

    def _chaos(self, ctx: StepContext, table: RoutingTable) -> tuple[RoutingTable, list[Decision]]:
        return relocation_drill(self.spec.control.chaos, ctx.epoch, ctx.step, table)

    # ------------------------------------------------------------------ helpers
    def _place_box(self, step: str, lanes: int) -> int:
        """Place all parallelism-1 steps together, each as one item, by the placement policy."""
        if step not in self._box_lanes:
            series = [self.history.series(b).sum(axis=0) for b in self.boxes]
            width = min(len(x) for x in series)
            basis = (
                np.stack([x[-width:] for x in series]) if width else np.zeros((len(self.boxes), 1))
            )
            placed = policies.place_by(self.spec.control.placement, basis, lanes)
            self._box_lanes.update(
                {b: int(lane) for b, lane in zip(self.boxes, placed, strict=True)}
            )
        return self._box_lanes[step]

    def _lane_busy(self, step: str) -> list[float]:
        last = self.history.latest(step)
        return last.lane_busy_ms if last else []

    def _decision(
        self,
        epoch: int,
        step: str,
        kind: DecisionKind,
        table: RoutingTable,
        moves: dict[int, int],
        series: np.ndarray,
        why: dict[str, Any],
    ) -> Decision:
        window = series[:, -3:] if series.size else series
        before = policies.lane_loads(window, np.asarray(table.assignment), table.lanes).mean(axis=1)
        after_assign = np.asarray(table.assignment).copy()
        for kg, lane in moves.items():
            after_assign[kg] = lane
        after = policies.lane_loads(window, after_assign, table.lanes).mean(axis=1)
        return Decision(
            epoch,
            step,
            kind,
            {"moves": [[kg, table.assignment[kg], lane] for kg, lane in sorted(moves.items())]},
            {
                **why,
                "laneLoadMs": _round(before),
                "makespanMs": round(float(before.max()), 1) if before.size else 0.0,
            },
            {
                "laneLoadMs": _round(after),
                "makespanMs": round(float(after.max()), 1) if after.size else 0.0,
            },
        )


def _read_profile(path: str) -> dict[str, list[list[float]]]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(
            f"control.profile: {path}: expected a JSON object {{step: [[load per epoch] per key group]}}"
        )
    return data


def _pick(state: dict[str, Any], model: type[BalancerState] | type[ScalerState]) -> dict[str, Any]:
    """Of a policy's :meth:`state`, the hysteresis (its settings come from the spec)."""
    return {k: state[k] for k in model.model_fields}
