"""Changing a running network: ``control`` (settings, routing, pause, resume, status),
``apply`` (another network), ``replay`` and ``undo`` (time travel). Each is checked here, then
queued in the checkpoint's inbox for the driver to take at its next epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from eddyline.cli.common import SpecArg, fail, load
from eddyline.errors import EddylineError, SpecError

control_app = typer.Typer(no_args_is_help=True, help="Change a running network's parameters between two epochs.")


@control_app.command("set")
def control_set(
    spec: SpecArg,
    settings: Annotated[list[str], typer.Argument(help="STEP.PARAM=VALUE, e.g. 'expensive.filter=price > 200' or top.k=3")],
    checkpoint: Annotated[str, typer.Option(help="the running network's checkpoint")],
) -> None:
    """Queue new parameter values for the network running on --checkpoint: they take effect
    together at its next epoch, which logs them (a replay runs with them too). They are checked
    here against the network and the settings in force, and again by the running driver; a
    value that does not fit is refused and nothing changes."""
    from eddyline.api.live import parse_setting, with_settings
    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.inbox import Inbox

    try:
        net = load(spec)
        wanted = dict(parse_setting(text) for text in settings)
        last = Checkpoint(checkpoint).latest_commit()
        with_settings(with_settings(net, last.settings if last else {}), wanted)
        command = Inbox(checkpoint).submit(wanted)
    except EddylineError as e:
        raise fail(e) from None
    listed = ", ".join(f"{t} = {v!r}" for t, v in wanted.items())
    Console().print(f"queued command {command}: {listed}; it takes effect at the next epoch", highlight=False)


@control_app.command("route")
def control_route(
    checkpoint: Annotated[str, typer.Option(help="the running network's checkpoint")],
    step: Annotated[str, typer.Argument(help="a stateful step")],
    rebalance: Annotated[bool, typer.Option(help="balance its lanes now, whatever the thresholds")] = False,
    lanes: Annotated[int | None, typer.Option(help="rescale it to this many lanes (needs control.scale)")] = None,
    move: Annotated[list[str] | None, typer.Option(help="KEY_GROUP:LANE, e.g. 3:1 (repeatable)")] = None,
) -> None:
    """Ask the distribution manager of the network running on --checkpoint for a routing change
    at its next epoch (one of --rebalance, --lanes, --move); it becomes a decision whose why is
    the operator, logged in that epoch's plan."""
    route: dict = {"step": step}
    try:
        if rebalance + (lanes is not None) + bool(move) != 1:
            raise SpecError("control route: give exactly one of --rebalance, --lanes N, --move KG:LANE")
        if rebalance:
            route["rebalance"] = True
        elif lanes is not None:
            route["lanes"] = lanes
        else:
            pairs = [m.partition(":") for m in move or []]
            if any(not (kg.isdigit() and lane.isdigit()) for kg, _, lane in pairs):
                raise SpecError(f"control route --move: expected KEY_GROUP:LANE (numbers), got {move}")
            route["move"] = {kg: int(lane) for kg, _, lane in pairs}
        command = _queue_checked(checkpoint, {"route": route})
    except EddylineError as e:
        raise fail(e) from None
    Console().print(f"queued command {command}: {_describe({'route': route})}; it takes effect at the next epoch",
                    highlight=False)


@control_app.command("pause")
def control_pause(checkpoint: Annotated[str, typer.Option(help="the running network's checkpoint")]) -> None:
    """Pause the network running on --checkpoint after its current epoch (a restarted driver stays
    paused) until `eddyline control resume`."""
    try:
        command = _queue_checked(checkpoint, {"pause": True})
    except EddylineError as e:
        raise fail(e) from None
    Console().print(f"queued pause {command}: the network stops after its current epoch", highlight=False)


@control_app.command("resume")
def control_resume(checkpoint: Annotated[str, typer.Option(help="the paused network's checkpoint")]) -> None:
    """Resume a paused network."""
    try:
        command = _queue_checked(checkpoint, {"resume": True})
    except EddylineError as e:
        raise fail(e) from None
    Console().print(f"queued resume {command}", highlight=False)


def _queue_checked(checkpoint: str, body: dict) -> str:
    """Check ``body`` against the network the checkpoint runs, then queue it."""
    from eddyline.operate import check_command, network_in_force
    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.inbox import Inbox

    ck = Checkpoint(checkpoint)
    last = ck.latest_commit()
    check_command(network_in_force(ck), last.settings if last else {}, body)
    return Inbox(checkpoint).submit_command(body)


def _describe(command: dict) -> str:
    from eddyline.observe.progress import describe_command

    return describe_command(command)


def apply(
    spec: SpecArg,
    new: Annotated[Path, typer.Argument(help="the network it should become (YAML)")],
    checkpoint: Annotated[str, typer.Option(help="the running network's checkpoint")],
    reset: Annotated[list[str] | None, typer.Option(help="a changed stateful step that starts with no state")] = None,
    dry_run: Annotated[bool, typer.Option(help="show what would change, queue nothing")] = False,
    from_epoch: Annotated[int | None, typer.Option(
        help="added steps that read a running source, and added sources that read what a running one reads, "
        "start where it was at this kept epoch")] = None,
) -> None:
    """Change the network running on --checkpoint into NEW at its next epoch, without stopping
    it: shows what is added (+), removed (-) and changed (~), checks that the running state fits
    the new network, and queues the change. Unchanged steps keep their state and routing; added
    ones start empty (a new source from its first offset). With --from-epoch, an added source
    with the parameters of a running one starts where that one was at the epoch, and an added
    step that reads a running source reads a copy of it from there, then the source itself once
    the copy has caught up. A changed stateful step whose state would not fit is refused unless
    given with --reset."""
    from eddyline.api.change import catch_ups, check_change, required_history_starts
    from eddyline.runtime.inbox import Inbox

    try:
        old, target = load(spec), load(new)
        diff = check_change(old, target, tuple(reset or ()))
        starts = required_history_starts(old, target, from_epoch) if from_epoch is not None else {}
    except EddylineError as e:
        raise fail(e) from None
    out = Console()
    for line in diff.lines():
        out.print(line, highlight=False)
    if dry_run or diff.empty:
        out.print("nothing queued" + (" (no change)" if diff.empty else " (--dry-run)"), highlight=False)
        return
    body = {"network": target.as_dict(), "reset": sorted(reset or ())} | ({"start_epoch": from_epoch} if from_epoch else {})
    command = Inbox(checkpoint).submit_command(body)
    copies = catch_ups(old, target, from_epoch) if from_epoch is not None else {}
    for added, running in starts.items():
        if added in copies:
            out.print(f"step(s) {', '.join(copies[added][1])} read a copy of '{running}' that starts where it was at epoch "
                      f"{from_epoch}, then '{running}' itself once the copy has caught up", highlight=False)
        else:
            out.print(f"source '{added}' starts where '{running}' was at epoch {from_epoch}", highlight=False)
    out.print(f"queued change {command}; it takes effect at the next epoch", highlight=False)


def replay(
    spec: SpecArg,
    checkpoint: Annotated[str, typer.Option(help="the network's checkpoint")],
    from_epoch: Annotated[int, typer.Option(help="the first epoch to run again")],
    with_: Annotated[Path | None, typer.Option("--with", help="run them again with this network (YAML) instead")] = None,
    reset: Annotated[list[str] | None, typer.Option(help="with --with: a changed stateful step that starts with no state")] = None,
) -> None:
    """Time travel: at its next epoch, the network goes back to the commit --from-epoch went on from,
    takes back what every epoch since published, and reads their input again (with --with: as
    the changed network, which stays in force). Needs the commit to be kept (the network's
    ``history``) and sinks that can take epochs back (files, memory, discard, nats; postgres with
    ``rewind: true``). ``eddyline undo`` reverts it; replays are undone latest first."""
    from eddyline.api.change import check_change
    from eddyline.runtime.inbox import Inbox

    try:
        net = load(spec)
        body: dict = {"replay": from_epoch}
        if with_ is not None:
            new = load(with_)
            for line in check_change(net, new, tuple(reset or ())).lines():
                Console().print(line, highlight=False)
            body |= {"network": new.as_dict(), "reset": sorted(reset or ())}
        command = Inbox(checkpoint).submit_command(body)
    except EddylineError as e:
        raise fail(e) from None
    Console().print(f"queued replay {command} from epoch {from_epoch}; it starts at the next epoch", highlight=False)


def undo(
    spec: SpecArg,
    checkpoint: Annotated[str, typer.Option(help="the network's checkpoint")],
    epoch: Annotated[int, typer.Option(help="the epoch that replayed (see 'control status')")],
) -> None:
    """Undo a replay: at its next epoch, the network goes back to the commit and the network
    from before epoch EPOCH, puts back what the replay took back, takes back what it and the
    epochs since published, and reads their input again. Replays are undone latest first."""
    from eddyline.runtime.inbox import Inbox

    try:
        load(spec)
        command = Inbox(checkpoint).submit_command({"undo": epoch})
    except EddylineError as e:
        raise fail(e) from None
    Console().print(f"queued undo {command} of the replay at epoch {epoch}; it starts at the next epoch", highlight=False)


@control_app.command("status")
def control_status(checkpoint: Annotated[str, typer.Option(help="the network's checkpoint")]) -> None:
    """The settings in force at the last commit, and every command with what became of it."""
    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.inbox import Inbox

    out = Console()
    last = Checkpoint(checkpoint).latest_commit()
    settings = last.settings if last else {}
    out.print(f"in force at epoch {last.epoch if last else 0}: " + (", ".join(f"{t} = {v!r}" for t, v in settings.items()) or "none"),
              highlight=False)
    inbox = Inbox(checkpoint)
    for c in inbox.done():
        what = _describe(c) if not c.get("network") or "replay" in c else "a new network"
        if "replay" in c:
            what = f"replay from epoch {c['replay']}" + (" with a new network" if c.get("network") else "")
        elif "undo" in c:
            what = f"undo of the replay at epoch {c['undo']}"
        outcome = f"applied from epoch {c['epoch']}" if c["outcome"] == "applied" else f"refused: {c.get('reason')}"
        out.print(f"{c['id']}  {what}  {outcome}", highlight=False, soft_wrap=True)
    for c in inbox.pending():
        out.print(f"{c['id']}  {_describe(c)}  waiting for the next epoch", highlight=False)
    if inbox.paused():
        out.print("paused (eddyline control resume --checkpoint … resumes it)", highlight=False)
