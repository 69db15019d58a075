"""Epochs sized by the backlog: how much an epoch reads when sources are behind.

Every epoch pays a fixed price (planning, Spark's jobs, the commit) before its first row, so a
query that is behind catches up faster in fewer, larger epochs; one that keeps up wants small
ones (a result waits for its epoch). A source with no per-epoch cap of its own
(``max_rows_per_epoch``, ``max_files_per_epoch``, a Kafka partition's budget) therefore takes
what is waiting when that fits one epoch, and otherwise as much as fits ``target``:

* the epoch's cost is modelled as ``D = F + a × rows`` milliseconds, fitted by least squares to
  the recent epochs that read rows (the first epoch of a process, slow while the JVM and the
  Python workers warm up, is left out of the fit; an epoch that met the target cold would have
  met it warm, so it counts for the growth below); before two such epochs exist, a row is
  charged the whole time of the epochs seen (the cold one too, if it is all there is), an
  overestimate that keeps the first large epochs within the target;
* an epoch takes at most ``(target - F) / a`` rows, at most ``max_rows`` (what one epoch may
  hold in memory), and at most ``growth`` times what the last epoch read if that one met the
  target (from ``first_rows``, before anything was measured): the model is never extrapolated
  far beyond what it has seen;
* the rows are shared among the sources that are behind in proportion to what each has waiting,
  so sources that are read together (the two sides of a join, files aligned in event time) stay
  together; a source's share becomes offsets by the rows per offset it has shown (files: rows
  per byte, whole files, at least one; before the first epoch, a guess by format).

Once the sources have caught up, what is waiting fits again and epochs are small. A network
with ``control.overload`` is sized by its admission control instead (which may shed rather than
defer), so the two never cap the same epoch. Each capped
epoch logs a decision naming the backlog, the model and the rows taken. Pure: no Spark; its
state goes into the controller's (:class:`~eddyline.control.state.CatchUpState`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from eddyline.api.control import CatchUp
from eddyline.control.decisions import Decision, DecisionKind
from eddyline.control.state import CatchUpState, TakenRecord

#: rows per byte of files before any were measured, by format: Parquet holds a row in 10–40
#: bytes, CSV and JSON lines in 50–500. Too many rows a byte only makes the first epoch small;
#: the next one knows.
ROWS_PER_BYTE_PRIOR = {"parquet": 1 / 16, "text": 1 / 128}


@dataclass(frozen=True)
class Taken:
    """What one epoch read: rows, offsets and (files) bytes per source, and how long it took."""

    epoch: int
    duration_ms: float
    rows: dict[str, int]
    offsets: dict[str, int]
    bytes: dict[str, int] = field(default_factory=dict)
    #: the first epoch of a process: slow while the JVM and the Python workers warm up, so its
    #: time stays out of the model (its rows per offset are as good as any)
    cold: bool = False


@dataclass(frozen=True)
class Waiting:
    """A source's slice as it would be planned without this policy: its offsets, and for files
    the size of each file in order."""

    offsets: int
    sizes: tuple[int, ...] | None = None
    #: rows a byte of these files is taken to hold until measured (ROWS_PER_BYTE_PRIOR)
    prior: float = ROWS_PER_BYTE_PRIOR["parquet"]


@dataclass(frozen=True)
class Sizing:
    """The policy's answer for one epoch: offsets per capped source (absent: as planned), and the
    decision to log (None: nothing capped)."""

    caps: dict[str, int]
    decision: Decision | None


@dataclass
class CatchUpSizer:
    cfg: CatchUp
    #: the sink latency bound of the network, if it has one: an epoch never aims past it
    bound_ms: float | None = None
    depth: int = 8
    history: deque[Taken] = field(init=False)

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.depth)

    @property
    def target_ms(self) -> float:
        return float(min(self.cfg.target, self.bound_ms) if self.bound_ms else self.cfg.target)

    # ------------------------------------------------------------------ monitor
    def observe(self, taken: Taken) -> None:
        """An epoch ran."""
        while self.history and self.history[-1].epoch >= taken.epoch:  # a replayed epoch
            self.history.pop()
        self.history.append(taken)

    def model(self) -> tuple[float, float] | None:
        """``(F, a)``: fixed milliseconds an epoch and milliseconds a row, or None before an
        epoch of some size was seen. Fitted to the warm epochs when two of different sizes exist;
        otherwise all of an epoch's time is charged to its rows (F = 0), which overstates what a
        row costs and so errs towards smaller epochs: from one warm epoch, or the cold first one
        (slower still) while there is no other."""
        # Small epochs (a query keeping up) say little about a row's cost and, charged their whole
        # time, would make it look huge and cut a later burst into crumbs: only epochs of a tenth
        # of first_rows or more count; without them the growth rule alone bounds the next epoch.
        least = max(1, self.cfg.first_rows // 10)
        seen = [(sum(t.rows.values()), t.duration_ms, t.cold) for t in self.history if sum(t.rows.values()) >= least]
        warm = [(n, d) for n, d, cold in seen if not cold]
        if len(warm) >= 2:
            n = np.array([w[0] for w in warm], dtype=float)
            d = np.array([w[1] for w in warm], dtype=float)
            if np.ptp(n) > 0.2 * n.mean():
                a, f = np.polyfit(n, d, 1)
                if a > 0 and f >= 0:
                    return float(f), float(a)
        use = warm or [(n, d) for n, d, _ in seen]
        if not use:
            return None
        return 0.0, sum(d for _, d in use) / sum(n for n, _ in use)

    def rows_per_offset(self, source: str, files: bool) -> float | None:
        """Rows a source's offset (files: its byte) has held lately, None if not seen yet."""
        rows = sum(t.rows.get(source, 0) for t in self.history)
        units = sum((t.bytes if files else t.offsets).get(source, 0) for t in self.history)
        return rows / units if rows and units else None

    # ------------------------------------------------------------------ decide
    def allowance(self) -> tuple[int, str]:
        """The rows the next epoch may read, and why."""
        target = self.target_ms
        last = self.history[-1] if self.history else None
        last_rows = sum(last.rows.values()) if last else 0
        grown = int(self.cfg.growth * max(last_rows, self.cfg.first_rows)) if last and last.duration_ms <= target \
            else self.cfg.first_rows if last is None else None
        m = self.model()
        fit = None if m is None else int(max(0.0, target - m[0]) / m[1]) if m[1] > 0 else None
        options = {"max_rows": self.cfg.max_rows}
        if grown is not None:
            options["growth"] = grown
        if fit is not None:
            options["target"] = fit
        if grown is None and fit is None:  # an epoch without rows overran: start again
            options["first_rows"] = self.cfg.first_rows
        why = min(options, key=lambda k: options[k])
        return max(1, options[why]), why

    def size(self, epoch: int, waiting: Mapping[str, Waiting]) -> Sizing:
        """Caps for the sources in ``waiting`` (those without a cap of their own) in ``epoch``."""
        # rows per offset (files: per byte), as measured or the prior
        per = {name: self.rows_per_offset(name, w.sizes is not None) or (w.prior if w.sizes is not None else 1.0)
               for name, w in waiting.items()}
        est = {name: (sum(w.sizes) if w.sizes is not None else w.offsets) * per[name] for name, w in waiting.items()}
        total = sum(est.values())
        allowed, why = self.allowance()
        if total <= allowed:
            return Sizing({}, None)
        caps: dict[str, int] = {}
        for name, w in waiting.items():
            if est[name] <= 0:
                continue
            share = allowed * est[name] / total
            if w.sizes is not None:  # whole files, at least one
                running = np.cumsum(np.asarray(w.sizes, dtype=float)) * per[name]
                caps[name] = max(1, int(np.searchsorted(running, share, side="right")))
            else:
                caps[name] = max(1, int(share / per[name]))
            caps[name] = min(caps[name], w.offsets)
        m = self.model()
        decision = Decision(
            epoch, "*", DecisionKind.CATCH_UP,
            action={"caps": caps, "takeRows": allowed},
            why={"reason": f"{total:,.0f} rows waiting, more than one epoch takes: {allowed:,} rows, bounded by {_BOUNDS[why]}",
                 "waitingRows": round(total), "boundedBy": why, "targetMs": round(self.target_ms, 1),
                 **({"model": {"fixedMs": round(m[0], 2), "msPerRow": round(m[1], 6)}} if m is not None else {})},
            expected={"epochMs": round(m[0] + m[1] * allowed, 1)} if m is not None else {},
        )
        return Sizing(caps, decision)

    # ------------------------------------------------------------------ state
    def state(self) -> CatchUpState:
        return CatchUpState(history=[TakenRecord(epoch=t.epoch, duration_ms=t.duration_ms, rows=t.rows,
                                                 offsets=t.offsets, bytes=t.bytes, cold=t.cold) for t in self.history])

    def restore(self, state: CatchUpState) -> None:
        self.history = deque((Taken(r.epoch, float(r.duration_ms), {k: int(v) for k, v in r.rows.items()},
                                    {k: int(v) for k, v in r.offsets.items()}, {k: int(v) for k, v in r.bytes.items()},
                                    r.cold)
                              for r in state.history), maxlen=self.depth)


_BOUNDS = {
    "max_rows": "max_rows (an epoch's memory)",
    "growth": "growth from the last epoch (the model is not extrapolated further)",
    "target": "the target epoch time by the fitted cost model",
    "first_rows": "first_rows (nothing measured to go by)",
}
