"""Command intake at an epoch boundary: in what order the inbox's commands are taken, whether
a setting fits, how a refusal is recorded, and what the plan logs of each command taken.

The engine walks the inbox and asks :func:`next_step` what each command means for it;
:func:`settings_after` and :func:`route_refusal` return a verdict the engine then puts in force
(or not). :class:`Intake` keeps what intake remembers between epochs: the control stream's
cursor and reader, refusals not yet reported, pauses and resumes to log.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from eddyline.api.live import with_settings
from eddyline.errors import SpecError
from eddyline.runtime.admission import alone
from eddyline.runtime.commands import CommandFiles, CommandNats, command_reader

if TYPE_CHECKING:
    from eddyline.api.network import NetworkSpec
    from eddyline.control.manager import DistributionManager
    from eddyline.runtime.inbox import Inbox


class Step(Enum):
    """What the next inbox command means for the commands taken so far."""

    STOP = "stop"  # take those taken so far: this command waits for a boundary after them
    WAIT = "wait"  # paused: take nothing until a resume
    PAUSE = "pause"  # a pause or a resume: in force at once
    ROUTE = "route"  # a routing request for the distribution manager
    SET = "set"  # settings
    ALONE = "alone"  # a change of network, a replay or an undo: an epoch boundary of its own


def next_step(command: dict[str, Any], *, taken: bool, paused: bool) -> Step:
    """``taken``: commands were taken already at this boundary; ``paused``: a pause is in force."""
    if "pause" in command or "resume" in command:
        return Step.STOP if taken else Step.PAUSE  # the commands before it take effect first
    if paused:
        return Step.WAIT  # everything else waits for the resume
    if "route" in command:
        return Step.ROUTE
    if not alone(command):
        return Step.SET
    return Step.STOP if taken else Step.ALONE


def settings_after(command: dict[str, Any], spec: NetworkSpec, base_spec: NetworkSpec,
                   settings: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The settings in force once ``command`` is taken, or the reason it is refused. ``spec``:
    ``base_spec`` as it runs with ``settings``."""
    wanted = command.get("set")
    try:
        if command.get("error") or not isinstance(wanted, dict) or not wanted:
            raise SpecError(f"control: {command.get('error') or 'expected a non-empty mapping STEP.PARAM -> value in set'}")
        with_settings(spec, wanted)  # names the command's own problem
        after = {**settings, **wanted}
        with_settings(base_spec, after)
    except SpecError as e:
        return settings, str(e)
    return after, None


def route_refusal(command: dict[str, Any], manager: DistributionManager, lanes_cap: int, lanes_now: int) -> str | None:
    """Why a routing request does not fit (None: the manager takes it in the next plan)."""
    request = command.get("route")
    try:
        if not isinstance(request, dict):
            raise ValueError("route: expected a mapping with step and one of rebalance, lanes, move")
        manager.check_request(request, lanes_cap, lanes_now)
    except ValueError as e:
        return str(e)
    return None


_LOGGED = ("id", "set", "from", "reset", "replay", "undo", "route", "pause", "resume")


def applied_entry(command: dict[str, Any], network_id: str) -> dict[str, Any]:
    """What the plan that applies ``command`` logs of it (a network by its hash, a rewrite by
    its rule)."""
    return ({k: command[k] for k in _LOGGED if k in command}
            | ({"network": network_id} if "network" in command else {})
            | ({"rewrite": command["rewrite"]["rule"]} if "rewrite" in command else {}))


class Intake:
    """What command intake keeps between epoch boundaries."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.refused: list[dict[str, Any]] = []  # commands refused since the last progress record
        self.refused_ids: set[str] = set()  # refused once, not again while they wait to be read
        self.not_rewritten: set[str] = set()  # steps whose rewrite was refused
        self.held: list[dict[str, Any]] = []  # pauses and resumes, for the next plan's log
        #: the control stream: the last file the committed plans read, and what planning read to
        self.cursor: str | None = None
        self.read_to: str | None = None
        self._reader: CommandFiles | CommandNats | None = None  # kept open while run() runs: a broker's connection

    def refuse(self, command: dict[str, Any], epoch: int, reason: str, key: str, value: Any) -> None:
        """Close ``command`` as refused while planning ``epoch``; the next progress record
        reports it under ``key`` (``set``, ``route``, ``command``) with ``value``."""
        self.inbox.close(command, "refused", epoch, reason)
        self.refused.append({"id": command.get("id"), key: value, "reason": reason})

    def refuse_setting(self, command: dict[str, Any], epoch: int, reason: str) -> None:
        """Settings are refused once: a control stream's tuple is read again until a plan logs
        the cursor past it."""
        if command["id"] not in self.refused_ids:
            self.refused_ids.add(command["id"])
            self.refuse(command, epoch, reason, "set", command.get("set"))

    def refuse_alone(self, command: dict[str, Any], epoch: int, reason: str) -> None:
        if isinstance(command.get("rewrite"), dict):  # not proposed again by this driver
            self.not_rewritten.add(str(command["rewrite"].get("step")))
        self.refuse(command, epoch, reason, "command", alone(command))

    def stream(self, location: str, query: str) -> list[dict[str, Any]]:
        """The control stream's commands after the cursor (``read_to`` then names the last)."""
        if self._reader is None:
            self._reader = command_reader(location, query)
        commands, self.read_to = self._reader.after(self.cursor)
        return commands

    def take_refused(self) -> list[dict[str, Any]]:
        refused, self.refused = self.refused, []
        return refused

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
