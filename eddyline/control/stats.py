"""Load statistics: what the policies see, folded from the lanes' manifests after each epoch.

A lane measures its own phases (receive, load, kernel, write) and counts rows per key group; it
cannot time one key group alone, because its kernel runs vectorised over all of them. A key
group's *load* is therefore the step's measured time shared out by a cost model: receiving in
proportion to the group's input rows, the kernel in proportion to the rows it worked on (its
input rows, unless the kernel holds input back until the watermark passes it: then the rows it
released, see :func:`eddyline.operators.base.deferred_counts`) or, where the kernel counts its
own work per key group (``KernelResult.kg_cost``: the pattern's rows times the open runs they
are tried against), in proportion to that count, loading and writing state in proportion to its
state rows. Summed over all groups it is exactly the step's busy time.

:class:`LoadHistory` keeps a sliding window of these per step, so policies get load time series,
their correlation coefficients (seed 001), lane shares of the makespan and the DS2 rates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StepLoad:
    """One stateful step in one epoch."""

    epoch: int
    lanes: int
    #: estimated busy milliseconds per (virtual) key group
    kg_load: dict[int, float]
    kg_rows: dict[int, int]
    kg_state_rows: dict[int, int]
    #: measured busy milliseconds per lane (index = lane)
    lane_busy_ms: list[float]
    input_rows: int
    state_rows: int
    state_bytes: int
    spilled_bytes: int
    #: wall-clock seconds this epoch's input took to arrive (since the previous epoch started)
    wall_s: float
    #: heavy hitters: the most frequent key of each lane's busiest key groups
    hot_keys: list[dict[str, Any]] = field(default_factory=list)
    #: rows the kernel worked on per key group (= kg_rows unless it holds input back)
    kg_work: dict[int, int] | None = None
    #: input rows held back per key group at the end of the epoch (a deferring kernel)
    kg_held: dict[int, int] = field(default_factory=dict)
    #: of the rows held at the start of the epoch: how many, and how many were worked on
    held_before: int = 0
    held_worked: int = 0

    @property
    def work(self) -> dict[int, int]:
        return self.kg_rows if self.kg_work is None else self.kg_work

    @property
    def makespan_ms(self) -> float:
        return max(self.lane_busy_ms, default=0.0)

    @property
    def busy_ms(self) -> float:
        return float(sum(self.lane_busy_ms))

    def lane_shares(self) -> list[float]:
        """Each lane's busy time as a share of the stage's makespan (1.0 = the slowest lane)."""
        span = self.makespan_ms
        return [round(b / span, 3) if span else 0.0 for b in self.lane_busy_ms]

    def state(self) -> dict[str, Any]:
        """Every field, JSON-able (key groups as strings); :meth:`from_state` restores it exactly."""
        out = asdict(self)
        for name in ("kg_load", "kg_rows", "kg_state_rows", "kg_work", "kg_held"):
            if out[name] is not None:
                out[name] = {str(k): v for k, v in out[name].items()}
        return out

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> StepLoad:
        out = dict(data)
        for name in ("kg_load", "kg_rows", "kg_state_rows", "kg_work", "kg_held"):
            if out.get(name) is not None:
                out[name] = {int(k): v for k, v in out[name].items()}
        return cls(**out)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "lanes": self.lanes,
            "inputRows": self.input_rows,
            "stateRows": self.state_rows,
            "stateBytes": self.state_bytes,
            "spilledBytes": self.spilled_bytes,
            "laneBusyMs": [round(b, 1) for b in self.lane_busy_ms],
            "laneShareOfMakespan": self.lane_shares(),
            "hotKeys": self.hot_keys,
            **(
                {"workRows": sum(self.kg_work.values()), "heldRows": sum(self.kg_held.values())}
                if self.kg_work is not None
                else {}
            ),
            "keyGroupLoadMs": {str(k): round(v, 2) for k, v in sorted(self.kg_load.items())},
        }


def step_load(
    epoch: int,
    lanes: int,
    manifests: Iterable[Mapping[str, Any]],
    wall_s: float,
    measure: str = "time",
) -> StepLoad:
    """Fold one step's lane manifests of one epoch into a :class:`StepLoad`. ``measure``
    (``control.load``): ``rows`` makes a key group's load the rows its kernel worked on, a
    count that does not depend on the machine's clock (runs then decide alike).

    A key group's load is the step's measured time per input row times its rows, plus the time
    per state row times its state rows, with both rates taken over *all* lanes of the step: on a
    shared machine one lane's clock is noisy (another process may have had its core), while row
    counts are exact, so the load follows the rows and the clocks only set the scale."""
    kg_rows: dict[int, int] = {}
    kg_state: dict[int, int] = {}
    kg_work: dict[int, int] = {}
    kg_held: dict[int, int] = {}
    kg_cost: dict[int, int] = {}
    defers = False
    held_before = held_worked = 0
    busy = [0.0] * lanes
    rows = state_rows = state_bytes = spilled = 0
    row_ms = work_ms = state_ms = 0.0
    hot: list[dict[str, Any]] = []
    for m in manifests:
        hot.extend(m.get("hot_keys", []))
        ms = m["ms"]
        if 0 <= m["lane"] < lanes:
            busy[m["lane"]] = float(sum(ms.values()))
        rows += m["input_rows"]
        state_rows += m["state_rows"]
        state_bytes += m["state_bytes"]
        spilled += m.get("spilled_bytes", 0)
        row_ms += ms.get("receive", 0.0)
        work_ms += ms.get("kernel", 0.0)
        state_ms += ms.get("load", 0.0) + ms.get("write", 0.0)
        _fold(kg_rows, m.get("kg_rows", {}))
        _fold(kg_state, m.get("kg_state_rows", {}))
        _fold(kg_cost, m.get("kg_cost", {}))
        if "kg_work" in m:
            defers = True
            _fold(kg_work, m["kg_work"])
            _fold(kg_held, m.get("kg_held", {}))
            held_before += int(m.get("held_before", 0))
            held_worked += int(m.get("held_worked", 0))
    work = kg_work if defers else kg_rows
    total_in, total_work, total_st = (
        sum(kg_rows.values()),
        sum(work.values()),
        sum(kg_state.values()),
    )
    if not total_work:  # no row worked on: the kernel's time went to the state (timers)
        state_ms, work_ms = state_ms + work_ms, 0.0
    if not total_in:
        state_ms, row_ms = state_ms + row_ms, 0.0
    if not total_st:  # no state: its time follows the rows
        if total_work:
            work_ms, state_ms = work_ms + state_ms, 0.0
        elif total_in:
            row_ms, state_ms = row_ms + state_ms, 0.0
    # the kernel's time follows its own count of work where it keeps one, else the rows it worked on
    charge = kg_cost if sum(kg_cost.values()) and total_work else work
    total_charge = sum(charge.values())
    per_row = row_ms / total_in if total_in else 0.0
    per_work = work_ms / total_charge if total_charge else 0.0
    per_state_row = state_ms / total_st if total_st else 0.0
    kg_load = {
        kg: kg_rows.get(kg, 0) * per_row
        + charge.get(kg, 0) * per_work
        + kg_state.get(kg, 0) * per_state_row
        for kg in set(kg_rows) | set(charge) | set(kg_state)
    }
    if measure == "rows":
        kg_load = {kg: float(n) for kg, n in work.items()}
    hot.sort(key=lambda h: -int(h["rows"]))
    return StepLoad(
        epoch,
        lanes,
        kg_load,
        kg_rows,
        kg_state,
        busy,
        rows,
        state_rows,
        state_bytes,
        spilled,
        wall_s,
        hot[:4],
        kg_work if defers else None,
        kg_held,
        held_before,
        held_worked,
    )


def _fold(into: dict[int, int], counts: Mapping[str, Any]) -> None:
    for k, v in counts.items():
        into[int(k)] = into.get(int(k), 0) + int(v)


@dataclass
class LoadHistory:
    """The last ``depth`` epochs of every stateful step's load."""

    key_groups: int
    depth: int = 30
    _steps: dict[str, deque[StepLoad]] = field(default_factory=dict)
    #: (id of a load, field) -> (the load, its figures per key group as a vector): every epoch's
    #: plan reads the last ``depth`` epochs' figures, of which only the newest are new
    _dense: dict[tuple[int, str], tuple[StepLoad, np.ndarray]] = field(default_factory=dict, repr=False, compare=False)

    def add(self, step: str, load: StepLoad) -> None:
        q = self._steps.setdefault(step, deque(maxlen=self.depth))
        if q and q[-1].epoch >= load.epoch:  # a replayed epoch replaces what a crash left
            while q and q[-1].epoch >= load.epoch:
                q.pop()
        q.append(load)

    def state(self) -> dict[str, list[dict[str, Any]]]:
        return {step: [load.state() for load in q] for step, q in self._steps.items()}

    def restore(self, data: Mapping[str, list[Mapping[str, Any]]]) -> None:
        self._steps = {
            step: deque((StepLoad.from_state(x) for x in loads), maxlen=self.depth)
            for step, loads in data.items()
        }

    def steps(self) -> list[str]:
        """The steps with statistics, in the order they were first seen."""
        return list(self._steps)

    def epochs(self, step: str) -> list[StepLoad]:
        return list(self._steps.get(step, ()))

    def latest(self, step: str) -> StepLoad | None:
        q = self._steps.get(step)
        return q[-1] if q else None

    def series(self, step: str, last: int | None = None, of: str = "kg_load") -> np.ndarray:
        """One per-key-group figure of the last epochs (fragments folded onto their group) ×
        epoch, shape (K, T): ``of`` names the :class:`StepLoad` field, the load in ms by default."""
        loads = self.epochs(step)[-last:] if last else self.epochs(step)
        out = np.zeros((self.key_groups, len(loads)))
        for t, load in enumerate(loads):
            out[:, t] = self._vector(load, of)
        return out

    def _vector(self, load: StepLoad, of: str) -> np.ndarray:
        """``load``'s figure ``of`` per key group (fragments folded onto their group)."""
        kept = self._dense.get((id(load), of))
        if kept is not None and kept[0] is load:
            return kept[1]
        figures = getattr(load, of)
        vector = np.zeros(self.key_groups)
        if figures:
            kgs = np.fromiter(figures.keys(), np.int64, len(figures))
            vector = np.bincount(kgs % self.key_groups, np.fromiter(figures.values(), np.float64, len(figures)),
                                 self.key_groups)
        if len(self._dense) > 4 * self.depth * max(len(self._steps), 1):  # loads that left the history
            held = {id(x) for q in self._steps.values() for x in q}
            self._dense = {k: v for k, v in self._dense.items() if k[0] in held}
        self._dense[(id(load), of)] = (load, vector)
        return vector

    def rows_series(self, step: str, last: int | None = None, of: str = "kg_rows") -> np.ndarray:
        """Input rows per key group × epoch; ``of="work"``: the rows the kernel worked on,
        ``of="kg_held"``: the input it held back at the end of each epoch."""
        return self.series(step, last, of)

    def correlations(self, step: str) -> np.ndarray:
        """Pearson coefficients between the key groups' load series (0 where one is constant)."""
        s = self.series(step)
        if s.shape[1] < 2:
            return np.zeros((s.shape[0], s.shape[0]))
        with np.errstate(invalid="ignore", divide="ignore"):
            c = np.corrcoef(s)
        return np.nan_to_num(c)

    def rates(self, step: str, last: int = 3) -> tuple[float, float]:
        """DS2's two rates over the last epochs: arrival (rows per wall second) and the true
        processing rate of one lane (rows per second of that lane's busy time)."""
        loads = self.epochs(step)[-last:]
        rows = sum(x.input_rows for x in loads)
        wall = sum(x.wall_s for x in loads)
        busy_s = sum(x.busy_ms for x in loads) / 1000
        return (rows / wall if wall > 0 else 0.0, rows / busy_s if busy_s > 0 else 0.0)
