"""The ``eddyline`` command line. Environment variables are read here and nowhere else.

Exit codes: 0 success, 2 invalid spec (nothing ran), 3 checkpoint does not fit, 1 other errors.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from eddyline.errors import CheckpointError, EddylineError, SpecError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Adaptive stream processing on Apache Spark.")
err = Console(stderr=True)

SpecArg = Annotated[Path, typer.Argument(help="network spec (YAML)", exists=False)]
Master = Annotated[
    str | None,
    typer.Option(help="Spark master; default $EDDYLINE_SPARK_MASTER or local[*]"),
]
# the options of a run (`run`, `sql`)
Epochs = Annotated[int | None, typer.Option(help="stop after this many epochs")]
Seconds = Annotated[float | None, typer.Option("--duration", help="stop after this many seconds")]
UntilIdle = Annotated[bool, typer.Option(help="stop when the input is exhausted (flushes all windows)")]
Lanes = Annotated[int | None, typer.Option(help="lanes per stateful step (may differ from the last run)")]
ProgressJson = Annotated[str | None, typer.Option(help="append one JSON progress record per epoch")]
Live = Annotated[bool, typer.Option(help="live progress table in the terminal")]


def _fail(e: EddylineError) -> typer.Exit:
    if isinstance(e, SpecError):
        for p in e.problems:
            err.print(f"[red]error:[/red] {p}", highlight=False, soft_wrap=True)
        return typer.Exit(2)
    err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
    return typer.Exit(3 if isinstance(e, CheckpointError) else 1)


def _load(path: Path):  # noqa: ANN202
    from eddyline.api.validate import load_spec

    if not path.exists():
        raise SpecError(f"network: spec file {str(path)!r} does not exist")
    return load_spec(path)


def _spark(master: str | None):  # noqa: ANN202
    from eddyline.runtime.session import get_spark

    return get_spark(master or os.environ.get("EDDYLINE_SPARK_MASTER") or "local[*]")


@app.command()
def validate(
    spec: SpecArg,
    offline: Annotated[bool, typer.Option(help="skip Spark's analysis of expressions and types")] = False,
    master: Master = None,
) -> None:
    """Check a spec: structure, graph, SQL expressions and types. Exit 2 when invalid."""
    try:
        net = _load(spec)
        from eddyline.facade import check_inputs

        check_inputs(net)
        if not offline:
            from eddyline.facade import validate as analyze

            analyze(net, _spark(master))
    except EddylineError as e:
        raise _fail(e) from None
    typer.echo(f"ok: network '{net.name}': {len(net.sources)} sources, {len(net.steps)} steps, {len(net.sinks)} sinks")


@app.command()
def explain(
    spec: SpecArg,
    lanes: Annotated[int | None, typer.Option(help="lanes per stateful step")] = None,
    spark_plan: Annotated[bool, typer.Option(help="also print Spark's physical plan per sink")] = True,
    checkpoint: Annotated[str | None, typer.Option(
        help="explain the network this checkpoint runs now (after live changes and rewrites)")] = None,
    rules: Annotated[bool, typer.Option(help="list the graph rewriting rules and stop")] = False,
    master: Master = None,
) -> None:
    """Show the physical plan: Spark stages, pushed-down expressions, kernels, key groups → lanes."""
    from eddyline.kinds.rewrite import RULES
    from eddyline.plan.explain import explain as render

    if rules:
        for r in RULES.values():
            typer.echo(f"{r.name} ({r.kind} steps)\n  when: {r.condition}\n  does: {r.effect}")
        return
    try:
        net = _load(spec)
        net, rewritten = _in_force(net, checkpoint) if checkpoint else (net, [])
        session = _spark(master) if spark_plan else None
        n = lanes or net.lanes or (session.sparkContext.defaultParallelism if session else 2)
        plans = None
        if session is not None:
            from eddyline.runtime.compile import physical_plans

            plans = physical_plans(net, session, n)
        typer.echo(render(net, n, plans, rewritten + _may_rewrite(net)))
    except EddylineError as e:
        raise _fail(e) from None


def _in_force(net, checkpoint: str):  # noqa: ANN202
    """The network ``checkpoint`` runs now, and the rewrites that made it, as lines."""
    from eddyline.api.validate import spec_from_raw
    from eddyline.runtime.checkpoint import Checkpoint

    ck = Checkpoint(checkpoint)
    meta = ck.metadata()
    if meta is None:
        raise CheckpointError(f"checkpoint {checkpoint!r}: no run has started there")
    applied = meta.get("applied")
    if applied:
        net = spec_from_raw(ck.read_network(applied["hash"]))
    lines = []
    for r in meta.get("rewrites", []):
        lines += [f"rewritten at epoch {r['epoch']} by {r['rule']} (step '{r['step']}'):", *(f"  {x}" for x in r["summary"])]
    return net, lines


def _may_rewrite(net) -> list[str]:  # noqa: ANN001
    """Where the network's enabled rewrite rules fit, as lines."""
    from eddyline.kinds.rewrite import fitting

    cfg = net.control.rewrite
    if cfg is None:
        return []
    raw, lines = net.as_dict(), []
    for s in net.stateful_steps():
        found = fitting(net, raw, s.name, cfg.rules)
        if found is not None:
            lines += [f"step '{s.name}' may be rewritten by {found[0]} when it is a hot spot:", *(f"  {x}" for x in found[1].summary)]
    return lines


@app.command()
def sql(
    query: Annotated[Path, typer.Argument(help="a streaming SQL script (CREATE TABLE …; INSERT INTO … SELECT …)")],
    checkpoint: Annotated[str | None, typer.Option(help="run it on this checkpoint, as 'eddyline run' does")] = None,
    show: Annotated[bool, typer.Option("--explain", help="print the network it compiles to (YAML) and stop")] = False,
    epochs: Epochs = None,
    duration: Seconds = None,
    until_idle: UntilIdle = False,
    lanes: Lanes = None,
    progress_json: ProgressJson = None,
    live: Live = True,
    master: Master = None,
) -> None:
    """Compile a Flink SQL script into a network: print it (--explain) or run it (--checkpoint).

    'eddyline validate|explain|run' take the .sql file as they take a YAML spec."""
    if not show and checkpoint is None:
        err.print("[red]error:[/red] expected --explain (print the network) or --checkpoint (run it)")
        raise typer.Exit(2)
    if show:
        import yaml

        try:
            net = _load(query)
        except EddylineError as e:
            raise _fail(e) from None
        typer.echo(yaml.safe_dump(net.as_dict(), sort_keys=False, width=120), nl=False)
        return
    assert checkpoint is not None
    _run(query, checkpoint, epochs, duration, until_idle, lanes, progress_json, live, master, None)


@app.command()
def run(
    spec: SpecArg,
    checkpoint: Annotated[str, typer.Option(help="checkpoint location (path or pyarrow filesystem URI)")],
    epochs: Epochs = None,
    duration: Seconds = None,
    until_idle: UntilIdle = False,
    lanes: Lanes = None,
    progress_json: ProgressJson = None,
    live: Live = True,
    master: Master = None,
    standby: Annotated[bool, typer.Option(
        help="wait until the driver holding the checkpoint's lease stops renewing it, then take over")] = False,
    lease_timeout: Annotated[float, typer.Option(
        help="seconds without a renewal after which a driver's lease is free", min=0.5)] = 5.0,
    hot: Annotated[str | None, typer.Option(
        help="a hot pair's group directory: the first driver in it leads, the other runs every epoch too "
             "(each with its own --checkpoint) and takes the lease over once the leader's expires "
             "(at once when the leader's process on this host has exited)")] = None,
    hot_max_lag: Annotated[int, typer.Option(
        help="with --hot: how many epochs a follower that has caught up may fall behind before the leader "
             "waits for it (a follower that is joining or copying is never waited for)", min=0)] = 1,
    crash_at: Annotated[str | None, typer.Option(hidden=True, help="test hook: EPOCH:POINT")] = None,
    freeze_at: Annotated[str | None, typer.Option(hidden=True, help="test hook: SIGSTOP at EPOCH:POINT")] = None,
    rehearse: Annotated[bool, typer.Option(
        hidden=True, help="a standby rehearses the next epoch while it waits (off: measure a cold takeover)")] = True,
    ui: Annotated[bool, typer.Option(help="serve the web dashboard, /metrics and the control API while it runs")] = False,
    ui_host: Annotated[str, typer.Option(help="the dashboard's address")] = "127.0.0.1",
    ui_port: Annotated[int, typer.Option(help="the dashboard's port (0: any free one)")] = 8080,
    ui_token: Annotated[str | None, typer.Option(
        envvar="EDDYLINE_UI_TOKEN", show_envvar=True,
        help="the token every dashboard request must carry (default: a random one, printed in the URL at start)")] = None,
    ui_no_token: Annotated[bool, typer.Option(
        "--ui-no-token", help="serve the dashboard without a token (loopback only; cross-site calls are still refused)")] = False,
    ui_allow_host: Annotated[list[str] | None, typer.Option(
        help="another name the dashboard may be reached by (the Host header; loopback names and the "
             "address it listens on are always allowed)")] = None,
) -> None:
    """Run a network in epochs until --epochs / --duration / --until-idle (or Ctrl-C).

    A driver holds the checkpoint's lease while it runs (local or mounted checkpoints). Without
    --standby it takes the lease at once: a driver still running on the checkpoint is fenced
    (it stops before its next visible step). With --standby it waits for the lease to expire,
    having rehearsed the next epoch (writing only to a scratch directory) so that it leads warm."""
    _run(spec, checkpoint, epochs, duration, until_idle, lanes, progress_json, live, master, crash_at,
         standby, lease_timeout, freeze_at, rehearse, hot=hot, hot_max_lag=hot_max_lag,
         ui=UiOptions(ui_host, ui_port, ui_token, ui_no_token, tuple(ui_allow_host or ())) if ui else None)


@dataclass(frozen=True)
class UiOptions:
    host: str
    port: int
    token: str | None
    no_token: bool = False
    allow_hosts: tuple[str, ...] = ()

    def access(self, options: tuple[str, str, str] = ("--ui-host", "--ui-token", "--ui-no-token")):  # noqa: ANN201
        """The server's rules; a SpecError naming the option for a choice that cannot be served."""
        from eddyline.observe.dashboard.access import Access

        return Access.bind(self.host, self.token, no_token=self.no_token, allow_hosts=self.allow_hosts,
                           options=options)

    def serve(self, feed, access):  # noqa: ANN001, ANN201
        """``feed``'s dashboard, started; prints the URL to open (with the token when it was made here)."""
        from eddyline.observe.dashboard.server import DashboardServer

        server = DashboardServer(feed, access, self.host, self.port).start()
        # soft_wrap: the URL stays on one line, whatever the terminal's width, so it can be copied
        err.print(f"dashboard: {server.login_url} · metrics: {server.url}metrics", highlight=False, soft_wrap=True)
        return server


def _run(
    spec: Path,
    checkpoint: str,
    epochs: int | None,
    duration: float | None,
    until_idle: bool,
    lanes: int | None,
    progress_json: str | None,
    live: bool,
    master: str | None,
    crash_at: str | None,
    standby: bool = False,
    lease_timeout: float = 5.0,
    freeze_at: str | None = None,
    rehearse: bool = True,
    hot: str | None = None,
    ui: UiOptions | None = None,
    hot_max_lag: int = 1,
) -> None:
    from eddyline.facade import validate as analyze
    from eddyline.observe.progress import ProgressReporter
    from eddyline.operate import live_feed
    from eddyline.runtime.engine import Engine
    from eddyline.runtime.faults import KillDriver

    if epochs is None and duration is None and not until_idle:
        err.print("[dim]no --epochs/--duration/--until-idle: running until Ctrl-C[/dim]")
    stop = {"now": False}

    def _interrupt(signum: int, frame: object) -> None:
        stop["now"] = True  # finish the current epoch, then stop cleanly

    try:
        access = ui.access() if ui is not None else None  # refused before anything starts
        faults = (KillDriver.parse(crash_at) if crash_at
                  else KillDriver.parse(freeze_at, signal.SIGSTOP, "--freeze-at") if freeze_at else None)
        net = _load(spec)
        from eddyline.runtime.checkpoint import Checkpoint

        Checkpoint(checkpoint).restart_change(net)  # a spec its state cannot follow: refused before the lease
        from eddyline.facade import check_inputs

        check_inputs(net)
        session = _spark(master)
        analyze(net, session)
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        pair = _pair(hot, checkpoint, standby, lease_timeout, hot_max_lag) if hot is not None else None
        lease = _lease(checkpoint, standby, lease_timeout) if pair is None else pair.lease if pair.lease.generation else None
        with ProgressReporter(live=live and sys.stderr.isatty(), json_path=progress_json) as reporter:
            # built before the lease is ours (it reads the checkpoint only once it runs), so a
            # standby can rehearse with it while it waits
            engine = Engine(net, session, checkpoint, lanes=lanes, reporter=reporter, faults=faults, lease=lease,
                            pair=pair)
            server = ui.serve(live_feed(engine, reporter), access) if ui is not None else None
            try:
                if pair is None and lease is not None and not _take(lease, engine, standby, rehearse, lambda: stop["now"]):
                    return  # a standby stopped before it could take over
                summary = engine.run(
                    epochs=epochs, duration_s=duration, until_idle=until_idle, should_stop=lambda: stop["now"]
                )
            finally:
                if server is not None:
                    server.stop()
    except EddylineError as e:
        raise _fail(e) from None
    outputs = ", ".join(f"{k}={v}" for k, v in summary.output_rows.items())
    typer.echo(
        f"ran {summary.epochs} epochs (last {summary.last_epoch}, {summary.replayed} replayed): "
        f"{summary.input_rows} input rows, output rows {outputs or '-'}, "
        f"{summary.late_rows} late, {summary.dead_letters} dead letters"
    )
    if summary.dead_letters:
        from eddyline.operate import dead_letter_path

        err.print(f"dead letters (each with its reason) are in {dead_letter_path(net, checkpoint)}", highlight=False,
                  soft_wrap=True)
    if summary.epochs == 0:
        err.print(_nothing_new(checkpoint), highlight=False, soft_wrap=True)


def _nothing_new(checkpoint: str) -> str:
    """Why a run ran no epoch: where the checkpoint's sources stand."""
    from eddyline.runtime.checkpoint import Checkpoint

    last = Checkpoint(checkpoint).latest_commit()
    if last is None:
        return "nothing to read yet: the sources have no input"
    offsets = ", ".join(f"{name} at offset {end:,}" for name, end in sorted(last.source_ends.items()))
    done = " (it reached the end of its input)" if last.end_of_stream else ""
    return (f"nothing new to read: checkpoint {checkpoint} has run its input up to epoch {last.epoch}{done}; "
            f"sources: {offsets or '-'}")


def _lease(checkpoint: str, standby: bool, timeout_s: float):  # noqa: ANN202
    """The checkpoint's lease, not yet taken (None: an object-store checkpoint, which has none)."""
    from eddyline.ha.lease import Lease

    try:
        return Lease(checkpoint, timeout_s=timeout_s)
    except CheckpointError:  # an object-store checkpoint: no lease, so no standby either
        if standby:
            raise
        return None


def _take(lease, engine, standby: bool, rehearse: bool, stopped: Callable[[], bool]) -> bool:  # noqa: ANN001
    """Take the lease: at once, fencing whoever holds it; or as a standby once its holder let it
    expire, first rehearsing ``engine``'s next epoch and keeping Spark's Python workers alive
    while it waits. False: stopped before it could."""
    if not standby:
        while not lease.try_acquire(force=True):  # another driver took this generation: the next
            pass
    elif not lease.try_acquire():  # nobody leads: no time to rehearse
        from eddyline.runtime.warmup import Standby

        ready = Standby(engine) if rehearse else None
        if ready is not None:
            err.print(f"standby ready: {ready.rehearse().describe()}", highlight=False)
        shown: set[int] = set()

        def waiting(cur) -> None:  # noqa: ANN001
            if cur.generation not in shown:
                shown.add(cur.generation)
                err.print(f"standby: {cur.holder} leads (generation {cur.generation}); waiting for its lease to expire")
            if ready is not None:
                ready.keep_warm()

        # polled every 0.1 s (reading two small files): the lease's own default, up to 0.5 s,
        # would add half of that to a takeover on average
        if not lease.acquire(poll_s=0.1, should_stop=stopped, on_wait=waiting):
            return False
    err.print(f"leading as {lease.holder} (lease generation {lease.generation})")
    return True


def _pair(group: str, checkpoint: str, standby: bool, timeout_s: float, max_lag: int = 1):  # noqa: ANN202
    """This driver's side of a hot pair: leading if it could take the group's lease, else
    following its holder (see eddyline.runtime.replica)."""
    from eddyline.runtime.replica import HotPair

    if standby:
        raise SpecError("--hot and --standby: choose one (a hot follower is a standby that runs every epoch)")
    pair = HotPair(group, checkpoint, timeout_s=timeout_s, max_lag=max_lag)
    if pair.lease.try_acquire():
        err.print(f"leading as {pair.lease.holder} (hot group {group}, lease generation {pair.lease.generation})")
    else:
        cur = pair.leader()
        err.print(f"following {cur.holder if cur else 'the leader'} (hot group {group}): joining (it copies the "
                  f"leader's latest commit if it is far behind), then running its epochs with checkpoint "
                  f"{checkpoint}, ready to take over")
    return pair


def _target(to: str) -> tuple[str, str]:
    """``nats://host:port/STREAM`` (or ``tls://host:port/STREAM?ca=…``) → (server URL, stream)."""
    from urllib.parse import urlsplit

    parts = urlsplit(to)
    stream = parts.path.strip("/")
    if parts.scheme not in ("nats", "tls") or not parts.netloc or not stream or "/" in stream:
        raise SpecError(f"--to: expected nats://host:port/STREAM or tls://host:port/STREAM[?ca=FILE], got {to!r}")
    return f"{parts.scheme}://{parts.netloc}" + (f"?{parts.query}" if parts.query else ""), stream


def _feeds(what: str, subject: str, only: str | None, sets: list[str]):  # noqa: ANN202
    from eddyline.api.sources import SourceSpec
    from eddyline.io.produce import Feed

    params: dict[str, object] = {"unpaced": True}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq:
            raise SpecError(f"--set: expected key=value, got {item!r}")
        params[key.strip()] = _yaml_value(value)
    try:
        if what == "generator":
            return [Feed(SourceSpec.model_validate({"name": "generator", "generator": params}), subject)]
        if what == "nexmark":
            kinds = [k.strip() for k in (only or "person,auction,bid").split(",")]
            return [
                Feed(SourceSpec.model_validate({"name": k, "nexmark": {**params, "stream": k}}), f"{subject}.{k}")
                for k in kinds
            ]
    except ValueError as e:  # pydantic's, naming the field
        raise SpecError(f"{what}: {e}") from None
    raise SpecError(f"produce: expected 'nexmark' or 'generator', got {what!r}")


def _yaml_value(text: str) -> object:
    import yaml

    return yaml.safe_load(text)


control_app = typer.Typer(no_args_is_help=True, help="Change a running network's parameters between two epochs.")
app.add_typer(control_app, name="control")


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
        net = _load(spec)
        wanted = dict(parse_setting(text) for text in settings)
        last = Checkpoint(checkpoint).latest_commit()
        with_settings(with_settings(net, last.settings if last else {}), wanted)
        command = Inbox(checkpoint).submit(wanted)
    except EddylineError as e:
        raise _fail(e) from None
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
        raise _fail(e) from None
    Console().print(f"queued command {command}: {_describe({'route': route})}; it takes effect at the next epoch",
                    highlight=False)


@control_app.command("pause")
def control_pause(checkpoint: Annotated[str, typer.Option(help="the running network's checkpoint")]) -> None:
    """Pause the network running on --checkpoint after its current epoch (a restarted driver stays
    paused) until `eddyline control resume`."""
    try:
        command = _queue_checked(checkpoint, {"pause": True})
    except EddylineError as e:
        raise _fail(e) from None
    Console().print(f"queued pause {command}: the network stops after its current epoch", highlight=False)


@control_app.command("resume")
def control_resume(checkpoint: Annotated[str, typer.Option(help="the paused network's checkpoint")]) -> None:
    """Resume a paused network."""
    try:
        command = _queue_checked(checkpoint, {"resume": True})
    except EddylineError as e:
        raise _fail(e) from None
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


@app.command()
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
        old, target = _load(spec), _load(new)
        diff = check_change(old, target, tuple(reset or ()))
        starts = required_history_starts(old, target, from_epoch) if from_epoch is not None else {}
    except EddylineError as e:
        raise _fail(e) from None
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


@app.command()
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
        net = _load(spec)
        body: dict = {"replay": from_epoch}
        if with_ is not None:
            new = _load(with_)
            for line in check_change(net, new, tuple(reset or ())).lines():
                Console().print(line, highlight=False)
            body |= {"network": new.as_dict(), "reset": sorted(reset or ())}
        command = Inbox(checkpoint).submit_command(body)
    except EddylineError as e:
        raise _fail(e) from None
    Console().print(f"queued replay {command} from epoch {from_epoch}; it starts at the next epoch", highlight=False)


@app.command()
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
        _load(spec)
        command = Inbox(checkpoint).submit_command({"undo": epoch})
    except EddylineError as e:
        raise _fail(e) from None
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


@app.command()
def produce(
    what: Annotated[str, typer.Argument(help="the built-in generator: nexmark or generator")],
    to: Annotated[str, typer.Option(help="nats://host:port/STREAM (created if missing)")],
    subject: Annotated[str | None, typer.Option(help="subject; nexmark publishes SUBJECT.person/.auction/.bid; default: the stream name in lower case")] = None,
    only: Annotated[str | None, typer.Option(help="nexmark: which of person,auction,bid")] = None,
    rate: Annotated[float | None, typer.Option(help="offsets (nexmark: events) per second of wall time; default: as fast as possible")] = None,
    events: Annotated[int | None, typer.Option(help="how many offsets to publish; default: until Ctrl-C")] = None,
    start: Annotated[int, typer.Option(help="the first offset")] = 0,
    set_: Annotated[list[str] | None, typer.Option("--set", help="a generator parameter, key=value (e.g. seed=3)")] = None,
    records_per_message: Annotated[int, typer.Option(
        min=1, help="rows a message, one JSON object a line (a nats source reads them with records: lines)")] = 1,
    master: Master = None,
) -> None:
    """Publish a built-in generator's rows to a NATS JetStream stream, one JSON object a message
    (or --records-per-message of them, one a line)."""
    from eddyline.io.produce import produce as run_producer

    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("now", True))
    try:
        url, stream = _target(to)
        feeds = _feeds(what, subject or stream.lower(), only, set_ or [])
        if events is None and rate is None:
            err.print("[dim]no --events: publishing until Ctrl-C[/dim]")
        reached = run_producer(
            _spark(master), url, stream, feeds, start=start, end=None if events is None else start + events,
            rate=rate, should_stop=lambda: stop["now"], records_per_message=records_per_message,
            on_chunk=lambda done, n: err.print(f"[dim]offset {done:,}: {n:,} messages[/dim]"),
        )
    except EddylineError as e:
        raise _fail(e) from None
    typer.echo(f"published offsets {start:,}..{reached:,} to stream {stream} at {url}")


@app.command()
def ui(
    checkpoint: Annotated[str, typer.Argument(help="the network's checkpoint")],
    host: Annotated[str, typer.Option(help="address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: any free one)")] = 8080,
    token: Annotated[str | None, typer.Option(
        envvar="EDDYLINE_UI_TOKEN", show_envvar=True,
        help="the token every request must carry (default: a random one, printed in the URL at start)")] = None,
    no_token: Annotated[bool, typer.Option("--no-token", help="serve without a token (loopback only)")] = False,
    allow_host: Annotated[list[str] | None, typer.Option(
        help="another name the dashboard may be reached by (the Host header)")] = None,
) -> None:
    """Browse a checkpoint in the web dashboard: the epochs, routing, decisions and control calls
    it recorded (read-only; a running network's own dashboard is `eddyline run --ui`)."""
    import threading

    from eddyline.operate import checkpoint_feed

    options = UiOptions(host, port, token, no_token, tuple(allow_host or ()))
    try:
        access = options.access(("--host", "--token", "--no-token"))  # refused before anything is read
        server = options.serve(checkpoint_feed(checkpoint), access)
    except EddylineError as e:
        raise _fail(e) from None
    err.print(f"browsing {checkpoint} (Ctrl-C to stop)", highlight=False)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    server.stop()


@app.command()
def status(
    checkpoint: Annotated[str, typer.Argument(help="the network's checkpoint")],
    as_json: Annotated[bool, typer.Option("--json", help="print it as JSON")] = False,
) -> None:
    """A running or stopped network at a glance, from its checkpoint alone: last epoch, lag,
    leader, routing and recent decisions."""
    import json
    import time

    from eddyline.operate import status as read_status

    try:
        s = read_status(checkpoint)
    except EddylineError as e:
        raise _fail(e) from None
    if as_json:
        typer.echo(json.dumps(s, indent=2, default=str))
        return
    out = Console(soft_wrap=True)
    ago = f" ({time.time() - s['committedAt']:.0f} s ago)" if s["committedAt"] else ""
    leader = s["leader"]
    who = ("no driver has held its lease" if leader is None else
           f"{'led by' if leader['alive'] else 'last led by'} {leader['holder']} (lease generation {leader['generation']}"
           f"{', lease alive' if leader['alive'] else ', lease expired: not running'})")
    out.print(f"[bold]{s['network']}[/bold] · {checkpoint} · last committed epoch {s['lastEpoch']}{ago}"
              f"{' · end of stream' if s['endOfStream'] else ''}", highlight=False)
    driver = s.get("driver") or {}
    if leader is None and driver.get("role") in ("leader", "follower"):  # a hot pair: its lease is in the group
        who = (f"a hot pair's {driver['role']} ({driver['holder']}, lease generation {driver.get('generation')}"
               + (f", {driver['state']}" if driver.get("state") else "") + ") at the last epoch it ran")
    out.print(f"driver: {who}" + (" · [yellow]paused[/yellow]" if s["paused"] else ""), highlight=False)
    if s["tentative"]:
        out.print(f"[yellow]tentative: its state lacks input from {', '.join(s['tentative'])}[/yellow]")
    stats = s["lastEpochStats"]
    if stats:
        out.print(f"last epoch: {stats['numInputRows']:,} input rows in {stats['durationMs']['triggerExecution']:.0f} ms, "
                  f"watermark {(stats.get('eventTime') or {}).get('watermark') or '-'}, {stats['deadLetters']} dead letters, "
                  f"{stats['lateRows']} late", highlight=False)
    if s["deadLetters"]["total"]:
        out.print(f"dead letters: {s['deadLetters']['total']:,} over the epochs whose progress is kept, each with its "
                  f"reason in {s['deadLetters']['path']}", highlight=False)
    for name, src in s["sources"].items():
        lag = "-" if src["backlog"] is None else f"{src['backlog']:,}"
        out.print(f"source {name}: offset {src['offset']:,}, lag {lag}", highlight=False)
    for step, r in s["routing"].items():
        state = s["state"].get(step, {})
        out.print(f"step {step}: {r['lanes']} lanes, routing v{r['version']}, key groups per lane {r['keyGroupsPerLane']}"
                  f"{', split ' + str(r['spread']) if r.get('spread') else ''}; state {state.get('rows', 0):,} rows, "
                  f"{state.get('bytes', 0) / 1e6:.1f} MB", highlight=False)
    if s["settings"]:
        out.print("settings in force: " + ", ".join(f"{t} = {v!r}" for t, v in s["settings"].items()), highlight=False)
    for d in s["recentDecisions"]:
        measured = (d.get("measured") or {}).get("makespanMs", "pending")
        out.print(f"epoch {d['epoch']} {d['step']}: {d['kind']} · why {d['why'].get('reason', '-')} · expected makespan "
                  f"{d['expected'].get('makespanMs', '-')} ms · measured {measured}", highlight=False, soft_wrap=True)


@app.command()
def demo(
    duration: Annotated[float, typer.Option(help="seconds to run")] = 60,
    out: Annotated[str, typer.Option(help="directory for output, checkpoint and progress")] = "demo-out",
    files: Annotated[bool, typer.Option("--files", help="no servers: the built-in generator in, Parquet out")] = False,
    ui: Annotated[bool, typer.Option(help="serve the web dashboard while it runs (its URL is printed)")] = False,
    ui_port: Annotated[int, typer.Option(help="the dashboard's port (0: any free one)")] = 8080,
    master: Master = None,
) -> None:
    """Hot auctions: Nexmark bids through a local NATS server into PostgreSQL and Parquet, with
    live progress (the servers run from the installed packages and stop at the end)."""
    import yaml

    example = "demo.yaml" if files else "demo-broker.yaml"
    raw = yaml.safe_load(resources.files("eddyline").joinpath(f"examples/{example}").read_text(encoding="utf-8"))
    ours = [Path(out) / "checkpoint", Path(out) / "progress.jsonl"]
    for sink in raw["sinks"]:
        if "files" in sink:
            sink["files"]["path"] = str(Path(out) / sink["files"]["path"])
            ours.append(Path(sink["files"]["path"]))
    # A demo starts afresh: resuming an old demo's checkpoint would make its paced generator
    # catch up on every event since then in the first epoch. Only what a demo writes goes.
    for path in ours:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    Path(out).mkdir(parents=True, exist_ok=True)
    dashboard = UiOptions("127.0.0.1", ui_port, None) if ui else None
    spec_path = Path(out) / "demo.yaml"
    checkpoint, progress = str(Path(out) / "checkpoint"), str(Path(out) / "progress.jsonl")
    if files:
        spec_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        err.print(f"[bold]eddyline demo[/bold]: network {spec_path}, output under {out}/, {duration:.0f} s")
        _run(spec_path, checkpoint, None, duration, False, None, progress, True, master, None, ui=dashboard)
    else:
        _broker_demo(raw, spec_path, out, duration, checkpoint, progress, master, dashboard)
    typer.echo(f"output: {Path(out) / 'hot-auctions'}/epoch=*/ (Parquet) · progress: {progress}")
    typer.echo(f"look back at the run: eddyline status {checkpoint} · eddyline ui {checkpoint} (the dashboard)")


#: Nexmark events per second the broker demo publishes (the producer shares the machine)
DEMO_RATE = 10_000


def _broker_demo(
    raw: dict, spec_path: Path, out: str, duration: float, checkpoint: str, progress: str, master: str | None,
    ui: UiOptions | None = None,
) -> None:
    """Start NATS and PostgreSQL, publish paced Nexmark bids in a background thread, run."""
    import threading

    import yaml

    from eddyline.api.sources import SourceSpec
    from eddyline.io.local import LocalNats, LocalPostgres
    from eddyline.io.produce import Feed, produce

    source = raw["sources"][0]["nats"]
    err.print("[bold]eddyline demo[/bold]: starting a local NATS server and PostgreSQL ...")
    with LocalNats() as nats, LocalPostgres() as pg:
        source["url"] = nats.url
        for sink in raw["sinks"]:
            if "postgres" in sink:
                sink["postgres"]["url"] = pg.url
                table = sink["postgres"]["table"]
        spec_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        session = _spark(master)
        stop, first_chunk = threading.Event(), threading.Event()
        bids = Feed(SourceSpec.model_validate({"name": "bid", "nexmark": {"stream": "bid"}}), source["subject"])
        producer = threading.Thread(
            target=produce, args=(session, nats.url, source["stream"], [bids]),
            kwargs={"rate": DEMO_RATE, "should_stop": stop.is_set, "on_chunk": lambda *_: first_chunk.set()},
            daemon=True, name="demo-producer",
        )
        producer.start()
        first_chunk.wait(60)  # the source refuses a stream that does not exist yet
        query = f"SELECT * FROM {table} ORDER BY window_start DESC, bids DESC LIMIT 10"
        err.print(
            f"[bold]eddyline demo[/bold]: network {spec_path}; Nexmark bids at {DEMO_RATE:,} events/s into "
            f"stream {source['stream']} at {nats.url}; output in PostgreSQL and under {out}/; "
            f"{duration:.0f} s. While it runs, look at the database with:"
        )
        err.print(f"  {pg.psql} '{pg.url}' -c '{query}'", soft_wrap=True, highlight=False)
        try:
            _run(spec_path, checkpoint, None, duration, False, None, progress, True, master, None, ui=ui)
        finally:
            stop.set()
            producer.join(timeout=30)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
