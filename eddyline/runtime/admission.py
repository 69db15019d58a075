"""Whether a command that needs an epoch boundary of its own — a change of network (``apply``),
a ``replay``, an ``undo`` — can be done now, and where it goes back to.

The engine hands over what it runs (:class:`Running`) and the checkpoint as a read-only
:class:`History`; :func:`refusal` returns the reason a command is refused (None: admitted).
Nothing here writes: the engine carries an admitted command out (``Engine._prepare``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from eddyline.api.change import (
    catch_ups,
    check_change,
    required_history_starts,
    still_catching_up,
    with_catch_ups,
)
from eddyline.api.live import sink_settings
from eddyline.api.network import NetworkSpec
from eddyline.api.units import format_duration_ms
from eddyline.api.validate import spec_from_raw
from eddyline.errors import EddylineError, EngineError, SpecError
from eddyline.runtime.rewriting import checked_rewrite

if TYPE_CHECKING:
    from eddyline.io.sinks import Sink
    from eddyline.runtime.epoch.records import EpochPlan

#: copy -> (source, steps): added steps catching up on copies of running sources
CatchUp = dict[str, tuple[str, tuple[str, ...]]]


class History(Protocol):
    """What the checks read of the checkpoint (:class:`~eddyline.runtime.checkpoint.Checkpoint`)."""

    def has_plan(self, epoch: int) -> bool: ...
    def has_commit(self, epoch: int) -> bool: ...
    def read_plan(self, epoch: int) -> EpochPlan: ...
    def metadata(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Running:
    """The engine as the checks see it."""

    base_spec: NetworkSpec  # the network as written
    spec: NetworkSpec  # with the control settings and catch-up copies in force
    hot: bool  # a hot pair, or a network with max_delay
    catch_up: CatchUp
    sinks: Mapping[str, Sink]
    checkpoint_id: str | None
    retain_epochs: int
    #: compiles a network's first epoch (raises what would fail it)
    analyze: Callable[[NetworkSpec], Any]


def alone(command: dict[str, Any]) -> str | None:
    """What a command that takes an epoch boundary of its own does (None: settings)."""
    for key, what in (("undo", "undo"), ("replay", "replay"), ("network", "apply")):
        if key in command:
            return what
    return None


def refusal(command: dict[str, Any], last_epoch: int, running: Running, history: History) -> str | None:
    """Why ``command`` (a change of network, a replay or an undo) cannot be done now, after
    ``last_epoch`` was committed; None: it can."""
    try:
        check(command, last_epoch, running, history)
    except EddylineError as e:
        return str(e)
    return None


def check(command: dict[str, Any], last_epoch: int, running: Running, history: History) -> None:
    what = alone(command)
    if running.hot:
        raise EngineError(f"{what}: a hot pair or a network with max_delay cannot do this live yet")
    if "network" in command:
        _check_network(command, str(what), last_epoch, running, history)
    if what == "apply":
        return
    target = command.get(str(what))
    if not isinstance(target, int) or not 1 <= target <= last_epoch:
        raise EngineError(f"{what}: expected an epoch from 1 to {last_epoch}, the last committed, got {target!r}")
    _check_rewind(str(what), target, last_epoch, running, history)


def _check_network(command: dict[str, Any], what: str, last_epoch: int, running: Running, history: History) -> None:
    raw = command["network"]
    if not isinstance(raw, dict):
        raise SpecError(f"{what}: expected the new network as a mapping")
    fits = checked_rewrite(running.base_spec, command).fits if "rewrite" in command else ()
    new = spec_from_raw(raw)
    check_change(running.base_spec, new, tuple(command.get("reset") or ()), fits)
    if "start_epoch" in command:
        check_start(command["start_epoch"], new, last_epoch, running, history)
    # what would fail its first epoch is refused before it is in force
    running.analyze(with_catch_ups(new, catch_ups_after(command, new, running.base_spec, running.catch_up)))


def _check_rewind(what: str, target: int, last_epoch: int, running: Running, history: History) -> None:
    cannot = [n for n, s in running.sinks.items() if not s.rewinds]
    if cannot:
        raise EngineError(f"{what}: sink(s) {', '.join(cannot)} cannot take published epochs back and put them back "
                          "(files, memory, discard and nats sinks can, and postgres sinks with rewind: true; what a "
                          "console sink printed cannot be taken back)")
    targets = {json.dumps(sink_settings(running.spec, history.read_plan(e).settings), sort_keys=True)
               for e in range(target, last_epoch + 1) if history.has_plan(e)}
    if len(targets) > 1:  # the epochs to take back were written to more than one target
        raise EngineError(f"{what}: a sink's target changed (a control setting) between epoch {target} and "
                          f"{last_epoch}; {what} can go back to the epoch the last change took effect at the earliest")
    if running.catch_up:  # (the copies' offsets would have to be taken back too)
        steps = sorted(st for _, readers in running.catch_up.values() for st in readers)
        raise EngineError(f"{what}: step(s) {', '.join(steps)} still catch up on copies of running sources; "
                          f"{what} once they read the sources themselves")
    meta = history.metadata() or {}
    merged = [r["epoch"] for r in meta.get("caught_up", []) if r["epoch"] >= target]
    if merged:
        raise EngineError(f"{what}: added steps went over from a copy to its source at epoch {max(merged)}; "
                          f"{what} can go back to epoch {max(merged) + 1} at the earliest")
    rewritten = [r for r in meta.get("rewrites", []) if r["epoch"] >= target]
    if rewritten and what == "replay":  # its new steps took their state over at that boundary only
        r = min(rewritten, key=lambda r: r["epoch"])
        raise EngineError(f"replay: rule {r['rule']} rewrote step '{r['step']}' at epoch {r['epoch']}; "
                          f"a replay can go back to epoch {r['epoch'] + 1} at the earliest")
    if what == "replay":
        taken = taken_back(history, target, last_epoch)
        if taken is not None:
            raise EngineError(f"replay: epoch {target} was taken back by epoch {taken[0]}, which went on from epoch "
                              f"{taken[1]}; replay from epoch {taken[0]} or from an epoch up to {taken[1]}")
    # the commit (and the plan naming its network) the epoch goes on from
    back = went_on_from(history, target) if what == "replay" else target - 1
    if back and not (history.has_commit(back) and history.has_plan(back)):
        raise EngineError(f"{what}: epoch {back} is no longer kept (the checkpoint keeps the last "
                          f"{running.retain_epochs} epochs{kept_for(running.spec)}; raise the network's history to go further back)")
    if what == "undo":
        plan = history.read_plan(target) if history.has_plan(target) else None
        if plan is None or not any("replay" in a for a in plan.applied):
            raise EngineError(f"undo: epoch {target} did not replay earlier epochs; there is nothing to undo")
        later = [(e, history.read_plan(e).applied) for e in range(target + 1, last_epoch + 1) if history.has_plan(e)]
        blocked = undo_blocked(target, later)
        if blocked:
            raise EngineError(f"undo: {blocked}")
    for sink in running.sinks.values():  # (one that keeps records may have dropped them)
        problem = sink.rewind_problem(running.spec.name, running.checkpoint_id, range(target, last_epoch + 1),
                                      target if what == "undo" else None)
        if problem:
            raise EngineError(f"{what}: {problem}")


def check_start(start: Any, new: NetworkSpec, last_epoch: int, running: Running, history: History) -> None:
    """An added query that starts from a kept epoch: its sources must read what running
    ones read, and the commit before that epoch must still be kept."""
    if not isinstance(start, int) or not 1 <= start <= last_epoch + 1:
        raise EngineError(f"apply --from-epoch: expected an epoch from 1 to {last_epoch + 1}, got {start!r}")
    required_history_starts(running.base_spec, new, start)
    if start > 1 and not history.has_commit(start - 1):
        raise EngineError(f"apply --from-epoch: epoch {start - 1} is no longer kept (the checkpoint keeps the last "
                          f"{running.retain_epochs} epochs{kept_for(running.spec)}; raise the network's history to go further back)")


def kept_for(spec: NetworkSpec) -> str:
    """What the checkpoint keeps besides the last ``history`` epochs, as a clause."""
    within, cap = spec.history_duration, spec.history_bytes
    also = f" and those committed in the last {format_duration_ms(within)}" if within is not None else ""
    return also + (f", as far as their state fits history_bytes ({cap:,} bytes)" if cap is not None else "")


def catch_ups_after(command: dict[str, Any], new: NetworkSpec, base_spec: NetworkSpec, catch_up: CatchUp) -> CatchUp:
    """The copies added steps read while they catch up once ``command`` is in force: those
    still catching up, and with ``start_epoch`` those for the steps it adds."""
    start = command.get("start_epoch")
    added = catch_ups(base_spec, new, int(start)) if isinstance(start, int) else {}
    return still_catching_up(new, {**catch_up, **added})


def went_on_from(history: History, epoch: int) -> int:
    """The commit ``epoch`` continued from: the one before, or for an epoch that replayed
    or undid a replay the earlier commit it went back to (0: the start)."""
    base = history.read_plan(epoch).base if history.has_plan(epoch) else None
    return epoch - 1 if base is None else base


def taken_back(history: History, epoch: int, last_epoch: int) -> tuple[int, int] | None:
    """Whether ``epoch`` was taken back: the epochs the last commit descends from, back to
    ``epoch``, skip it. Returns the epoch that skipped it and the commit that one went on
    from (a replay from there would read input that the sinks show from later epochs)."""
    at = last_epoch
    while at > epoch:
        went = went_on_from(history, at)
        if went < epoch:
            return at, went
        at = went
    return None


def undo_blocked(replay: int, later: list[tuple[int, list[dict[str, Any]]]]) -> str | None:
    """Why the replay at epoch ``replay`` cannot be undone exactly, given the commands applied
    by each epoch after it (None: it can).

    Replays are undone in the reverse order they were made, like an editor's undo: an undo goes
    back to the commit before its replay and puts back what that replay took back, which is the
    content the sinks had then only if every replay since has been undone already (a later one
    may have taken back epochs from before it, which nothing would put back)."""
    open_ = [replay]  # replays in force, the latest last
    for epoch, applied in later:
        for command in applied:
            if "replay" in command:
                open_.append(epoch)
            elif "undo" in command and int(command["undo"]) in open_:
                open_.remove(int(command["undo"]))
                if int(command["undo"]) == replay:
                    return f"the replay at epoch {replay} was undone at epoch {epoch} already"
    if open_[-1] != replay:
        return (f"the replay at epoch {open_[-1]} came later and is still in force; undo it first "
                "(replays are undone in the reverse order they were made)")
    return None
