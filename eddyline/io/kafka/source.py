"""The ``kafka`` source: the partitions of Kafka topics, read with librdkafka (confluent-kafka).

Offsets. Each partition has offsets of its own, so the plan holds them all: an epoch's slice is
``ranges``, a list of ``[topic, partition, first, end)``, and its ``cursor`` the next offset of
every partition read so far (``{"topic/partition": offset}``, as JSON), which the commit keeps for
the next plan. A replay reads exactly the ranges its plan logged. The engine's single offset of
the source (``start``/``end`` in the progress) is the sum of the cursor's offsets: it grows by
the offsets an epoch passes over, records and the transaction markers between them alike.

Reading. Spark's tasks read the ranges themselves, each range cut into pieces of at least
:data:`MIN_PER_TASK` offsets dealt to the tasks in turn, each task with a consumer of its own
(``isolation.level=read_committed``, no group, nothing committed). A record's value is one JSON
object or CSV line, decoded like a file's line (:mod:`eddyline.io.textrecords`), or an Avro or
Protobuf record decoded with the schema the source is given (``avro``, ``protobuf``: plain or in
Confluent's wire format, :mod:`eddyline.io.binrecords`); one that does not decode is a dead
letter whose ``file`` is ``topic/partition``, ``line`` its offset, and whose reason ends with the
topic, partition and offset. ``metadata`` adds the record's topic,
partition, offset, timestamp, key and headers as columns ``kafka_<name>``.

Planning. Each plan lists the topics (``topics``, or every topic matching ``pattern``) and their
partitions: a partition that appeared since is read from its first offset from this epoch on; a
topic that vanished or a partition count that shrank stops the run with an error (the offsets
in the checkpoint would point nowhere). Where each partition ends is found by reading, since a
Kafka-protocol broker's ListOffsets cannot always be taken at its word (see
:mod:`eddyline.io.kafka.client`). Offsets a partition no longer holds when they come to be read
(its retention removed them) are counted in the plan's ``discarded`` and the progress, never
passed over in silence. ``max_records_per_partition`` bounds what an epoch takes of a partition;
a cap on the whole (``max_rows_per_epoch``, admission control) is shared out evenly among the
partitions that have records. The progress shows ``backlog`` and the ``lag`` of each partition.

A byte budget. ``max_bytes_per_partition`` bounds the bytes (keys and values) an epoch takes of
a partition, and it too must be in the plan's ranges, or a replay would read other records than
the first try. Kafka tells no record's size before the record is fetched, so the planner reads
them: from the partition's cursor, the records up to the budget (at least one, so that a record
larger than the budget is still read, alone), and the range ends after the last one that fits
(:func:`eddyline.io.kafka.client.budget_ends`). What a given offset holds never changes in a
partition (a transaction below the last stable offset is decided, and the range never passes
it), so the sizes the planner saw are the sizes the tasks read; the plan logs the range's end
either way. The cost: the planner fetches each record once more, up to the budget a partition,
in the driver (the records, not their decoding; none at all without the option).

Consumer group. After each commit of the checkpoint the offsets the epoch reached are committed
for the consumer group ``group`` (default ``eddyline.<source>``), so that Kafka's own tools show the
lag. The checkpoint stays the truth: the group's offsets are never read back, and a failure to
commit them is shown in the source's ``status`` and tried again at the next commit.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from eddyline.api.sources import SOURCES, SourceSpec
from eddyline.api.units import Duration, Model, format_duration_ms
from eddyline.errors import SourceError, SourceUnreachable
from eddyline.io.binrecords import Codec, decoded_binary, read_text_or_file
from eddyline.io.kafka.client import (
    REQUEST_S,
    KafkaUnreachable,
    budget_ends,
    partition_counts,
    read_ends,
    settings,
    unreachable,
    watermarks,
)
from eddyline.io.records import split_decoded
from eddyline.io.retry import Health, with_retry
from eddyline.io.sources import (
    ArrowSlice,
    BadCounter,
    EpochSlice,
    Frames,
    Source,
    SourceKind,
    arrow_decoded,
)
from eddyline.io.textrecords import TextSchema, arrow_schema, decoded_rows

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from pyspark.sql import SparkSession

#: a task reads at least this many offsets of a partition; fewer make one piece
MIN_PER_TASK = 20_000
#: records decoded and handed to Spark together
CHUNK = 20_000

#: the record's metadata a source may add as columns ``kafka_<name>``: (Arrow type, Spark type)
METADATA: dict[str, tuple[pa.DataType, str]] = {
    "topic": (pa.string(), "string"),
    "partition": (pa.int32(), "int"),
    "offset": (pa.int64(), "bigint"),
    "timestamp": (pa.timestamp("us", tz="UTC"), "timestamp"),  # Spark takes microseconds only
    "key": (pa.binary(), "binary"),
    "headers": (pa.map_(pa.string(), pa.binary()), "map<string,binary>"),
}
Metadata = Literal["topic", "partition", "offset", "timestamp", "key", "headers"]
_TOPIC = r"^[A-Za-z0-9._-]{1,249}$"


class AvroValues(Model):
    """How ``format: avro`` values decode."""

    schema_: str = Field(alias="schema", min_length=1)  # the writer's schema: Avro JSON inline, or a file holding it
    confluent: bool = False  # Confluent's wire format: a zero byte and a 4-byte schema id before each record
    schema_id: int | None = Field(default=None, ge=0)  # with confluent: records of another id are dead letters


class ProtobufValues(Model):
    """How ``format: protobuf`` values decode."""

    descriptors: str = Field(min_length=1)  # a FileDescriptorSet file (protoc --include_imports --descriptor_set_out)
    message: str = Field(min_length=1)  # the message type's full name, package.Message
    confluent: bool = False  # Confluent's wire format: zero byte, 4-byte schema id, message indexes, record
    schema_id: int | None = Field(default=None, ge=0)


class KafkaIn(Model):
    """Kafka topics to read: JSON (or CSV) values with a declared schema, one record a value."""

    brokers: str = Field(default="127.0.0.1:9092", min_length=1)  # bootstrap servers, host:port[,host:port]
    topics: list[str] | None = Field(default=None, min_length=1)
    pattern: str | None = None  # a regular expression every topic to read matches whole
    format: Literal["json", "csv", "avro", "protobuf"] = "json"
    schema_: str = Field(alias="schema", min_length=1)  # the columns (Spark DDL); avro/protobuf: fields of the record
    avro: AvroValues | None = None  # format: avro
    protobuf: ProtobufValues | None = None  # format: protobuf
    metadata: list[Metadata] = []
    group: str | None = Field(default=None, min_length=1)  # default: eddyline.<source>
    commit_offsets: bool = True  # commit the group's offsets after each checkpoint commit
    max_records_per_partition: int | None = Field(default=None, gt=0)
    max_bytes_per_partition: int | None = Field(default=None, gt=0)  # keys and values, per partition and epoch
    wait: Duration = Field(default=30_000, gt=0)  # how long to retry brokers that do not answer
    options: dict[str, str] = {}  # librdkafka settings (security.protocol, sasl.*, ...)

    @model_validator(mode="after")
    def _valid(self) -> KafkaIn:
        if (self.topics is None) == (self.pattern is None):
            raise ValueError("give either 'topics' (a list of topic names) or 'pattern' (a regular expression), not both")
        for t in self.topics or []:
            if not re.match(_TOPIC, t):
                raise ValueError(f"topics: {t!r} is not a Kafka topic name (letters, digits, '.', '_', '-')")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"pattern: not a regular expression: {e}") from e
        schema = arrow_schema(self.schema_)
        if schema is None:
            raise ValueError(f"schema: expected flat Spark DDL of scalar types (e.g. 'id long, name string'), "
                             f"got {self.schema_!r}")
        binary = {"avro": self.avro, "protobuf": self.protobuf}
        for name, given in binary.items():
            if given is not None and self.format != name:
                raise ValueError(f"{name}: given, but format is {self.format!r} (set format: {name})")
        if self.format in binary:
            if binary[self.format] is None:
                raise ValueError(f"format: {self.format} needs '{self.format}' (the writer's schema)")
            try:
                codec = self.codec()
                assert codec is not None
                codec.load()
            except ValueError as e:
                raise ValueError(f"{self.format}.{e}") from None
            codec.check(schema)
        clash = {f"kafka_{m}" for m in self.metadata} & {n.lower() for n in schema.arrow.names}
        if clash:
            raise ValueError(f"metadata: the column(s) {sorted(clash)} are fields of the schema too")
        for key in self.options:
            if key in _OWN:
                raise ValueError(f"options: {key!r} is set by the source itself")
        return self

    def codec(self) -> Codec | None:
        """How ``avro``/``protobuf`` values decode (their schema files read now); None for text."""
        if self.format == "avro" and self.avro is not None:
            a = self.avro
            return Codec("avro", read_text_or_file(a.schema_, "schema"), confluent=a.confluent, schema_id=a.schema_id)
        if self.format == "protobuf" and self.protobuf is not None:
            pb = self.protobuf
            try:
                data = Path(pb.descriptors).read_bytes()
            except OSError as e:
                raise ValueError(f"descriptors: cannot read the FileDescriptorSet: {e}") from e
            return Codec("protobuf", base64.b64encode(data).decode(), pb.message, confluent=pb.confluent,
                         schema_id=pb.schema_id)
        return None


#: librdkafka settings the source sets itself
_OWN = {"bootstrap.servers", "group.id", "isolation.level", "enable.auto.commit", "enable.partition.eof",
        "auto.offset.reset"}


def _key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _split_key(key: str) -> tuple[str, int]:
    topic, _, p = key.rpartition("/")
    return topic, int(p)


def share_out(available: dict[str, int], total: int) -> dict[str, int]:
    """How many of each partition's ``available`` offsets an epoch that may take ``total`` takes:
    evenly (water-filling), a partition with fewer than its share leaving the rest to others."""
    take = dict.fromkeys(available, 0)
    left = total
    waiting = sorted((n, k) for k, n in available.items() if n > 0)
    for i, (n, k) in enumerate(waiting):
        share = left // (len(waiting) - i) if i < len(waiting) - 1 else left
        take[k] = min(n, max(share, 0))
        left -= take[k]
    return take


def starts(read: dict[str, int], lows: dict[str, int]) -> dict[str, int]:
    """Where each partition's next range starts: where it was read to, or its first offset if it
    was not read before or retention has removed offsets since (see :func:`slice_of`)."""
    return {key: max(read.get(key, low), low) for key, low in lows.items()}


def slice_of(
    start: int, read: dict[str, int], lows: dict[str, int], ends: dict[str, int], budget: int, per_partition: int | None,
    fits: dict[str, int] | None = None,
) -> dict[str, Any]:
    """An epoch's slice, from what was read (``read``: each partition's next offset, ``topic/p``
    keys) and what the partitions hold now (their first offsets ``lows`` and ends ``ends``):
    at most ``per_partition`` offsets of each, up to ``fits`` (a partition's end of the offsets
    its byte budget takes, where there is one) and ``budget`` in all (see :func:`share_out`). A
    partition not read before starts at its first offset; one read before whose first offset has
    moved past where it was (retention) starts there, the offsets in between ``discarded``."""
    cursor = starts(read, lows)
    discarded = sum(low - read[key] for key, low in lows.items() if key in read and read[key] < low)
    available = {key: max(0, ends[key] - at) for key, at in cursor.items()}
    capped = {k: min(n, per_partition) if per_partition else n for k, n in available.items()}
    for k, end in (fits or {}).items():
        capped[k] = min(capped[k], max(0, end - cursor[k]))
    take = share_out(capped, budget) if sum(capped.values()) > budget else capped
    ranges = [[*_split_key(k), cursor[k], cursor[k] + n] for k, n in sorted(take.items()) if n > 0]
    for k, n in take.items():
        cursor[k] += n
    out: dict[str, Any] = {
        "start": start, "end": max(start, sum(cursor.values())), "ranges": ranges,
        "cursor": json.dumps(cursor, sort_keys=True), "backlog": sum(available.values()) - sum(take.values()),
        "lag": {k: available[k] - take[k] for k in sorted(available)},
    }
    return {**out, "discarded": discarded} if discarded else out


class KafkaSource(Source):
    min_per_task = MIN_PER_TASK

    def __init__(self, spec: SourceSpec):
        super().__init__(spec)
        self.health = Health()
        self._driver: Consumer | None = None  # metadata and end offsets
        self._group: Consumer | None = None  # commits the consumer group's offsets

    @property
    def params(self) -> KafkaIn:
        return self.spec.params

    def capped(self) -> bool:
        return (super().capped() or self.params.max_records_per_partition is not None
                or self.params.max_bytes_per_partition is not None)

    @property
    def group(self) -> str:
        return self.params.group or f"eddyline.{self.name}"

    def status(self) -> dict[str, Any]:
        return self.health.to_json()

    def _settings(self, **extra: Any) -> dict[str, Any]:
        return settings(self.params.brokers, self.params.options, **extra)

    def _consumer(self) -> Consumer:
        from confluent_kafka import Consumer

        if self._driver is None:
            self._driver = Consumer(self._settings(**{
                "group.id": f"{self.group}.planner", "enable.auto.commit": False, "isolation.level": "read_committed",
                "enable.partition.eof": True, "auto.offset.reset": "error", "fetch.wait.max.ms": 100,
            }))
        return self._driver

    def _call(self, action: Any) -> Any:
        """``action(consumer)``, retried while no broker answers for up to the source's patience
        (``wait`` by default), then :class:`SourceUnreachable`."""
        bound = self.params.wait / 1000 if self.patience_s is None else self.patience_s

        def give_up(e: Exception, waited: float) -> Exception:
            return SourceUnreachable(self.name, f"source '{self.name}': Kafka brokers {self.params.brokers} "
                                     f"unreachable for {waited:.0f}s (wait: {format_duration_ms(self.params.wait)}): {e}")

        def attempt() -> Any:
            try:
                return action(self._consumer())
            except KafkaUnreachable:
                self._close_driver()  # a fresh client after an outage: librdkafka's own back-off is long
                raise

        return with_retry(attempt, retryable=(KafkaUnreachable,), bound_s=bound, health=self.health, give_up=give_up)

    def _close_driver(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    def _topics(self, counts: dict[str, int], read: dict[str, int]) -> dict[str, int]:
        """The topics to read and their partition counts, checked against the partitions read so far."""
        p = self.params
        if p.topics is not None:
            missing = [t for t in p.topics if t not in counts]
            if missing:
                raise SourceError(f"source '{self.name}': topic(s) {missing} do not exist at Kafka brokers {p.brokers} "
                                  f"(topics there: {sorted(counts)[:20]})")
            chosen = {t: counts[t] for t in p.topics}
        else:
            assert p.pattern is not None
            chosen = {t: n for t, n in counts.items() if re.fullmatch(p.pattern, t)}
        for key in read:
            topic, part = _split_key(key)
            if topic not in chosen and (p.topics is not None or topic not in counts):
                raise SourceError(f"source '{self.name}': topic {topic}, read up to offset {read[key]} of partition "
                                  f"{part}, no longer exists at Kafka brokers {p.brokers}")
            n = chosen.get(topic, counts.get(topic, 0))
            if part >= n:
                raise SourceError(f"source '{self.name}': topic {topic} has {n} partition(s) now, fewer than before "
                                  f"(partition {part} was read up to offset {read[key]}); a partition count never "
                                  "shrinks in Kafka: was the topic deleted and made again?")
        return chosen

    def available(self, elapsed_s: float) -> int:
        return self.plan(0, elapsed_s)["end"]

    def plan(self, start: int, elapsed_s: float, cursor: str | None = None, cap: int | None = None) -> dict[str, Any]:
        read: dict[str, int] = json.loads(cursor) if cursor else {}

        def look(consumer: Consumer) -> tuple[dict[str, int], dict[tuple[str, int], tuple[int, int]], dict[tuple[str, int], int]]:
            topics = self._topics(partition_counts(consumer), read)
            tps = [(t, p) for t in sorted(topics) for p in range(topics[t])]
            marks = watermarks(consumer, tps)
            begin = {tp: max(marks[tp][1], read.get(_key(*tp), marks[tp][0]), marks[tp][0]) for tp in tps}
            return topics, marks, read_ends(consumer, begin, self.params.wait / 1000)

        _, marks, ends = self._call(look)
        lost = [(tp, read.get(_key(*tp))) for tp in marks if ends[tp] < 0]
        if lost:
            (topic, part), at = lost[0]
            raise SourceError(f"source '{self.name}': topic {topic} partition {part} ends before offset {at}, "
                              "which this source read up to: the broker lost records it had")
        budget = min(self.batch_limit(), cap if cap is not None else 2**62)
        if self.spec.limit is not None:
            budget = min(budget, max(0, self.spec.limit - start))
        lows = {_key(*tp): low for tp, (low, _) in marks.items()}
        by_key = {_key(*tp): end for tp, end in ends.items()}
        fits = None
        if self.params.max_bytes_per_partition is not None and budget > 0:
            per = self.params.max_records_per_partition
            spans = {_split_key(k): (at, min(by_key[k], at + per) if per else by_key[k])
                     for k, at in starts(read, lows).items() if by_key[k] > at}
            fitting = self._call(lambda c: budget_ends(c, spans, self.params.max_bytes_per_partition, self.params.wait / 1000))
            fits = {_key(*tp): end for tp, end in fitting.items()}
        return slice_of(start, read, lows, by_key, budget, self.params.max_records_per_partition, fits)

    def committed(self, end: int, cursor: str | None = None) -> None:
        """Commit the offsets the checkpoint reached for the consumer group (see the module)."""
        if not self.params.commit_offsets or not cursor:
            return
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        offsets = [TopicPartition(*_split_key(k), o) for k, o in sorted(json.loads(cursor).items())]
        try:
            if self._group is None:
                self._group = Consumer(self._settings(**{"group.id": self.group, "enable.auto.commit": False}))
            self._group.commit(offsets=offsets, asynchronous=False)
            if self.health.since is not None:
                self.health.recovered()
        except KafkaException as e:
            self.health.failing(RuntimeError(f"committing group {self.group}'s offsets: {e.args[0]}"))

    def detach(self) -> None:
        self._close_driver()
        if self._group is not None:
            self._group.close()
            self._group = None

    def run_time_key(self, planned: dict[str, Any]) -> Hashable | None:
        offsets = sum(b - a for _, _, a, b in planned.get("ranges", []))
        return self._one_task_key(offsets <= self.min_per_task)

    def frames(
        self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int, count_bad: BadCounter = None,
        columns: frozenset[str] | None = None,
    ) -> Frames:
        p = self.params
        schema = arrow_schema(p.schema_)
        assert schema is not None  # KafkaIn refuses others
        ship = schema.shipped(columns)
        meta = tuple(p.metadata)
        ddl = ", ".join([schema.ddl(ship), *(f"kafka_{m} {METADATA[m][1]}" for m in meta)])
        tasks = self._run_time_tasks(partitions) if planned is None else partitions
        read = functools.partial(read_task, self._reader_settings(), p.codec() or p.format, schema, ship, meta,
                                 EpochSlice(self.name, planned), tasks, self.min_per_task, p.wait / 1000, self.name)
        df = spark.range(0, tasks, 1, tasks).mapInArrow(read, ddl)
        return split_decoded(df, [*ship, *(f"kafka_{m}" for m in meta)], self.name, count_bad)

    def _reader_settings(self) -> dict[str, Any]:
        # a task reads its ranges one after the other; the fetch a range leaves in flight (a long poll
        # of the partition just read) holds back the next range's first fetch for up to
        # fetch.wait.max.ms (librdkafka sends one fetch to a broker at a time): 500 ms by default,
        # paid by every task of every epoch. The task knows its records are there, so it never needs
        # a long poll.
        return self._settings(**{
            "group.id": f"{self.group}.reader", "enable.auto.commit": False, "isolation.level": "read_committed",
            "enable.partition.eof": True, "auto.offset.reset": "error", "fetch.wait.max.ms": 10,
        })

    def arrow_problem(self) -> str | None:
        return None

    def read_arrow(self, planned: dict[str, Any], columns: frozenset[str] | None = None, *,
                   task: int = 0, tasks: int = 1) -> ArrowSlice:
        """Task ``task``'s pieces of the slice's ranges (:func:`pieces`, as a Spark task's),
        read and decoded here."""
        p = self.params
        schema = arrow_schema(p.schema_)
        assert schema is not None
        ship, meta = schema.shipped(columns), tuple(p.metadata)
        read = read_task(self._reader_settings(), p.codec() or p.format, schema, ship, meta, EpochSlice(self.name, planned),
                         tasks, self.min_per_task, p.wait / 1000, self.name,
                         iter([pa.RecordBatch.from_pydict({"task": [task]})]))
        names = [*ship, *(f"kafka_{m}" for m in meta)]
        batches = list(read)
        if not batches:
            return ArrowSlice(pa.schema([*(schema.arrow.field(n) for n in ship),
                                         *(pa.field(f"kafka_{m}", METADATA[m][0]) for m in meta)]).empty_table())
        return arrow_decoded(pa.Table.from_batches(batches), names, self.name)

    def __getstate__(self) -> dict[str, Any]:  # the driver's clients stay in the driver (a lane reads with its own)
        return {**self.__dict__, "_driver": None, "_group": None}


def pieces(ranges: list[list[Any]], tasks: int, min_per_task: int) -> list[list[tuple[str, int, int, int]]]:
    """The slice's ranges cut into pieces of at least ``min_per_task`` offsets (a range into at
    most ``tasks``), dealt to the tasks in turn, largest first: task i reads ``pieces[i]``."""
    cut: list[tuple[str, int, int, int]] = []
    for topic, p, a, b in ranges:
        n = max(1, min(tasks, (b - a) // min_per_task))
        cut += [(topic, p, a + (b - a) * i // n, a + (b - a) * (i + 1) // n) for i in range(n)]
    cut.sort(key=lambda r: (-(r[3] - r[2]), r[0], r[1], r[2]))
    return [cut[i::tasks] for i in range(tasks)]


def read_task(
    conf: dict[str, Any], fmt: Any, schema: TextSchema, ship: tuple[str, ...], meta: tuple[str, ...],
    slice_: EpochSlice, tasks: int, min_per_task: int, wait_s: float, source: str, batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: the records of its pieces of the slice, decoded (see :func:`pieces`)."""
    mine = pieces(slice_.get().get("ranges", []), tasks, min_per_task)
    todo = [piece for batch in batches for i in batch.column(0).to_pylist() for piece in mine[i]]
    if not todo:
        return
    from confluent_kafka import Consumer

    consumer = Consumer(conf)
    try:
        for topic, p, a, b in todo:
            for chunk in _read_range(consumer, topic, p, a, b, wait_s, source, conf["bootstrap.servers"]):
                yield _decoded(fmt, schema, ship, meta, topic, p, chunk)
    finally:
        consumer.close()


def _read_range(
    consumer: Consumer, topic: str, p: int, a: int, b: int, wait_s: float, source: str, brokers: str
) -> Iterator[list[Any]]:
    """The records of offsets [a, b) of one partition, in chunks. Under ``read_committed`` the
    offsets of transaction markers and aborted records never arrive: the range is done once the
    consumer's position has passed ``b - 1``."""
    from confluent_kafka import KafkaError, TopicPartition

    tp = TopicPartition(topic, p, a)
    consumer.assign([tp])
    chunk: list[Any] = []
    nxt = a  # the offset after the last record yielded
    last_progress = time.monotonic()
    done = a >= b
    while not done:
        # librdkafka's consume waits its whole timeout unless the batch fills: ask for no more than
        # the range still holds, so that the last records do not wait
        msgs = consumer.consume(max(1, min(CHUNK - len(chunk), b - position(chunk, nxt))), timeout=0.5)
        for m in msgs:
            err = m.error()
            if err is not None:
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    if m.offset() < b:
                        raise SourceError(f"source '{source}': topic {topic} partition {p} ends at offset {m.offset()}, "
                                          f"before the end of this epoch's range [{a}, {b}): the broker lost records it had")
                    done = True
                    break
                if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    raise SourceError(f"source '{source}': topic {topic} partition {p} no longer holds offsets from {a} "
                                      "(its retention removed them after this epoch was planned)")
                if err.fatal() or not (err.retriable() or unreachable(err)):
                    raise SourceError(f"source '{source}': reading topic {topic} partition {p}: {err}")
                continue
            if m.offset() >= b:
                done = True
                break
            chunk.append(m)
            last_progress = time.monotonic()
            if m.offset() == b - 1:
                done = True
                break
        if not done and not msgs:
            at = consumer.position([TopicPartition(topic, p)])[0].offset
            done = at >= b
            if not done and time.monotonic() - last_progress > max(wait_s, REQUEST_S):
                raise SourceError(f"source '{source}': Kafka brokers {brokers} gave nothing of topic {topic} "
                                  f"partition {p} from offset {at} for {wait_s:.0f}s (range [{a}, {b}))")
        if len(chunk) >= CHUNK or (done and chunk):
            nxt = chunk[-1].offset() + 1
            yield chunk
            chunk = []
    consumer.unassign()


def position(chunk: list[Any], first: int) -> int:
    """The offset after the last record of ``chunk`` (``first`` if it is empty)."""
    return chunk[-1].offset() + 1 if chunk else first


def _decoded(
    fmt: Any, schema: TextSchema, ship: tuple[str, ...], meta: tuple[str, ...], topic: str, p: int, msgs: list[Any]
) -> pa.RecordBatch:
    offsets = [m.offset() for m in msgs]

    def why(offset: int, reason: str) -> str:
        return f"{reason} (topic {topic}, partition {p}, offset {offset})"

    values = [m.value() or b"" for m in msgs]
    if isinstance(fmt, Codec):
        batch, order = decoded_binary(fmt, f"{topic}/{p}", offsets, values, schema, ship, why)
    else:
        batch, order = decoded_rows(fmt, f"{topic}/{p}", offsets, values, schema, ship, why)
    if not meta:
        return batch
    columns = list(batch.columns)
    for name in meta:
        values: list[Any]
        if name == "topic":
            values = [topic] * len(order)
        elif name == "partition":
            values = [p] * len(order)
        elif name == "offset":
            values = [offsets[i] for i in order]
        elif name == "timestamp":
            values = [msgs[i].timestamp()[1] * 1000 if msgs[i].timestamp()[0] else None for i in order]
        elif name == "key":
            values = [msgs[i].key() for i in order]
        else:
            values = [msgs[i].headers() or [] for i in order]
        columns.append(pa.array(values, METADATA[name][0]))
    return pa.RecordBatch.from_arrays(columns, names=[*batch.schema.names, *(f"kafka_{m}" for m in meta)])


@SOURCES.register
class KafkaSourceKind(SourceKind):
    key = "kafka"
    params = KafkaIn
    offsets = "the sum of the partitions' offsets (each partition's own in the plan's ranges)"

    def columns(self, params: Any) -> tuple[str, ...] | None:
        schema = arrow_schema(params.schema_)
        return None if schema is None else (*schema.arrow.names, *(f"kafka_{m}" for m in params.metadata))

    def make(self, spec: SourceSpec) -> KafkaSource:
        return KafkaSource(spec)
