"""Delay-Process-Correct: what a network does while one of its sources cannot be reached.

A network with ``max_delay`` chooses availability over consistency for a bounded time. Each
plan probes every source once. While a source is down, epochs are not planned (the network
*delays*) until it has been down for ``max_delay``; then epochs go on without it (*process*):
its slice is empty, and everything those epochs publish is **tentative**, and so is every later
epoch, because its state descends from theirs. Once every missing source answers again, the
next epoch *corrects*: it continues from the last **stable** commit (the one before the first
tentative epoch) instead of the last commit, so the tentative epochs' input is read again
together with what the missing sources held back, and before it publishes anything it asks every
sink to retract what the tentative epochs published. Its output and that of the epochs after it
is what a run that never lost the source would have written.

The commit of a tentative epoch names the missing sources (``tentative``) and the stable epoch
it descends from (``stable``); the correcting epoch's plan names that epoch as its ``base`` and
the epochs it retracts. A crash anywhere in between replays from those records, like any epoch.

This module holds the decision alone (no Spark, no checkpoint): :meth:`DelayProcessCorrect.verdict`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    RUN = "run"  # every source answers and nothing is tentative: an ordinary epoch
    WAIT = "wait"  # a source is down for less than max_delay: plan nothing yet
    TENTATIVE = "tentative"  # go on without the sources that are down; the outputs are tentative
    CORRECT = "correct"  # the missing sources are back: recompute from the last stable commit


@dataclass
class DelayProcessCorrect:
    """``max_delay_s``: how long a source may be down before epochs go on without it."""

    max_delay_s: float
    clock: Callable[[], float] = time.monotonic
    #: source -> when this driver first found it down (reset once it answers)
    down_since: dict[str, float] = field(default_factory=dict)

    def verdict(self, down: Iterable[str], missing: Iterable[str]) -> Verdict:
        """``down``: the sources that did not answer this plan's probe; ``missing``: the sources
        the last commit's state lacks input from (its ``tentative``; empty when it is stable)."""
        down, missing = set(down), set(missing)
        now = self.clock()
        for name in list(self.down_since):
            if name not in down:
                del self.down_since[name]
        for name in down:
            self.down_since.setdefault(name, now)
        if not down:
            return Verdict.CORRECT if missing else Verdict.RUN
        if missing:  # already tentative: waiting would only delay the tentative results
            return Verdict.TENTATIVE
        if all(now - self.down_since[name] >= self.max_delay_s for name in down):
            return Verdict.TENTATIVE
        return Verdict.WAIT

    def waited_s(self, name: str) -> float:
        """How long ``name`` has been down (0 if it answers)."""
        since = self.down_since.get(name)
        return 0.0 if since is None else self.clock() - since
