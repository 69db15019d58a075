"""Fault injection at the epoch's stage boundaries, for crash and failover tests.

The engine reports every boundary it passes (``reached(point, epoch)``); a lane's Spark task
reports :attr:`FaultPoint.IN_TASK` after it wrote its state. A hook decides what happens there.
:class:`KillDriver` (``eddyline run --crash-at EPOCH:POINT``) kills the driver with SIGKILL, from
whichever process reaches the point, so a test can cut an epoch anywhere and check that the
restart replays it exactly. Hooks travel into Spark tasks, so they must be picklable.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from eddyline.errors import CheckpointError
from eddyline.ha.lease import Lease


class FaultPoint(StrEnum):
    """The boundaries of one epoch, in the order it passes them."""

    PLANNED = "planned"  # the plan is made, not yet logged
    AFTER_PLAN = "after_plan"  # the plan is logged; nothing ran
    IN_TASK = "in_task"  # inside the first lane's task, after it wrote its state
    AFTER_STAGE = "after_stage"  # every output staged, nothing published
    MID_PUBLISH = "mid_publish"  # a sink that publishes in steps has taken some of them
    AFTER_PUBLISH = "after_publish"  # outputs published, the epoch not committed
    MID_COMMIT = "mid_commit"  # the commit written to a temporary file, not yet in place
    AFTER_COMMIT = "after_commit"


class Faults(Protocol):
    def reached(self, point: FaultPoint, epoch: int) -> None: ...


@dataclass(frozen=True)
class NoFaults:
    def reached(self, point: FaultPoint, epoch: int) -> None:
        pass


@dataclass(frozen=True)
class KillDriver:
    """SIGKILL (or another signal) the driver process when ``point`` of ``epoch`` is reached."""

    epoch: int
    point: FaultPoint
    driver_pid: int = field(default_factory=os.getpid)

    #: the signal sent: SIGKILL for a crash; SIGSTOP freezes the driver (a split-brain test
    #: resumes it with SIGCONT after another driver took over)
    sig: int = signal.SIGKILL

    def reached(self, point: FaultPoint, epoch: int) -> None:
        if point == self.point and epoch == self.epoch:
            os.kill(self.driver_pid, self.sig)

    @classmethod
    def parse(cls, text: str, sig: int = signal.SIGKILL, option: str = "--crash-at") -> KillDriver:
        """``"3:in_task"`` → kill the driver inside epoch 3's first lane task."""
        epoch, _, point = text.partition(":")
        if not epoch.isdigit() or point not in {p.value for p in FaultPoint}:
            raise CheckpointError(
                f"{option}: expected EPOCH:POINT with POINT in {', '.join(FaultPoint)}, got {text!r}"
            )
        return cls(int(epoch), FaultPoint(point), sig=sig)


#: the boundaries just before a step that others can see: logging a plan, publishing, committing
FENCED_BEFORE = frozenset({FaultPoint.PLANNED, FaultPoint.AFTER_STAGE, FaultPoint.MID_PUBLISH, FaultPoint.MID_COMMIT})


@dataclass(frozen=True)
class UnderLease:
    """The driver's boundaries under a lease: before each step others can see, the lease is
    checked, so a driver that lost it (:class:`eddyline.ha.lease.Fenced`) stops there; then the
    inner hook is told. Driver-side only (the lease is not sent to tasks)."""

    inner: Faults
    lease: Lease

    def reached(self, point: FaultPoint, epoch: int) -> None:
        if point in FENCED_BEFORE:
            self.lease.check()
        self.inner.reached(point, epoch)
