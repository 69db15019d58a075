"""Feeding a broker: publish a built-in generator's rows (``nexmark``, ``generator``) to a NATS
JetStream stream, paced at a number of offsets per second of wall time or as fast as possible.

Rows are computed in Spark exactly as the source of the same settings computes them, and sent as
JSON objects, one per message or ``records_per_message`` per message, one per line (a ``nats``
source reads those with ``records: lines``). Each message's id is ``source/first offset/n`` for
the n-th message of that source since the first offset; message n holds that source's rows n·k
to n·k + k − 1 (k rows a message), however the offsets are cut into chunks, since rows come in
offset order and a chunk's rows that do not fill a message wait for the next chunk. So producing
from the same offset again (a restarted producer) adds nothing within the stream's
de-duplication window. The last message may be short; its id then ends in ``.rows``. A producer
stopped in the middle (Ctrl-C) sends such a short message, and one started again from the same
offset sends the full message with that number as well, so the rows of the short one arrive twice.

To Kafka (:func:`produce_kafka`) each feed's rows go to the topic its ``subject`` names, one JSON
object (or plain Avro record, of the schema :func:`eddyline.io.binrecords.avro_schema_of` gives
its columns, or plain Protobuf message, of the message
:func:`eddyline.io.binrecords.protobuf_descriptors_of` gives them) a record, through an
idempotent producer (no duplicates from its own retries); Kafka has no de-duplication window, so
a producer started again from the same offset sends those rows again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eddyline.api.sources import SourceSpec
from eddyline.io.natswire import DEDUP_WINDOW_MS, NatsConnection, ensure_stream
from eddyline.io.records import to_json_column
from eddyline.io.sources import make_source
from eddyline.io.textrecords import packed_payloads

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

#: the value formats of :func:`produce_kafka`
FORMATS = ("json", "avro", "protobuf")
#: offsets per chunk when producing as fast as possible
UNPACED_CHUNK = 200_000
#: pause between paced chunks
TICK_S = 0.5


@dataclass(frozen=True)
class Feed:
    """One source's rows, published on one subject."""

    source: SourceSpec
    subject: str


def produce(
    spark: SparkSession,
    url: str,
    stream: str,
    feeds: list[Feed],
    *,
    start: int = 0,
    end: int | None = None,
    rate: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
    records_per_message: int = 1,
) -> int:
    """Publish offsets [``start``, ``end``) of every feed (``end`` None: until ``should_stop``),
    at ``rate`` offsets per second (None: as fast as possible), ``records_per_message`` rows a
    message. Creates the stream if missing. ``on_chunk(offset reached, messages published so
    far)`` after each chunk. Returns the offset reached."""
    if records_per_message < 1:
        raise ValueError(f"records_per_message: expected at least 1, got {records_per_message}")
    published, done = 0, start
    outs = [_Messages(f.subject, f"{f.source.name}/{start}/", records_per_message) for f in feeds]
    with NatsConnection(url) as conn:
        ensure_stream(conn, stream, sorted({f.subject for f in feeds}), duplicate_window_ms=DEDUP_WINDOW_MS)
        for done, rows in _chunks(spark, feeds, start, end, rate, should_stop):
            for out, chunk in zip(outs, rows, strict=True):
                published += out.send(conn, chunk)
            if on_chunk is not None:
                on_chunk(done, published)
        for out in outs:
            published += out.send(conn, [], last=True)
    return done


def produce_kafka(
    spark: SparkSession,
    brokers: str,
    feeds: list[Feed],
    *,
    start: int = 0,
    end: int | None = None,
    rate: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
    partitions: int = 1,
    value_format: str = "json",
    on_schema: Callable[[str, Any], None] | None = None,
) -> int:
    """:func:`produce` to Kafka: each feed's rows to the topic its ``subject`` names (created with
    ``partitions`` partitions if missing), one JSON object a record, or with ``value_format``
    ``"avro"`` one plain Avro record (``on_schema(topic, schema)`` is told each topic's Avro
    schema, a dict, before its first record), with ``"protobuf"`` one plain Protobuf message
    (``on_schema(topic, (FileDescriptorSet bytes, message name))``). Returns the offset reached."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from eddyline.errors import EddylineError

    if value_format not in FORMATS:
        raise EddylineError(f"produce: value format: expected {', '.join(FORMATS)}, got {value_format!r}")
    admin = AdminClient({"bootstrap.servers": brokers})
    try:
        have = admin.list_topics(timeout=10).topics
        missing = sorted({f.subject for f in feeds} - set(have))
        for future in (admin.create_topics([NewTopic(t, partitions) for t in missing]).values() if missing else []):
            future.result()
    except KafkaException as e:
        raise EddylineError(f"produce: Kafka brokers {brokers}: {e.args[0]}") from e
    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, "linger.ms": 20})
    published, done = 0, start
    writers: dict[str, Callable[[dict], bytes]] = {}
    binary = value_format != "json"
    for done, rows in _chunks(spark, feeds, start, end, rate, should_stop, typed=binary):
        for feed, chunk in zip(feeds, rows, strict=True):
            if binary and feed.subject not in writers:
                writers[feed.subject] = _writer(value_format, chunk.schema, feed.subject, on_schema)
            values = ([writers[feed.subject](r) for r in chunk.to_pylist()] if binary
                      else [row.encode() for row in chunk])
            for value in values:
                while True:
                    try:
                        producer.produce(feed.subject, value)
                        break
                    except BufferError:  # the producer's queue is full: let it drain
                        producer.poll(0.1)
            published += len(chunk)
        if producer.flush(60) > 0:
            raise EddylineError(f"produce: Kafka brokers {brokers} did not take the records within 60s")
        if on_chunk is not None:
            on_chunk(done, published)
    return done


def _writer(
    value_format: str, schema: pa.Schema, topic: str, on_schema: Callable[[str, Any], None] | None,
) -> Callable[[dict], bytes]:
    """The encoder of a topic's rows in ``value_format`` (avro, protobuf), its schema told to
    ``on_schema``; EddylineError naming the topic and column when a column has no type there."""
    from eddyline.errors import EddylineError
    from eddyline.io import binrecords

    told: Any
    try:
        if value_format == "avro":
            told = binrecords.avro_schema_of(schema, topic)
            write = binrecords.avro_writer(told)
        else:
            told = binrecords.protobuf_descriptors_of(schema, topic)
            write = binrecords.protobuf_writer(*told)
    except ValueError as e:
        raise EddylineError(f"produce: topic {topic}, --format {value_format}: {e}") from None
    if on_schema is not None:
        on_schema(topic, told)
    return write


def _chunks(
    spark: SparkSession, feeds: list[Feed], start: int, end: int | None, rate: float | None,
    should_stop: Callable[[], bool] | None, typed: bool = False,
) -> Iterator[tuple[int, list[Any]]]:
    """The feeds' rows as JSON text (``typed``: as an Arrow table), chunk by chunk: (the offset
    reached, each feed's rows)."""
    sources = [make_source(f.source) for f in feeds]
    done, t0 = start, time.monotonic()
    while (end is None or done < end) and not (should_stop is not None and should_stop()):
        if rate is None:
            upto = done + UNPACED_CHUNK
        else:
            upto = start + int(rate * (time.monotonic() - t0))
            if upto <= done:
                time.sleep(TICK_S)
                continue
        if end is not None:
            upto = min(upto, end)
        rows = []
        for source in sources:
            df = source.frames(spark, {"start": done, "end": upto}, spark.sparkContext.defaultParallelism).data
            rows.append(df.toArrow() if typed else to_json_column(df).toArrow().column(0).to_pylist())
        done = upto
        yield done, rows


@dataclass
class _Messages:
    """One feed's rows as messages of ``per`` rows each, numbered from the producer's first offset."""

    subject: str
    prefix: str
    per: int
    sent: int = 0  # messages published
    waiting: list[str] = field(default_factory=list)  # rows that do not fill a message yet

    def send(self, conn: NatsConnection, rows: list[str], last: bool = False) -> int:
        """Publish the full messages ``rows`` make after the waiting ones (``last``: the rest too,
        however few); returns how many."""
        rows = self.waiting + rows if self.waiting else rows
        full = len(rows) if last else len(rows) - len(rows) % self.per
        self.waiting = rows[full:]
        messages = [
            (self.subject, self._id(self.sent + n, min(self.per, full - n * self.per)), payload)
            for n, payload in enumerate(packed_payloads(rows[:full], self.per))
        ]
        if messages:
            conn.publish(messages)
        self.sent += len(messages)
        return len(messages)

    def _id(self, n: int, rows: int) -> str:
        # a short message (the last) says how many rows it holds: the full message a later
        # producer sends under the same number is another message, not a duplicate of it
        return f"{self.prefix}{n}" if rows == self.per else f"{self.prefix}{n}.{rows}"
