"""The driver's modes and the transitions between them, in one place.

A driver is in exactly one mode at a time::

    starting ──► leading ◄──► catching up          (added steps read copies of running sources)
        │          ▲  ▲            │
        │          │  └── following (a hot pair's follower runs its leader's plans; it leads
        │          │                 once it took the lease over)
        ├──► paused ◄──── (an operator's pause; no epoch runs until the resume)
        └──► replaying    (an epoch that runs a plan logged before — a restart's pending plan,
                           another driver's — or that a replay or undo command asked for)
    any mode ──► fenced   (another driver took the lease over)
    any mode ──► stopped  (run() returned)

:data:`TRANSITIONS` lists the legal moves; :class:`Driver` makes them and keeps the last one
with its reason (status reads it). The mode only records what the engine does: the facts it is
computed from (the pause in the checkpoint's inbox, the lease, the live change in force) stay
where they are kept, and :func:`settled` says which mode they add up to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum


class Mode(Enum):
    STARTING = "starting"
    LEADING = "leading"
    CATCHING_UP = "catching up"
    FOLLOWING = "following"
    PAUSED = "paused"
    REPLAYING = "replaying"
    FENCED = "fenced"
    STOPPED = "stopped"


_RUNNING = {Mode.LEADING, Mode.CATCHING_UP, Mode.FOLLOWING, Mode.PAUSED, Mode.REPLAYING}

TRANSITIONS: dict[Mode, frozenset[Mode]] = {
    Mode.STARTING: frozenset({*_RUNNING, Mode.FENCED, Mode.STOPPED}),
    Mode.LEADING: frozenset({Mode.CATCHING_UP, Mode.PAUSED, Mode.REPLAYING, Mode.FENCED, Mode.STOPPED}),
    Mode.CATCHING_UP: frozenset({Mode.LEADING, Mode.PAUSED, Mode.REPLAYING, Mode.FENCED, Mode.STOPPED}),
    # a follower takes a pause over from the checkpoint it shares; it leads once it took the lease
    Mode.FOLLOWING: frozenset({Mode.LEADING, Mode.CATCHING_UP, Mode.PAUSED, Mode.REPLAYING, Mode.FENCED, Mode.STOPPED}),
    Mode.PAUSED: frozenset({Mode.LEADING, Mode.CATCHING_UP, Mode.FOLLOWING, Mode.REPLAYING, Mode.FENCED, Mode.STOPPED}),
    Mode.REPLAYING: frozenset({Mode.LEADING, Mode.CATCHING_UP, Mode.FOLLOWING, Mode.PAUSED, Mode.FENCED, Mode.STOPPED}),
    Mode.FENCED: frozenset({Mode.STOPPED}),
    # run() may be called again on the same engine
    Mode.STOPPED: frozenset({Mode.STARTING}),
}


def settled(*, paused: bool, replaying: bool, following: bool, catching_up: bool) -> Mode:
    """The mode the engine's facts add up to. A pause wins: while it is in force only a plan
    logged before it runs (a restart's pending plan), and the driver still counts as paused."""
    if paused:
        return Mode.PAUSED
    if following:  # (its leader's plans are all logged before it runs them: no replay to tell)
        return Mode.FOLLOWING
    if replaying:
        return Mode.REPLAYING
    return Mode.CATCHING_UP if catching_up else Mode.LEADING


@dataclass(frozen=True)
class Transition:
    before: Mode
    after: Mode
    reason: str
    at: float  # wall-clock seconds

    def to_json(self) -> dict[str, object]:
        return {"from": self.before.value, "to": self.after.value, "reason": self.reason, "at": self.at}


class IllegalTransition(RuntimeError):
    """A bug in the engine: a move :data:`TRANSITIONS` does not list."""


class Driver:
    """The mode a driver is in; :meth:`to` is the only way to change it."""

    def __init__(self) -> None:
        self.mode = Mode.STARTING
        self.last: Transition | None = None

    def to(self, mode: Mode, reason: str) -> bool:
        """Move to ``mode`` for ``reason``; returns whether the mode changed (staying is no
        transition, and keeps the last one's reason)."""
        if mode is self.mode:
            return False
        if mode not in TRANSITIONS[self.mode]:
            raise IllegalTransition(f"driver: no transition from {self.mode.value} to {mode.value} ({reason})")
        self.last = Transition(self.mode, mode, reason, time.time())
        self.mode = mode
        return True

    @property
    def paused(self) -> bool:
        return self.mode is Mode.PAUSED

    def to_json(self) -> dict[str, object]:
        """The mode, and the transition that led to it (the progress record's ``mode``)."""
        out: dict[str, object] = {"mode": self.mode.value}
        if self.last is not None:
            out |= {"since": self.last.at, "from": self.last.before.value, "reason": self.last.reason}
        return out
