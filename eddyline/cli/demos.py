"""``demo``: the hot-auctions network, on files, through local NATS and PostgreSQL servers, or through a
local Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
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
    kafka: Annotated[bool, typer.Option("--kafka", help="a local Kafka-protocol broker (Tansu): bids from a topic, "
                                        "windows to a topic (one transaction an epoch) and Parquet")] = False,
    ui: Annotated[bool, typer.Option(help="serve the web dashboard while it runs (its URL is printed)")] = False,
    ui_port: Annotated[int, typer.Option(help="the dashboard's port (0: any free one)")] = 8080,
    master: Master = None,
    store: Annotated[str, typer.Option(
        help="where the checkpoint lives: 'local' (under --out) or 's3' (a local S3-compatible server, "
             "moto's, in memory for the demo's length; needs 'eddyline[store]')")] = "local",
) -> None:
    """Hot auctions: Nexmark bids through a local NATS server into PostgreSQL and Parquet, with
    live progress (the servers run from the installed packages and stop at the end)."""
    if files and kafka:
        raise typer.BadParameter("--files and --kafka: choose one", param_hint="--kafka")
    if store not in ("local", "s3"):
        raise typer.BadParameter(f"--store {store!r}: expected 'local' or 's3'", param_hint="--store")
    if store == "s3":
        with _demo_store() as checkpoint:
            _demo(duration, out, files, ui, ui_port, master, checkpoint, kafka)
        return
    _demo(duration, out, files, ui, ui_port, master, None, kafka)


@contextmanager
def _demo_store() -> Iterator[str]:
    """A local S3-compatible server for the demo's checkpoint; the process reaches it (and Spark's
    workers, started after this) through the AWS variables. Yields the checkpoint's location."""
    from eddyline import objectstore
    from eddyline.errors import EddylineError
    from eddyline.io.local import LocalS3

    try:
        server = LocalS3().start()
    except EddylineError as e:
        err.print(f"error: {e}")
        raise typer.Exit(1) from None
    try:
        with objectstore.using(server.env()):
            location = f"{server.bucket('eddyline-demo')}/checkpoint"
            err.print(f"[bold]eddyline demo[/bold]: the checkpoint is on an S3-compatible server at "
                      f"{server.endpoint}: {location} (in memory: it goes when the demo ends)", soft_wrap=True,
                      highlight=False)
            yield location
    finally:
        server.stop()


def _demo(duration: float, out: str, files: bool, ui: bool, ui_port: int, master: str | None,
          on_store: str | None, kafka: bool = False) -> None:
    import yaml

    example = "demo.yaml" if files else "demo-kafka.yaml" if kafka else "demo-broker.yaml"
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
    checkpoint, progress = on_store or str(Path(out) / "checkpoint"), str(Path(out) / "progress.jsonl")
    if files:
        spec_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        err.print(f"[bold]eddyline demo[/bold]: network {spec_path}, output under {out}/, {duration:.0f} s")
        start(RunOptions(spec_path, checkpoint, duration=duration, progress_json=progress, master=master, ui=dashboard))
    elif kafka:
        _kafka_demo(raw, spec_path, out, duration, checkpoint, progress, master, dashboard)
    else:
        _broker_demo(raw, spec_path, out, duration, checkpoint, progress, master, dashboard)
    typer.echo(f"output: {Path(out) / 'hot-auctions'}/epoch=*/ (Parquet) · progress: {progress}")
    if on_store is None:
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


def _kafka_demo(
    raw: dict, spec_path: Path, out: str, duration: float, checkpoint: str, progress: str, master: str | None,
    ui: UiOptions | None = None,
) -> None:
    """Start a Tansu broker, produce paced Nexmark bids in a background thread, run, and say how
    many windows the output topic holds for a read_committed reader."""
    import threading

    import yaml

    from eddyline.api.sources import SourceSpec
    from eddyline.io.local import LocalTansu
    from eddyline.io.produce import Feed, produce_kafka

    source = raw["sources"][0]["kafka"]
    err.print("[bold]eddyline demo[/bold]: starting a local Kafka-protocol broker (Tansu) ...")
    with LocalTansu() as broker:
        source["brokers"] = broker.bootstrap
        for sink in raw["sinks"]:
            if "kafka" in sink:
                sink["kafka"]["brokers"] = broker.bootstrap
                topic = sink["kafka"]["topic"]
        spec_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        session = spark(master)
        stop, first_chunk = threading.Event(), threading.Event()
        bids = Feed(SourceSpec.model_validate({"name": "bid", "nexmark": {"stream": "bid"}}), source["topics"][0])
        producer = threading.Thread(
            target=produce_kafka, args=(session, broker.bootstrap, [bids]),
            kwargs={"rate": DEMO_RATE, "should_stop": stop.is_set, "on_chunk": lambda *_: first_chunk.set(),
                    "partitions": 2},
            daemon=True, name="demo-producer",
        )
        producer.start()
        first_chunk.wait(60)  # the source refuses a topic that does not exist yet
        err.print(
            f"[bold]eddyline demo[/bold]: network {spec_path}; Nexmark bids at {DEMO_RATE:,} events/s into "
            f"topic {source['topics'][0]} at {broker.bootstrap}; windows into topic {topic} and under {out}/; "
            f"{duration:.0f} s", soft_wrap=True, highlight=False)
        try:
            start(RunOptions(spec_path, checkpoint, duration=duration, progress_json=progress, master=master, ui=ui))
        finally:
            stop.set()
            producer.join(timeout=30)
        typer.echo(f"topic {topic}: {_committed_records(broker.bootstrap, topic):,} windows for a read_committed "
                   "reader (the broker's log is in memory: it goes when the demo ends)")


def _committed_records(bootstrap: str, topic: str) -> int:
    """How many records of ``topic`` a read_committed consumer reads, to the end of each partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "eddyline-demo-count", "isolation.level": "read_committed",
                  "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        n, ended = 0, set()
        while len(ended) < len(parts):
            msgs = c.consume(10_000, timeout=5)
            if not msgs:
                break
            for m in msgs:
                if m.error() is None:
                    n += 1
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
        return n
    finally:
        c.close()
