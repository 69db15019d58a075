"""``demo``: the hot-auctions network, on files or through local NATS and PostgreSQL servers."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from eddyline.cli.common import Master, err, spark
from eddyline.cli.running import RunOptions, UiOptions, start


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
        start(RunOptions(spec_path, checkpoint, duration=duration, progress_json=progress, master=master, ui=dashboard))
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
        session = spark(master)
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
            start(RunOptions(spec_path, checkpoint, duration=duration, progress_json=progress, master=master, ui=ui))
        finally:
            stop.set()
            producer.join(timeout=30)
