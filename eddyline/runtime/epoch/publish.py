"""Stage 4, publish: make the epoch's staged outputs visible, each atomically per epoch (a
replay replaces an earlier attempt's). Nothing is committed yet: a crash after this stage
replays the epoch, which publishes the very same outputs again.

An epoch that corrects tentative ones (:mod:`eddyline.ha.dpc`), or replays earlier ones
(``eddyline replay``), first retracts their outputs from every sink and files target; one that
undoes a replay then puts back what the replay retracted; then it publishes its own. A tentative
epoch publishes its outputs marked tentative.

The two drivers of a hot pair (:mod:`eddyline.runtime.replica`) publish each sink's epoch once
between them: with a :class:`~eddyline.ha.selector.Selector`, a sink whose epoch the other driver
published already is checked against it and dropped here instead."""

from __future__ import annotations

from dataclasses import dataclass

from eddyline.ha.selector import Selector
from eddyline.io.files import FilesTarget
from eddyline.io.sinks import Sink
from eddyline.runtime.epoch.records import EpochPlan, Staged
from eddyline.runtime.faults import FaultPoint, Faults


@dataclass(frozen=True)
class Outputs:
    """Everything an epoch writes besides state: the sinks, the dead letters of sources that
    parse records, each step's rows too late for it, and the rows shed under overload."""

    sinks: dict[str, Sink]
    dead_letters: FilesTarget
    late: dict[str, FilesTarget]
    shed: FilesTarget | None
    selector: Selector | None = None

    def targets(self) -> list[FilesTarget]:
        return [self.dead_letters, *self.late.values(), *([self.shed] if self.shed is not None else [])]


def publish(outputs: Outputs, staged: Staged, plan: EpochPlan, faults: Faults) -> None:
    epoch, tentative = plan.epoch, bool(plan.tentative)
    if plan.retracts:
        for sink in outputs.sinks.values():
            sink.retract(plan.retracts, epoch)
        for target in outputs.targets():
            target.retract(plan.retracts, epoch)
    for undone in plan.restores:  # undoing a replay: what it took back comes back
        for sink in outputs.sinks.values():
            sink.restore(undone)
        for target in outputs.targets():
            target.restore(undone)
    selector = outputs.selector
    for name, sink in outputs.sinks.items():
        digest = staged.digests.get(name)
        if selector is not None and not selector.first(epoch, name, digest):
            sink.drop(epoch)
            continue
        sink.publish(epoch, lambda: faults.reached(FaultPoint.MID_PUBLISH, epoch), tentative=tentative)
        if selector is not None:
            selector.done(epoch, name, digest)
    if staged.dead_letters:
        outputs.dead_letters.publish(epoch, tentative)
    for step in staged.late_steps:
        outputs.late[step].publish(epoch, tentative)
    if outputs.shed is not None and staged.shed_rows:
        outputs.shed.publish(epoch, tentative)
