"""A change of network as the checkpoint records it (:class:`LiveChange`), and the commit an
epoch goes on from as the changed network sees it (:func:`view`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eddyline.eventtime import NO_WATERMARK
from eddyline.state.store import copy_state

if TYPE_CHECKING:
    from eddyline.api.network import NetworkSpec
    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.epoch.records import EpochCommit


@dataclass(frozen=True)
class LiveChange:
    """A change of network as it takes effect: its first epoch, the stateful steps that start
    it with no state, the new steps that start with another's state, and the added sources
    that start where a running one was at a kept epoch (new -> (running, epoch))."""

    epoch: int = 0
    reset: tuple[str, ...] = ()
    inherit: dict[str, str] = field(default_factory=dict)
    sources: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: added steps catching up on copies of running sources: copy -> (source, steps)
    catch_up: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "reset": list(self.reset), "inherit": self.inherit,
                "sources": {n: list(v) for n, v in self.sources.items()},
                "catch_up": {c: [s, list(steps)] for c, (s, steps) in self.catch_up.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LiveChange:
        return cls(int(data.get("epoch", 0)), tuple(data.get("reset", ())), dict(data.get("inherit") or {}),
                   {n: (str(o), int(e)) for n, (o, e) in (data.get("sources") or {}).items()},
                   {c: (str(s), tuple(steps)) for c, (s, steps) in (data.get("catch_up") or {}).items()})


def view(commit: EpochCommit | None, epoch: int, change: LiveChange, spec: NetworkSpec,
         ckpt: Checkpoint) -> EpochCommit | None:
    """``commit`` as the base of ``epoch`` of ``spec``: when ``change`` starts at ``epoch``,
    without the steps it reset, with the state of the steps it lets inherit one (copied), and
    with as many event-time inputs per step as the new network gives it."""
    if commit is None or epoch != change.epoch:
        return commit
    steps = {n: s for n, s in commit.steps.items() if n not in change.reset}
    ends, cursors = dict(commit.source_ends), dict(commit.cursors)
    for new, (old, start) in change.sources.items():  # an added source from a kept epoch on
        if new not in commit.source_ends:
            then = ckpt.read_commit(start - 1) if start > 1 else None
            ends[new] = then.source_ends.get(old, 0) if then else 0
            if then is not None and old in then.cursors:
                cursors[new] = then.cursors[old]
    for new, old in change.inherit.items():
        if old in steps and new not in commit.steps:
            copy_state(ckpt.location, old, new, steps[old].index)
            steps[new] = steps[old]
    for s in spec.stateful_steps():
        known, n = steps.get(s.name), len(s.time_columns())
        if known is not None and len(known.input_max) != n:
            steps[s.name] = dataclasses.replace(known, input_max=[*known.input_max, *[NO_WATERMARK] * n][:n])
    return dataclasses.replace(commit, steps=steps, source_ends=ends, cursors=cursors)
