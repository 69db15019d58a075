"""``produce``: a built-in generator's rows published to a NATS JetStream stream or Kafka topics."""

from __future__ import annotations

import signal
from typing import Annotated, Any

import typer

from eddyline.cli.common import Master, err, fail, spark
from eddyline.errors import EddylineError, SpecError


def _target(to: str) -> tuple[str, str]:
    """``nats://host:port/STREAM`` (or ``tls://host:port/STREAM?ca=…``) → (server URL, stream);
    ``kafka://host:port[,host:port]/TOPIC`` → (``kafka://`` and the brokers, topic)."""
    from urllib.parse import urlsplit

    parts = urlsplit(to)
    stream = parts.path.strip("/")
    if parts.scheme == "kafka":
        if not parts.netloc or not stream or "/" in stream:
            raise SpecError(f"--to: expected kafka://host:port[,host:port]/TOPIC, got {to!r}")
        return f"kafka://{parts.netloc}", stream
    if parts.scheme not in ("nats", "tls") or not parts.netloc or not stream or "/" in stream:
        raise SpecError(f"--to: expected nats://host:port/STREAM, tls://host:port/STREAM[?ca=FILE] or "
                        f"kafka://host:port/TOPIC, got {to!r}")
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

def produce(
    what: Annotated[str, typer.Argument(help="the built-in generator: nexmark or generator")],
    to: Annotated[str, typer.Option(help="nats://host:port/STREAM or kafka://host:port/TOPIC (created if missing)")],
    subject: Annotated[str | None, typer.Option(help="subject; nexmark publishes SUBJECT.person/.auction/.bid; default: the stream name in lower case; Kafka: nexmark writes the topics TOPIC.person/.auction/.bid")] = None,
    only: Annotated[str | None, typer.Option(help="nexmark: which of person,auction,bid")] = None,
    rate: Annotated[float | None, typer.Option(help="offsets (nexmark: events) per second of wall time; default: as fast as possible")] = None,
    events: Annotated[int | None, typer.Option(help="how many offsets to publish; default: until Ctrl-C")] = None,
    start: Annotated[int, typer.Option(help="the first offset")] = 0,
    set_: Annotated[list[str] | None, typer.Option("--set", help="a generator parameter, key=value (e.g. seed=3)")] = None,
    records_per_message: Annotated[int, typer.Option(
        min=1, help="rows a message, one JSON object a line (a nats source reads them with records: lines)")] = 1,
    partitions: Annotated[int, typer.Option(min=1, help="Kafka: partitions of a topic it creates")] = 1,
    format_: Annotated[str, typer.Option("--format", help="Kafka: json, avro (plain Avro records; each topic's schema written to DIR/TOPIC.avsc) or protobuf (plain Protobuf messages; each topic's FileDescriptorSet written to DIR/TOPIC.desc); DIR: --schemas")] = "json",
    schemas: Annotated[str, typer.Option("--schemas", "--avro-schemas", help="Kafka, --format avro or protobuf: the directory the schemas are written to")] = ".",
    master: Master = None,
) -> None:
    """Publish a built-in generator's rows to a NATS JetStream stream, one JSON object a message
    (or --records-per-message of them, one a line), or to Kafka topics, one JSON object, Avro
    record or Protobuf message a record."""
    from eddyline.io.produce import FORMATS, produce_kafka
    from eddyline.io.produce import produce as run_producer

    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("now", True))
    try:
        url, stream = _target(to)
        kafka = url.startswith("kafka://")
        feeds = _feeds(what, subject or (stream if kafka else stream.lower()), only, set_ or [])
        if events is None and rate is None:
            err.print("[dim]no --events: publishing until Ctrl-C[/dim]")
        end = None if events is None else start + events
        if format_ not in FORMATS:
            raise SpecError(f"--format: expected {', '.join(FORMATS)}, got {format_!r}")
        if format_ != "json" and not kafka:
            raise SpecError(f"--format {format_}: Kafka only (--to kafka://...); NATS messages are JSON")
        if kafka:
            if records_per_message != 1:
                raise SpecError("--records-per-message: Kafka takes one record a message")

            def schema_file(topic: str, schema: Any) -> None:
                import json
                from pathlib import Path

                Path(schemas).mkdir(parents=True, exist_ok=True)
                if format_ == "avro":
                    path = Path(schemas) / f"{topic}.avsc"
                    path.write_text(json.dumps(schema, indent=1))
                    err.print(f"[dim]topic {topic}: Avro schema in {path}[/dim]")
                else:
                    descriptors, message = schema
                    path = Path(schemas) / f"{topic}.desc"
                    path.write_bytes(descriptors)
                    err.print(f"[dim]topic {topic}: Protobuf message {message}, its FileDescriptorSet in {path}[/dim]")

            reached = produce_kafka(
                spark(master), url.removeprefix("kafka://"), feeds, start=start, end=end, rate=rate,
                should_stop=lambda: stop["now"], partitions=partitions, value_format=format_,
                on_schema=schema_file,
                on_chunk=lambda done, n: err.print(f"[dim]offset {done:,}: {n:,} records[/dim]"),
            )
        else:
            reached = run_producer(
                spark(master), url, stream, feeds, start=start, end=end,
                rate=rate, should_stop=lambda: stop["now"], records_per_message=records_per_message,
                on_chunk=lambda done, n: err.print(f"[dim]offset {done:,}: {n:,} messages[/dim]"),
            )
    except EddylineError as e:
        raise fail(e) from None
    where = f"topic(s) {', '.join(f.subject for f in feeds)} at {url}" if kafka else f"stream {stream} at {url}"
    typer.echo(f"published offsets {start:,}..{reached:,} to {where}")
