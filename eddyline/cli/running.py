"""``run`` and ``sql``: a network run in epochs, with its lease (or a standby's wait, or a hot
pair's side), its dashboard and the summary at the end."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from eddyline import objectstore
from eddyline.cli.common import (
    Epochs,
    Lanes,
    Live,
    Master,
    ProgressJson,
    Seconds,
    SpecArg,
    UntilIdle,
    err,
    fail,
    load,
    spark,
)
from eddyline.errors import CheckpointError, EddylineError, SpecError


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
            net = load(query)
        except EddylineError as e:
            raise fail(e) from None
        typer.echo(yaml.safe_dump(net.as_dict(), sort_keys=False, width=120), nl=False)
        return
    assert checkpoint is not None
    start(RunOptions(query, checkpoint, epochs, duration, until_idle, lanes, progress_json, live, master))


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
        help="a hot pair's group (a directory or an object-store location): the first driver in it leads, the other runs every epoch too "
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
    start(RunOptions(
        spec, checkpoint, epochs, duration, until_idle, lanes, progress_json, live, master,
        standby=standby, lease_timeout=lease_timeout, hot=hot, hot_max_lag=hot_max_lag, rehearse=rehearse,
        crash_at=crash_at, freeze_at=freeze_at,
        ui=UiOptions(ui_host, ui_port, ui_token, ui_no_token, tuple(ui_allow_host or ())) if ui else None,
    ))


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


@dataclass(frozen=True)
class RunOptions:
    """One run as the command line asked for it (``run``, ``sql``, ``demo``)."""

    spec: Path
    checkpoint: str
    epochs: int | None = None  # stop after this many epochs
    duration: float | None = None  # ... or after this many seconds
    until_idle: bool = False  # ... or when the input is exhausted
    lanes: int | None = None
    progress_json: str | None = None
    live: bool = True
    master: str | None = None
    standby: bool = False  # wait for the lease instead of taking it
    lease_timeout: float = 5.0
    hot: str | None = None  # a hot pair's group directory
    hot_max_lag: int = 1
    rehearse: bool = True  # a standby rehearses its next epoch while it waits
    crash_at: str | None = None  # test hooks: EPOCH:POINT
    freeze_at: str | None = None
    ui: UiOptions | None = None


def start(o: RunOptions) -> None:
    """Run as ``o`` says: checks first (nothing starts for a spec that cannot run), then the lease,
    the engine and the dashboard; a summary line at the end."""
    from eddyline.facade import validate as analyze
    from eddyline.observe.progress import ProgressReporter
    from eddyline.operate import live_feed
    from eddyline.runtime.engine import Engine
    from eddyline.runtime.faults import KillDriver

    if o.epochs is None and o.duration is None and not o.until_idle:
        err.print("[dim]no --epochs/--duration/--until-idle: running until Ctrl-C[/dim]")
    stop = {"now": False}

    def _interrupt(signum: int, frame: object) -> None:
        stop["now"] = True  # finish the current epoch, then stop cleanly

    try:
        access = o.ui.access() if o.ui is not None else None  # refused before anything starts
        faults = (KillDriver.parse(o.crash_at) if o.crash_at
                  else KillDriver.parse(o.freeze_at, signal.SIGSTOP, "--freeze-at") if o.freeze_at else None)
        net = load(o.spec)
        for where in (o.checkpoint, o.hot):  # a missing bucket or an unreachable store: said now
            if where is not None and objectstore.is_object_store(where):
                objectstore.check(where)
        from eddyline.runtime.checkpoint import Checkpoint

        Checkpoint(o.checkpoint).restart_change(net)  # a spec its state cannot follow: refused before the lease
        from eddyline.facade import check_inputs

        check_inputs(net)
        session = spark(o.master)
        analyze(net, session)
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        pair = _pair(o.hot, o.checkpoint, o.standby, o.lease_timeout, o.hot_max_lag) if o.hot is not None else None
        lease = (_lease(o.checkpoint, o.standby, o.lease_timeout) if pair is None
                 else pair.lease if pair.lease.generation else None)
        with ProgressReporter(live=o.live and sys.stderr.isatty(), json_path=o.progress_json) as reporter:
            # built before the lease is ours (it reads the checkpoint only once it runs), so a
            # standby can rehearse with it while it waits
            engine = Engine(net, session, o.checkpoint, lanes=o.lanes, reporter=reporter, faults=faults, lease=lease,
                            pair=pair)
            server = o.ui.serve(live_feed(engine, reporter), access) if o.ui is not None else None
            try:
                if pair is None and lease is not None and not _take(lease, engine, o.standby, o.rehearse,
                                                                    lambda: stop["now"]):
                    return  # a standby stopped before it could take over
                summary = engine.run(
                    epochs=o.epochs, duration_s=o.duration, until_idle=o.until_idle, should_stop=lambda: stop["now"]
                )
            finally:
                if server is not None:
                    server.stop()
    except EddylineError as e:
        raise fail(e) from None
    outputs = ", ".join(f"{k}={v}" for k, v in summary.output_rows.items())
    typer.echo(
        f"ran {summary.epochs} epochs (last {summary.last_epoch}, {summary.replayed} replayed): "
        f"{summary.input_rows} input rows, output rows {outputs or '-'}, "
        f"{summary.late_rows} late, {summary.dead_letters} dead letters"
    )
    if summary.dead_letters:
        from eddyline.operate import dead_letter_path

        err.print(f"dead letters (each with its reason) are in {dead_letter_path(net, o.checkpoint)}", highlight=False,
                  soft_wrap=True)
    if summary.epochs == 0:
        err.print(_nothing_new(o.checkpoint), highlight=False, soft_wrap=True)


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
    except CheckpointError:  # a URI of another file system (no conditional writes): no lease, so no standby
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

        ready = Standby(engine, say=lambda line: err.print(line, highlight=False)) if rehearse else None
        if ready is not None:
            err.print(f"standby ready: {ready.rehearse().describe()}", highlight=False)
        shown: set[int] = set()

        def waiting(cur) -> None:  # noqa: ANN001
            if cur.generation not in shown:
                shown.add(cur.generation)
                err.print(f"standby: {cur.holder} leads (generation {cur.generation}); waiting for its lease to expire")
            if ready is not None:
                ready.catch_up()  # the first committed epoch, once there is one (in a thread)
                ready.keep_warm()

        # polled every 0.1 s (reading two small files): the lease's own default, up to 0.5 s,
        # would add half of that to a takeover on average
        try:
            if not lease.acquire(poll_s=0.1, should_stop=stopped, on_wait=waiting):
                return False
        finally:
            if ready is not None:
                ready.stop()
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
