"""``status`` and ``ui``: a network looked at from its checkpoint, in the terminal or the browser."""

from __future__ import annotations

import signal
from typing import Annotated

import typer
from rich.console import Console

from eddyline.cli.common import err, fail
from eddyline.cli.running import UiOptions
from eddyline.errors import EddylineError


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
        raise fail(e) from None
    err.print(f"browsing {checkpoint} (Ctrl-C to stop)", highlight=False)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    server.stop()


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
        raise fail(e) from None
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
    mode = s.get("mode")
    if mode:
        why = (f" (since {time.strftime('%H:%M:%S', time.localtime(mode['since']))}, from {mode['from']}: {mode['reason']})"
               if mode.get("reason") else "")
        out.print(f"mode at the last epoch: {mode['mode']}{why}", highlight=False)
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
