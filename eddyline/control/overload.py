"""Overload: hot spots, admission control and coordinated shedding, decided once per epoch.

**The cost model** comes from the statistics of recent epochs. An epoch takes

    D = F + a * N + sum_S c_S * K_S

milliseconds: ``F`` is the fixed overhead of an epoch (Spark jobs, planning, commit), ``a`` the
cost of reading and routing one source row in the JVM, and ``c_S`` the cost of one row kept for
stateful step ``S``, measured at the step's *slowest lane* (its makespan per row: skew counts).
``K_S`` are the rows the step keeps after shedding. ``F`` and ``a`` are fitted to the part of
``D`` the lanes do not explain.

**Hot spots** (rate-based, seed 003): a step whose arrival rate exceeds its true processing rate
(rows per second of its lanes' busy time, times its lanes) is a hot spot; the critical path is the
chain of steps with the largest cost per source row.

**Admission control** takes at most ``N`` offsets so that ``D`` fits ``headroom × bound``
(shedding off), or so that reading alone fits (shedding on: what is read and cannot be processed
is shed rather than left waiting). Backlog stays in the source and is reported as lag.

**Coordinated shedding** builds the network as the LP of :mod:`eddyline.control.shedding` sees
it: sources with this epoch's rows, each stateful step on the node ``epoch`` with its cost and
selectivity, the stateless chains between them as zero-cost steps with their measured
selectivities, and every query output (sink) with its utility. Shed points are the input arcs of
stateful steps (a join sheds its second input only, so its output stays linear in the keep
fraction); the LP decides where dropping costs the least utility, upstream steps included.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from eddyline.api.control import Overload
from eddyline.api.network import NetworkSpec
from eddyline.control import shedding as lp
from eddyline.control.costmodel import CostModel, EpochCost, fit
from eddyline.control.state import OverloadState, fields_plain, plain


class Outcome(StrEnum):
    """What the overload controller concluded for an epoch; the value is the ``reason`` its
    explanation gives (shedding adds its mode: ``shedding (lp)``)."""

    #: no cost model yet (fewer than two epochs with input): take at most twice what went well
    WARMING_UP = "warming up (slow start)"
    #: a cost model, but nothing to read
    NO_INPUT = "no input"
    #: everything available fits the budget (only slow start may cap it)
    FITS = "fits the bound"
    #: even an empty epoch overruns the bound: it cannot be met at all, keep up as well as possible
    BELOW_OVERHEAD = "bound below the fixed epoch overhead"
    #: shedding is off (or nothing to shed): read fewer offsets, the rest waits in the source
    ADMISSION = "admission control"
    #: read what waits and shed rows before stateful steps so the epoch fits the budget
    SHEDDING = "shedding"


#: Outcomes not worth a decision in the log unless they cap or shed something.
QUIET = frozenset({Outcome.WARMING_UP, Outcome.NO_INPUT, Outcome.FITS})


@dataclass(frozen=True)
class OverloadVerdict:
    """:meth:`OverloadController.plan`'s answer for one epoch."""

    outcome: Outcome
    #: per source: the offsets to take at most (admission control, slow start)
    caps: dict[str, int]
    #: per stateful step: {"keep": [per input], "seed", "mode", "thresholds"}
    shed: dict[str, dict[str, Any]]
    #: the statistics and the model behind it, for the decision's explanation (``reason``: the
    #: outcome's value)
    explain: dict[str, Any]

    @property
    def worth_reporting(self) -> bool:
        """Whether the epoch's plan logs an overload decision: when it caps or sheds, or when
        the outcome says more than "all is well" (the bound cannot be met, admission control)."""
        return bool(self.caps or self.shed) or self.outcome not in QUIET

    def to_json(self) -> dict[str, Any]:
        """The verdict as the plain dict it used to be."""
        return {"caps": self.caps, "shed": self.shed, "explain": self.explain}


@dataclass
class OverloadController:
    spec: NetworkSpec
    depth: int = 8
    history: deque[EpochCost] = field(init=False)

    def __post_init__(self) -> None:
        assert self.spec.control.overload is not None
        self.cfg: Overload = self.spec.control.overload
        self.bound_ms = float(self.spec.latency_bound or 0)
        self.history = deque(maxlen=self.depth)
        self.stateful = [s for s in self.spec.steps if s.stateful]
        self.thresholds: dict[str, list[float]] = {}  # semantic: utility quantiles seen last epoch
        self._declared_off = False  # a declared cost model that measurements contradicted
        self.model_check: dict[str, Any] | None = None

    @property
    def _declared(self) -> bool:
        """Whether the declared ``cost_model`` is in force (one exists and was not switched off)."""
        return self.cfg.cost_model is not None and not self._declared_off

    # ------------------------------------------------------------------ monitor
    def observe(
        self,
        cost: EpochCost,
        quantiles: dict[str, list[float]] | None = None,
        *,
        cold: bool = False,
    ) -> None:
        """Record an epoch; a ``cold`` one (the first of a process: JVM and Python workers warm
        up) only updates the semantic thresholds, its timing would mislead the cost model."""
        for step, q in (quantiles or {}).items():
            if q:
                self.thresholds[step] = q
        if cold and self.cfg.cost_model is None:
            return
        if self.history and self.history[-1].epoch >= cost.epoch:
            while self.history and self.history[-1].epoch >= cost.epoch:
                self.history.pop()
        before = self.model() if self.history else None
        self.history.append(cost)
        if before is not None and sum(cost.read_rows.values()) > 0:
            self._check(before, cost, cold)

    def _check(self, m: CostModel, cost: EpochCost, cold: bool) -> None:
        """Compare the epoch with what the model predicted for its rows. A declared model that
        misses by more than 1.5x either way in two epochs running gives way to the fitted one
        (and says so): the cost of a step can grow with its state, and a machine can slow down."""
        predicted = m.predicted_ms(sum(cost.read_rows.values()), {k: sum(v) for k, v in cost.kept.items()})
        ratio = cost.duration_ms / predicted if predicted > 0 else None
        declared = self._declared
        missed = ratio is not None and not cold and (ratio > 1.5 or ratio < 1 / 1.5)
        misses = (self.model_check or {}).get("misses", 0) + 1 if missed else 0
        self.model_check = {
            "epoch": cost.epoch,
            "model": "declared" if declared else "fitted",
            "predictedMs": round(predicted, 1),
            "measuredMs": round(cost.duration_ms, 1),
            "ratio": round(ratio, 3) if ratio is not None else None,
            "misses": misses,
        }
        refit = self.cfg.cost_model is not None and self.cfg.cost_model.on_miss == "refit"
        if (
            declared and refit and misses >= 2
        ):  # a model existed before this epoch, so a fitted one does too
            self._declared_off = True
            self.model_check["switched"] = (
                "the declared cost model missed twice by more than 1.5x: fitted from now on"
            )

    def state(self) -> OverloadState:
        """The cost history, thresholds and model check, kept in each commit: decisions after a
        restart then equal those of an uninterrupted run (they change the output, unlike routing)."""
        return OverloadState.model_validate(
            plain(
                {
                    "history": [fields_plain(h) for h in self.history],
                    "thresholds": self.thresholds,
                    "declared_off": self._declared_off,
                    "model_check": self.model_check,
                }
            )
        )

    def restore(self, state: OverloadState | Mapping[str, Any]) -> None:
        if not isinstance(state, OverloadState):
            state = OverloadState.model_validate(plain(state))
        self.history.clear()
        for h in state.history:
            self.history.append(EpochCost(**h.model_dump()))
        self.thresholds = {k: list(v) for k, v in state.thresholds.items()}
        self._declared_off = state.declared_off
        self.model_check = state.model_dump()["model_check"]

    def model(self) -> CostModel | None:
        """The cost model in force: fitted from the recent epochs, or the declared one."""
        declared = self.cfg.cost_model if self._declared else None
        return fit(list(self.history), self.stateful, self.spec, declared, self._producer)

    def hot_spots(self) -> list[dict[str, Any]]:
        """Steps whose arrival rate exceeds their true processing rate (rows/s)."""
        out = []
        recent = list(self.history)[-3:]
        wall = sum(h.wall_s for h in recent)
        for s in self.stateful:
            rows = sum(sum(h.kept.get(s.name, [])) for h in recent)
            busy_s = sum(h.busy_ms.get(s.name, 0.0) for h in recent) / 1000
            lanes = recent[-1].lanes.get(s.name, 1) if recent else 1
            if not rows or not wall or not busy_s:
                continue
            arrival = sum(sum(h.offered.get(s.name, [])) for h in recent) / wall
            true_rate = rows / busy_s * lanes
            out.append(
                {
                    "step": s.name,
                    "arrivalRowsPerSec": round(arrival, 1),
                    "trueRowsPerSec": round(true_rate, 1),
                    "hot": arrival > true_rate,
                }
            )
        return out

    def critical_path(self) -> dict[str, Any] | None:
        """The source-to-output chain of stateful steps with the largest cost per source row."""
        m = self.model()
        if m is None:
            return None
        best: dict[str, Any] | None = None
        for q in self.spec.sinks:
            chain, name = [], q.input
            while True:
                producer = self._producer(name)
                if producer not in m.step_ms_per_row:
                    break
                chain.append(producer)
                name = self.spec.node(producer).inputs[-1]
            ms = sum(m.step_ms_per_row[s] * sum(m.input_fraction[s]) for s in chain)
            if best is None or ms > best["msPerSourceRow"]:
                best = {"output": q.name, "steps": chain[::-1], "msPerSourceRow": round(ms, 5)}
        return best

    # ------------------------------------------------------------------ decide
    def plan(self, epoch: int, available: dict[str, int]) -> OverloadVerdict:
        """Caps per source (offsets to take) and keep fractions per step input, explained."""
        m = self.model()
        total = sum(available.values())
        budget = self.cfg.headroom * self.bound_ms
        decision: dict[str, Any] = {
            "boundMs": self.bound_ms,
            "budgetMs": round(budget, 1),
            "availableRows": total,
            **({"modelCheck": self.model_check} if self.model_check else {}),
        }
        # Slow start: never take more than twice what the last epoch took (and met the bound
        # with), so the cost model is not extrapolated far beyond what it has seen.
        last = self.history[-1] if self.history else None
        taken = sum(last.read_rows.values()) if last else 0
        probe = max(
            self.cfg.probe_rows, 2 * taken if last and last.duration_ms <= budget else taken
        )
        if self._declared:  # declared costs need no probing
            probe = total
        if m is None or total == 0:
            caps = _split(available, probe) if total > probe else {}
            outcome = Outcome.WARMING_UP if m is None else Outcome.NO_INPUT
            return OverloadVerdict(
                outcome,
                caps,
                {},
                {**decision, "reason": outcome.value, "takeRows": min(total, probe)},
            )
        # processing cost per source row, if nothing is shed (upstream selectivities are already
        # in the measured input fractions)
        per_row_processing = sum(m.step_ms_per_row[s] * sum(m.input_fraction[s]) for s in m.step_ms_per_row)
        predicted = m.fixed_ms + (m.read_ms_per_row + per_row_processing) * total
        decision.update(
            {
                "model": {
                    k: (round(v, 4) if isinstance(v, float) else _rounded(v)) for k, v in m.to_json().items()
                },
                "predictedMsAllRows": round(predicted, 1),
            }
        )
        if predicted <= budget:
            caps = _split(available, probe) if total > probe else {}
            return OverloadVerdict(
                Outcome.FITS,
                caps,
                {},
                {**decision, "reason": Outcome.FITS.value, "takeRows": min(total, probe)},
            )
        if budget <= m.fixed_ms:
            # Even an empty epoch overruns the bound: neither deferring nor shedding can meet
            # it, so keep up with the input as well as possible and say why.
            caps = _split(available, probe) if total > probe else {}
            return OverloadVerdict(
                Outcome.BELOW_OVERHEAD,
                caps,
                {},
                {**decision, "reason": Outcome.BELOW_OVERHEAD.value, "takeRows": min(total, probe)},
            )
        if self.cfg.shedding == "off" or not m.step_ms_per_row:
            n = max(1, int((budget - m.fixed_ms) / max(m.read_ms_per_row + per_row_processing, 1e-9)))
            caps = _split(available, min(n, total, probe))
            return OverloadVerdict(
                Outcome.ADMISSION,
                caps,
                {},
                {
                    **decision,
                    "reason": Outcome.ADMISSION.value,
                    "takeRows": sum(caps.values()),
                    "predictedMs": round(
                        m.fixed_ms + (m.read_ms_per_row + per_row_processing) * sum(caps.values()), 1
                    ),
                },
            )
        return self._shed(epoch, m, available, budget, last, decision)

    def _shed(
        self,
        epoch: int,
        m: CostModel,
        available: dict[str, int],
        budget: float,
        last: EpochCost | None,
        decision: dict[str, Any],
    ) -> OverloadVerdict:
        """The shedding verdict of :meth:`plan`: an epoch that overruns the budget and sheds."""
        total = sum(available.values())
        # Shedding: read what is waiting (so the backlog does not grow), as far as reading alone
        # fits the budget, and shed processing so the epoch fits the rest.
        n_read = total  # while shedding, read what waits: the backlog must not grow
        if m.read_ms_per_row > 0 and m.fixed_ms + m.read_ms_per_row * n_read > budget:
            n_read = min(n_read, max(self.cfg.probe_rows, int((budget - m.fixed_ms) / m.read_ms_per_row * 0.9)))
        caps = _split(available, n_read) if n_read < total else {}
        capacity = max(0.0, budget - m.fixed_ms - m.read_ms_per_row * n_read)
        # While shedding goes on, a keep fraction may at most double (or rise by 0.15) from one
        # epoch to the next: the model was fitted on epochs that kept fewer rows, and a step's
        # cost per kept row can grow with what it keeps (its state). Falling is never limited.
        # Likewise a step is never handed more than twice the most rows it kept in any epoch of
        # the history: its cost per row was measured on smaller epochs and need not extrapolate
        # (the first shedding epoch of a burst is where that bites). A declared model says its
        # costs are linear, so it is not held to what was seen. The LP gets these as upper
        # bounds, so the capacity a bounded step cannot use goes to the others.
        offered_rows = {
            (s.name, i): n_read * _at(m.input_fraction[s.name], i)
            for s in self.stateful
            for i in range(len(s.inputs))
        }
        bounds = self._keep_bounds(offered_rows, last)
        problem = self.problem(
            m,
            {s: c for s, c in (caps or available).items()},
            capacity,
            {lp.arc(f"{s}#{i}", s): b * offered_rows[(s, i)] for (s, i), b in bounds.items()},
        )
        if self.cfg.shedding == "lp":
            plan = lp.solve(problem)
        else:  # one keep fraction at every shed point: the baseline the LP is measured against
            x = float(lp.uniform_plan(problem).explanation["keep_fraction"])
            plan = lp.evaluate(
                problem, {a: x for a in problem.shed_points or ()}, scale_overloaded=False
            )
        limited: dict[str, list[float]] = {}
        keep: dict[str, list[float]] = {}
        clamped = False
        for s in self.stateful:
            ks = []
            for i in range(len(s.inputs)):
                k = plan.keep.get(lp.arc(f"{s.name}#{i}", s.name), 1.0)
                bound = bounds.get((s.name, i))
                if bound is not None and k >= bound * 0.999:
                    clamped = (
                        clamped or k > bound * 1.001
                    )  # the uniform baseline ignores the LP's bounds
                    k = min(k, bound)
                    limited.setdefault(s.name, [1.0] * len(s.inputs))[i] = round(k, 4)
                ks.append(round(max(self.cfg.min_keep, min(1.0, k)), 4) if k < 0.999 else 1.0)
            if any(k < 1.0 for k in ks):
                keep[s.name] = ks
        if clamped:
            plan = lp.evaluate(
                problem,
                {lp.arc(f"{s}#{i}", s): k for s, ks in keep.items() for i, k in enumerate(ks)},
                scale_overloaded=False,
            )
        shed = {
            s: {
                "keep": ks,
                "seed": self.seed(epoch, s),
                "mode": self.cfg.mode,
                **({"thresholds": self._cuts(s, ks)} if self.cfg.mode == "semantic" else {}),
            }
            for s, ks in keep.items()
        }
        decision.update(
            {
                "reason": f"{Outcome.SHEDDING.value} ({self.cfg.shedding})",
                "takeRows": n_read,
                "capacityMs": round(capacity, 1),
                "status": plan.status,
                "keep": {s: v["keep"] for s, v in shed.items()},
                "expectedUtility": round(plan.utility, 2),
                "expectedThroughput": {k: round(v, 1) for k, v in plan.throughput.items()},
                "predictedMs": round(
                    m.fixed_ms + m.read_ms_per_row * n_read + plan.node_load.get("epoch", 0.0), 1
                ),
                **({"keepRiseLimited": limited} if limited else {}),
            }
        )
        return OverloadVerdict(Outcome.SHEDDING, caps, shed, decision)

    def _keep_bounds(
        self, offered_rows: dict[tuple[str, int], float], last: EpochCost | None
    ) -> dict[tuple[str, int], float]:
        """Upper bounds on the keep fraction of each stateful step's inputs (see :meth:`plan`),
        given the rows expected to reach each input this epoch."""
        fitted = not self._declared
        previous = self._applied_keep(last)
        out: dict[tuple[str, int], float] = {}
        for s in self.stateful:
            for i in range(len(s.inputs)):
                cap = 1.0
                prev = previous.get(s.name, [1.0] * len(s.inputs))[i]
                if prev < 0.999:
                    cap = max(2 * prev, prev + 0.15)
                most = max(
                    (h.kept[s.name][i] for h in self.history if len(h.kept.get(s.name, [])) > i),
                    default=0,
                )
                offered = offered_rows[(s.name, i)]
                if fitted and most > 0 and offered > 2 * most:
                    cap = min(cap, 2 * most / offered)
                if cap < 1.0:
                    out[(s.name, i)] = cap
        return out

    def _applied_keep(self, last: EpochCost | None) -> dict[str, list[float]]:
        """The keep fraction each stateful step's inputs had in the last epoch (kept / offered)."""
        if last is None:
            return {}
        out = {}
        for s, offered in last.offered.items():
            kept = last.kept.get(s, offered)
            out[s] = [k / o if o else 1.0 for k, o in zip(kept, offered, strict=False)]
        return out

    def problem(
        self,
        m: dict[str, Any],
        rows: dict[str, int],
        capacity: float,
        max_admitted: dict[str, float] | None = None,
    ) -> lp.ShedProblem:
        """The network as the shedding LP sees it, for this epoch's rows."""
        read = sum(rows.values())
        steps: list[lp.StepLoad] = []
        points: list[str] = []
        src = "rows"
        rates = {src: float(read)}
        for s in self.stateful:
            inputs = []
            for i, name in enumerate(s.inputs):
                producer = self._producer(name)
                tail = producer if producer in m.step_ms_per_row else src
                frac = (
                    m.input_fraction[s.name][i] if i < len(m.input_fraction[s.name]) else 0.0
                )
                base = (
                    1.0
                    if tail == src
                    else max(m.selectivity[tail] * _fraction_sum(m, tail), 1e-12)
                )
                steps.append(lp.StepLoad(f"{s.name}#{i}", "jvm", 0.0, frac / base, (tail,)))
                inputs.append(f"{s.name}#{i}")
                if i in s.info.shed_inputs(s):
                    points.append(lp.arc(f"{s.name}#{i}", s.name))
            steps.append(
                lp.StepLoad(
                    s.name, "epoch", m.step_ms_per_row[s.name], m.selectivity[s.name], tuple(inputs)
                )
            )
        utilities = {}
        for q in self.spec.sinks:
            producer = self._producer(q.input)
            tail = producer if producer in m.step_ms_per_row else src
            steps.append(
                lp.StepLoad(f"q:{q.name}", "jvm", 0.0, m.sink_selectivity[q.name], (tail,))
            )
            utilities[f"q:{q.name}"] = q.qos.utility if q.qos else 1.0
        return lp.ShedProblem(
            rates,
            tuple(steps),
            {"epoch": capacity, "jvm": 1e18},
            utilities,
            tuple(points),
            {a: v for a, v in (max_admitted or {}).items() if a in points} or None,
        )

    def seed(self, epoch: int, step: str) -> int:
        return zlib.crc32(f"{self.cfg.seed}:{epoch}:{step}".encode()) & 0x7FFFFFFF

    def _cuts(self, step: str, keep: list[float]) -> list[float | None]:
        """Semantic shedding: the utility above which a row is kept, from last epoch's quantiles."""
        q = self.thresholds.get(step)
        if not q:
            return [None for _ in keep]
        return [
            None if k >= 1.0 else float(q[min(len(q) - 1, int(round((1 - k) * (len(q) - 1))))])
            for k in keep
        ]

    def _producer(self, name: str) -> str:
        """The nearest source or stateful step a node's rows come from (through stateless steps)."""
        while True:
            node = self.spec.node(name)
            if not node.inputs or getattr(node, "stateful", False):
                return name
            name = node.inputs[0]


def _at(values: list[float], i: int) -> float:
    return float(values[i]) if i < len(values) else 0.0


def _fraction_sum(m: CostModel, step: str) -> float:
    return float(sum(m.input_fraction[step]))


def _split(available: dict[str, int], n: int) -> dict[str, int]:
    """Share ``n`` offsets among sources in proportion to what each has waiting."""
    total = sum(available.values())
    if total <= n:
        return dict(available)
    return {k: max(1 if v else 0, int(v * n / total)) for k, v in available.items()}


def _rounded(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    if isinstance(v, float):
        return round(v, 4)
    return v
