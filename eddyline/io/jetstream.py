"""The ``nats`` source and sink: NATS JetStream streams.

As a source, the offset is the stream sequence: an epoch's slice is a range of sequences, logged
in the plan like any other, so a replay reads the very same messages (a stream keeps them until
its limits remove them). Spark's tasks read the range themselves, split into sub-ranges so every
core reads (each through a short-lived pull consumer), and the records — one JSON
object or CSV line per message, or with ``records: lines`` one per line of a message — are
decoded in Spark like a file's lines; one that does not fit becomes a dead letter whose ``file``
is the stream and ``line`` the message's sequence (its ``raw`` text is the record itself).
Packing records into messages is how a stream carries many small records cheaply: the server
and the clients pay per message, not per byte (docs/perf-notes.md). The progress shows
the lag (last sequence in the stream − the last one read) as ``backlog``. With ``subject`` the
source reads only the matching messages; its offsets still count the stream's sequences.

As a sink, the epoch's rows are published as JSON objects, each with the message id
``network/checkpoint id/sink/epoch/position`` (positions follow the rows' JSON text in byte order, so a replay
of the epoch numbers them the same); with ``records_per_message`` a message holds that many rows,
one per line, and the position numbers messages. The server drops a message whose id it saw within the
stream's de-duplication window, so a replayed epoch's republish adds nothing: exactly once, as
long as the replay comes within the window (``dedup_window``, 2 minutes by default; the sink
creates the stream with it, or widens the window of an existing stream to it).

Taking epochs back. Tentative epochs (Delay-Process-Correct, :mod:`eddyline.ha.dpc`) carry the
headers ``Eddyline-Tentative: true`` and ``Eddyline-Epoch: <epoch>`` besides ``Nats-Msg-Id``; a
stable epoch's messages carry the id alone. Both kinds can be taken back: tentative ones when an
epoch corrects them, any ones when ``eddyline replay`` runs epochs again from an earlier one. A
stream is a log, so taking them back is a message too: :meth:`NatsSink.retract` publishes on the
sink's subject one correction per epoch taken back, with the headers ``Eddyline-Retract:
<epoch>`` and ``Nats-Msg-Id: network/checkpoint id/sink/retract/<epoch>`` (a replayed correction
is dropped like a replayed row; one replayed after the window only repeats what the first said),
and the body ``{"retract_epoch": N, "at_epoch": M, "writer": "network/checkpoint id", "sink":
"<sink>"}``. The epoch ``M`` and those after it publish what replaces the rows taken back. So a
consumer keeps each row under its writer, sink and epoch (its message id up to the position) and,
on a correction, drops the rows of that writer, sink and epoch; one that wants stable results
only also skips the messages marked tentative. Epochs are never numbered twice (the correcting or
replaying epoch comes after the ones it takes back), so new rows never share an id with old ones.
Undoing a replay (``eddyline undo``) takes back what the replay's epochs published, by
corrections again, and puts back what the replay took back: the sink reads its subject back
from the stream (one request per message: an undo is rare, and reads all the sink published
before the replay, holding those rows in memory), finds the epochs the replay's corrections took
back that were live until then, and republishes their rows as rows of the undoing epoch ``U``,
with ids ``network/checkpoint id/sink/U/<epoch>.<position>`` (so a later correction of ``U`` takes
them back too). That needs those messages still in the stream: its limits must keep them.

Fencing. Under a lease (:mod:`eddyline.ha.lease`), every message the sink publishes is
conditional on the stream: it carries ``Nats-Expected-Last-Subject-Sequence: S`` with
``Nats-Expected-Last-Subject-Sequence-Subject: _eddyline.fence.<id>``, where ``S`` is the sequence
of the last fence message this driver published there (``Eddyline-Fence: <generation>``, one when
it opens the sink and one per epoch, each conditional on the one before, so that the fence stays
among the stream's newest messages whatever its limits); ``Eddyline-Generation`` says which
generation wrote a message. A driver that takes the lease over
publishes its own fence message first; from then on the server refuses every message of the
older generation, whose expected sequence is no longer the last. The sink adds the fence subject
to an existing stream that does not take it. A ``nats`` source reading the stream skips the
fence messages; another reader of the whole stream (no subject filter) sees them, as it sees the
corrections: read the sink's subject.

A server that cannot be reached is retried with back-off for up to ``wait``; meanwhile the
progress shows the source's or sink's ``status``; after that the epoch fails with an error that
names the source or sink and the server. A restart then replays it exactly.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

import pyarrow as pa
from pydantic import AfterValidator, Field

from eddyline.api.sinks import SINKS, SinkSpec
from eddyline.api.sources import SOURCES, SourceSpec
from eddyline.api.units import Duration, Model, format_duration_ms
from eddyline.errors import Fenced, SinkError, SourceError, SourceUnreachable
from eddyline.io.natswire import (
    DEDUP_WINDOW_MS,
    EDDYLINE_SUBJECTS,
    NatsConnection,
    NatsError,
    NatsUnreachable,
    ensure_stream,
    redact,
    tls_context,
)
from eddyline.io.records import decode, split_decoded, to_json_column
from eddyline.io.retry import Health, with_retry
from eddyline.io.sinks import Sink, SinkKind
from eddyline.io.sources import (
    ArrowSlice,
    BadCounter,
    EpochSlice,
    Frames,
    Source,
    SourceKind,
    arrow_decoded,
)
from eddyline.io.sparkjson import json_records, records_problem
from eddyline.io.textrecords import (
    TextSchema,
    arrow_schema,
    decoded_batch,
    packed_batches,
    packed_payloads,
    packed_records,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_STREAM = r"^[^\s.*>/\\]+$"
#: a task reads at least this many sequences; fewer make one task (connecting costs ~1 ms)
MIN_PER_TASK = 20_000
#: the same for messages that hold records one per line, each expected to hold many
MIN_PER_TASK_OF_LINES = 200


def _nats_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        raise ValueError(f"expected nats://[user:password@]host[:port] or tls://…[?ca=FILE[&cert=FILE&key=FILE]], "
                         f"got {redact(url)!r}")
    try:
        tls_context(url)  # a bad option or certificate file is refused before anything runs
    except NatsError as e:
        raise ValueError(str(e)) from e
    return url


NatsUrl = Annotated[str, AfterValidator(_nats_url)]


class NatsIn(Model):
    """A JetStream stream to read: JSON (or CSV) records with a declared schema, one per message or
    one per line of a message."""

    url: NatsUrl = "nats://127.0.0.1:4222"
    stream: str = Field(pattern=_STREAM)
    subject: str | None = None  # read only the messages on these subjects (wildcards allowed)
    format: Literal["json", "csv"] = "json"
    schema_: str = Field(alias="schema", min_length=1)
    #: ``message``: a message is one record; ``lines``: a message holds records one per line (as
    #: ``eddyline produce --records-per-message`` writes them). Offsets still count messages,
    #: so ``max_rows_per_epoch`` bounds an epoch's messages.
    records: Literal["message", "lines"] = "message"
    wait: Duration = Field(default=30_000, gt=0)  # how long to retry an unreachable server


class NatsOut(Model):
    """A JetStream stream to write: each row a JSON object published on ``subject``."""

    url: NatsUrl = "nats://127.0.0.1:4222"
    stream: str = Field(pattern=_STREAM)
    subject: str = Field(min_length=1)
    #: rows a message, one JSON object a line (the last message of an epoch may hold fewer)
    records_per_message: int = Field(default=1, ge=1)
    dedup_window: Duration = Field(default=DEDUP_WINDOW_MS, gt=0)
    wait: Duration = Field(default=30_000, gt=0)


class _Server:
    """The driver's connection to one server, made again when it is lost."""

    def __init__(self, url: str, wait_ms: int, what: str, error: type[Exception]):
        self.url, self.wait_s, self.what, self.error = url, wait_ms / 1000, what, error
        self.health = Health()
        self._conn: NatsConnection | None = None

    def call(self, action: Any, bound_s: float | None = None, unreachable: Callable[[str], Exception] | None = None) -> Any:
        """``action(connection)``, retried while the server cannot be reached for up to
        ``bound_s`` (default: the configured ``wait``); then the error ``unreachable(message)``
        if given, else the server's error kind."""
        def attempt() -> Any:
            if self._conn is None:
                self._conn = NatsConnection(self.url)
            try:
                return action(self._conn)
            except NatsUnreachable:
                self._conn.close()
                self._conn = None
                raise

        def give_up(e: Exception, waited: float) -> Exception:
            message = (f"{self.what}: NATS server {redact(self.url)} unreachable for {waited:.0f}s "
                       f"(wait: {format_duration_ms(int(self.wait_s * 1000))}): {e}")
            return unreachable(message) if unreachable is not None else self.error(message)

        try:  # an unreachable server ends in give_up's error; any other refusal at once
            return with_retry(attempt, retryable=(NatsUnreachable,), bound_s=self.wait_s if bound_s is None else bound_s,
                              health=self.health, give_up=give_up)
        except NatsError as e:
            raise self.error(f"{self.what}: {e}") from e


class MessageRanges(Source):
    """A source whose offsets number messages (1, 2, 3, ...), one record each, that Spark's tasks
    fetch themselves: an epoch's slice is split into sub-ranges, one per task (at least
    :attr:`min_per_task` records each), decoded like files. A subclass says how a task fetches
    a sub-range (:meth:`_fetcher`) and what names the messages' origin in dead letters."""

    #: a task reads at least this many messages; fewer make one task (tests lower it)
    min_per_task = MIN_PER_TASK
    #: a message holds records one per line
    lines_per_message = False

    def _fetcher(self, ranges: SubRanges) -> Any:
        """In a task, ``fetch(batches)``: the records of the sub-ranges whose numbers arrive in
        ``batches`` (see :class:`SubRanges`), as chunks of (numbers, payloads)."""
        raise NotImplementedError

    def run_time_key(self, planned: dict[str, Any]) -> Hashable | None:
        # a slice that one task reads whole gets a frame of one task
        return self._one_task_key(planned["end"] - planned["start"] <= self.min_per_task)

    @property
    def origin(self) -> str:
        """What dead letters name as the ``file`` of a record (a stream, a subject)."""
        raise NotImplementedError

    def _read(
        self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int, reader: Any, ddl: str
    ) -> DataFrame | None:
        """``reader`` run over the slice's sub-ranges, one per task; None for an empty slice.
        ``planned`` None: the tasks take the slice when they run; a task per partition, or one
        where :meth:`run_time_key` last found the slice small enough for one."""
        if planned is None:
            partitions = self._run_time_tasks(partitions)
            ranges = SubRanges(EpochSlice(self.name), partitions, self.min_per_task)
        else:
            ranges = SubRanges(EpochSlice(self.name, planned), partitions, self.min_per_task)
            if planned["end"] <= planned["start"]:
                return None
        tasks = partitions if planned is None else len(ranges.bounds()) - 1
        fetch = functools.partial(reader, self._fetcher(ranges), self.origin, self.lines_per_message)
        return spark.range(0, tasks, 1, tasks).mapInArrow(fetch, ddl)

    def lines(self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int) -> DataFrame:
        """The slice's messages as ``(file, line, raw)``: origin, number, payload."""
        df = self._read(spark, planned, partitions, raw_batches, "file string, line long, raw binary")
        if df is None:
            return spark.createDataFrame([], "file string, line long, raw string")
        return df.selectExpr("file", "line", "CAST(raw AS STRING) AS raw")

    def frames(
        self, spark: SparkSession, planned: dict[str, Any] | None, partitions: int, count_bad: BadCounter = None,
        columns: frozenset[str] | None = None,
    ) -> Frames:
        p = self.spec.params
        schema = arrow_schema(p.schema_)
        if schema is None:  # a schema Arrow's readers do not take: parsed in the JVM
            return decode(spark, self.lines(spark, planned, partitions), p.format, p.schema_, self.name, count_bad)
        ship = schema.shipped(columns)
        ddl = schema.ddl(ship)
        df = self._read(spark, planned, partitions, functools.partial(text_batches, p.format, schema, ship), ddl)
        if df is None:
            df = spark.createDataFrame([], ddl)
        return split_decoded(df, list(ship), self.name, count_bad)

    def arrow_problem(self) -> str | None:
        if arrow_schema(self.spec.params.schema_) is None:
            return f"schema {self.spec.params.schema_!r} has a type only Spark parses"
        return None

    def read_arrow(self, planned: dict[str, Any], columns: frozenset[str] | None = None, *,
                   task: int = 0, tasks: int = 1) -> ArrowSlice:
        """Task ``task``'s sub-range of the slice (:class:`SubRanges`, as a Spark task's),
        fetched and decoded here (a resident lane's own read)."""
        p = self.spec.params
        schema = arrow_schema(p.schema_)
        assert schema is not None
        ship = schema.shipped(columns)
        ranges = SubRanges(EpochSlice(self.name, planned), tasks, self.min_per_task)
        batches = []
        if planned["end"] > planned["start"]:
            mine = iter([pa.RecordBatch.from_pydict({"task": [task]})])
            batches = list(text_batches(p.format, schema, ship, self._fetcher(ranges), self.origin,
                                        self.lines_per_message, mine))
        if not batches:
            return ArrowSlice(pa.schema([schema.arrow.field(n) for n in ship]).empty_table())
        return arrow_decoded(pa.Table.from_batches(batches), list(ship), self.name)


class NatsSource(MessageRanges):
    def __init__(self, spec: SourceSpec):
        super().__init__(spec)
        p: NatsIn = spec.params
        self.server = _Server(p.url, p.wait, f"source '{spec.name}'", SourceError)
        self._first_seq = 0  # the stream's first sequence held, as the last look found it
        if p.records == "lines":
            self.lines_per_message, self.min_per_task = True, MIN_PER_TASK_OF_LINES

    @property
    def params(self) -> NatsIn:
        return self.spec.params

    def status(self) -> dict[str, Any]:
        return self.server.health.to_json()

    def available(self, elapsed_s: float) -> int:
        info = self.server.call(lambda c: c.stream_info(self.params.stream), self.patience_s,
                                lambda message: SourceUnreachable(self.name, message))
        self._first_seq = int(info["state"].get("first_seq") or 0)
        return int(info["state"]["last_seq"])

    def plan(self, start: int, elapsed_s: float, cursor: str | None = None, cap: int | None = None) -> dict[str, Any]:
        """Also ``discarded``: how many of the slice's sequences the stream no longer holds (its
        limits — max messages, bytes or age — or its retention dropped them before they were
        read). They cannot be read by anyone: said in the plan and the progress, never passed
        over in silence. With a subject filter some of them may have been other subjects'."""
        self._first_seq = 0
        planned = super().plan(start, elapsed_s, cursor, cap)
        gone = min(self._first_seq - 1, planned["end"]) - start
        return {**planned, "discarded": gone} if gone > 0 else planned

    @property
    def origin(self) -> str:
        return self.params.stream

    def __getstate__(self) -> dict[str, Any]:  # the driver's connection stays in the driver (a lane reads with its own)
        return {**self.__dict__, "server": None}

    def _fetcher(self, ranges: SubRanges) -> Any:
        p = self.params
        return functools.partial(fetch_ranges, p.url, p.stream, p.subject, ranges, p.wait / 1000, self.name)


@dataclass(frozen=True)
class SubRanges:
    """How the tasks split a slice of message numbers: into at most ``tasks`` sub-ranges of at
    least ``min_per_task`` messages, sub-range i [bounds[i], bounds[i+1]) for task i (a task
    past the last reads nothing). Worked out where the slice is known: in the driver for a
    frame built for one epoch, in the task for one that runs every epoch."""

    slice: EpochSlice
    tasks: int
    min_per_task: int

    def bounds(self) -> list[int]:
        planned = self.slice.get()
        lo, hi = planned["start"] + 1, planned["end"] + 1  # offset n = message n read
        n = max(1, min(self.tasks, -(-(hi - lo) // self.min_per_task))) if hi > lo else 1
        return [lo + max(0, hi - lo) * i // n for i in range(n + 1)]

    def of_tasks(self, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, int]]:
        """In a task: the sub-ranges (first, end) of the task numbers arriving in ``batches``."""
        bounds = self.bounds()
        for batch in batches:
            for i in batch.column(0).to_pylist():
                if i + 1 < len(bounds) and bounds[i] < bounds[i + 1]:
                    yield bounds[i], bounds[i + 1]


def raw_batches(
    fetch: Any, stream: str, packed: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: the messages as (stream, sequence, payload); ``packed``: their records,
    one per line, as (stream, the message's sequence, record)."""
    for seqs, payloads in fetch(batches):
        if packed:
            seqs, payloads = packed_records(seqs, payloads)
        if seqs:
            yield pa.RecordBatch.from_arrays(
                [pa.array([stream] * len(seqs), pa.string()), pa.array(seqs, pa.int64()), pa.array(payloads, pa.binary())],
                names=["file", "line", "raw"],
            )


def text_batches(
    fmt: Any, schema: TextSchema, ship: tuple[str, ...], fetch: Any, stream: str, packed: bool,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: the messages decoded as JSON or CSV records (see :func:`decoded_batch`);
    ``packed``: messages of records one per line (see :func:`packed_batches`)."""
    for seqs, payloads in fetch(batches):
        if packed:
            yield from packed_batches(fmt, stream, seqs, payloads, schema, ship)
        else:
            yield decoded_batch(fmt, stream, seqs, payloads, schema, ship)


def fetch_ranges(
    url: str, stream: str, subject: str | None, ranges: SubRanges, wait_s: float, source: str,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[tuple[list[int], list[bytes]]]:
    """In a Spark task: the messages of the sub-ranges whose numbers arrive in ``batches``, as
    chunks of (sequences, payloads). A lost connection is made again and the read resumes after
    the last sequence received, for up to ``wait_s``."""
    conn: NatsConnection | None = None
    for seq, end in ranges.of_tasks(batches):
        t_lost: float | None = None
        while seq < end:
            try:
                if conn is None:
                    conn = NatsConnection(url)
                for seqs, payloads in conn.read_range(stream, seq, end, subject):
                    t_lost = None
                    yield seqs, payloads
                    seq = seqs[-1] + 1
                break
            except NatsUnreachable as e:
                if conn is not None:
                    conn.close()
                conn = None
                t_lost = t_lost or time.monotonic()
                if time.monotonic() - t_lost > wait_s:
                    raise SourceError(f"source '{source}': NATS server {redact(url)} unreachable: {e}") from e
                time.sleep(0.2)
    if conn is not None:
        conn.close()


#: the subjects of the fence messages (see the module's docstring; under EDDYLINE_SUBJECTS)
FENCE_SUBJECTS = EDDYLINE_SUBJECTS.decode() + "fence."


class NatsSink(Sink):
    counts_itself = True
    rewinds = True  # by corrections; an undo republishes what they took back, read from the stream
    #: the sequence of this driver's last fence message (None: not fenced, no lease)
    _fence_seq: int | None = None
    _opened = False

    def __init__(self, spec: SinkSpec):
        super().__init__(spec)
        p: NatsOut = spec.params
        self.server = _Server(p.url, p.wait, f"sink '{spec.name}'", SinkError)
        self.writer = ""  # network/checkpoint id: the start of this run's message ids
        #: the rows :meth:`restore` put back, for the next :meth:`publish` (the undoing epoch's):
        #: (message id's last part, payload)
        self._restored: list[tuple[str, bytes]] = []

    def status(self) -> dict[str, Any]:
        return self.server.health.to_json()

    def open(self, network: str, checkpoint: str, schema: StructType, tentative: bool = False) -> None:
        p: NatsOut = self.spec.params
        self.writer = f"{network}/{checkpoint}"
        self._opened = True
        fence = [self._fence_subject] if self.generation else None
        self.server.call(lambda c: ensure_stream(c, p.stream, [p.subject], p.dedup_window, also=fence))
        self._fence_seq = None
        if self.generation:
            self._fence()

    def fence(self, generation: int) -> None:
        renewed = generation != self.generation
        super().fence(generation)
        # opened already: a driver that took the lease over (``writer`` alone does not say: the
        # runtime names a hot pair's drivers by it before any sink is opened)
        if renewed and self._opened and generation:
            self._fence()

    @property
    def _fence_subject(self) -> str:
        import hashlib

        # a subject belongs to one stream only: the stream is part of it
        key = f"{self.spec.params.stream}/{self.writer}/{self.name}"
        return FENCE_SUBJECTS + hashlib.sha1(key.encode()).hexdigest()[:16]

    def _fenced(self, newer: int) -> Fenced:
        return Fenced(f"sink '{self.name}': lease generation {self.generation} was taken over by generation "
                      f"{newer}: NATS stream {self.spec.params.stream} refuses its writes; stopping without "
                      "writing anything more")

    def _fence(self, conn: NatsConnection | None = None) -> None:
        """Make this generation the one the stream takes messages from: publish a fence
        message, conditional on the last one (a newer generation's: :class:`Fenced`; this
        generation's, the other driver of a hot pair's: taken as it is)."""
        p: NatsOut = self.spec.params
        subject = self._fence_subject

        def attempt(c: NatsConnection) -> None:
            while True:
                last = c.last_on(p.stream, subject)
                seq, newest = (last[0], int(last[1].get("Eddyline-Fence", 0))) if last else (0, 0)
                if newest > self.generation:
                    raise self._fenced(newest)
                if newest == self.generation:
                    self._fence_seq = seq
                    return
                try:
                    self._fence_seq = c.publish_one(subject, b"", self._fence_headers(seq))
                    return
                except NatsError as e:
                    if "wrong last sequence" not in str(e):
                        raise
                    # another fence came in between: look again

        if conn is not None:
            attempt(conn)
        else:
            self.server.call(attempt)

    def _fence_headers(self, expected: int) -> bytes:
        return b"Eddyline-Fence: %d\r\nNats-Expected-Last-Subject-Sequence: %d\r\n" % (self.generation, expected)

    def _conditional(self) -> bytes:
        """The headers that make a message conditional on this driver's fence (none: no lease)."""
        if self._fence_seq is None:
            return b""
        return (b"Eddyline-Generation: %d\r\n" % self.generation
                + b"Nats-Expected-Last-Subject-Sequence: %d\r\nNats-Expected-Last-Subject-Sequence-Subject: %s\r\n"
                % (self._fence_seq, self._fence_subject.encode()))

    def _publish_fenced(self, conn: NatsConnection, messages: list[tuple[str, str | None, bytes]], headers: bytes) -> None:
        """``messages``, each conditional on this driver's fence. The server refuses them once a
        newer generation fenced (:class:`Fenced`); when only this generation's own fence moved on
        (the other driver of a hot pair refreshed it) they are sent again (their ids dedupe)."""
        for _ in range(3):
            try:
                conn.publish(messages, headers=headers + self._conditional())
                return
            except NatsError as e:
                if self._fence_seq is None or "wrong last sequence" not in str(e):
                    raise
                self._fence(conn)  # Fenced if a newer generation took over
        raise SinkError(f"sink '{self.name}': the fence of stream {self.spec.params.stream} kept moving")

    def _refresh_fence(self, conn: NatsConnection) -> None:
        """Publish this epoch's fence message, conditional on the last one: it keeps the fence
        among the stream's newest messages, out of reach of its limits."""
        if self._fence_seq is None:
            return
        try:
            self._fence_seq = conn.publish_one(self._fence_subject, b"", self._fence_headers(self._fence_seq))
        except NatsError as e:
            if "wrong last sequence" not in str(e):
                raise
            self._fence(conn)

    def stage(self, df: DataFrame, epoch: int) -> None:
        rows = to_json_column(df).toArrow()
        self.collected[epoch] = pa.table({"v": pa.array(sorted(rows.column(0).to_pylist()), pa.string())})

    takes_arrow = True

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        """A resident epoch's rows: the same records as :meth:`stage` makes in Spark."""
        self.collected[epoch] = pa.table({"v": pa.array(sorted(json_records(table)), pa.string())})

    def arrow_problem(self, schema: pa.Schema) -> str | None:
        return records_problem(schema)

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        staged, restored, self._restored = self.collected.get(epoch), self._restored, []
        if staged is None and not restored:
            return
        p: NatsOut = self.spec.params
        subject, per = p.subject, p.records_per_message
        prefix = f"{self.writer}/{self.name}/{epoch}/"
        rows = staged.column(0).to_pylist() if staged is not None else []
        messages = [(subject, f"{prefix}{pos}", payload) for pos, payload in restored]
        messages += [(subject, f"{prefix}{n}", payload) for n, payload in enumerate(packed_payloads(rows, per))]
        headers = b"Eddyline-Tentative: true\r\nEddyline-Epoch: %d\r\n" % epoch if tentative else b""
        half = len(messages) // 2  # two calls, so that a crash test can cut between them

        def first(c: NatsConnection) -> None:
            self._refresh_fence(c)
            self._publish_fenced(c, messages[:half], headers)

        self.server.call(first)
        midway()
        self.server.call(lambda c: self._publish_fenced(c, messages[half:], headers))
        self.collected.pop(epoch, None)

    def restore(self, at_epoch: int) -> None:
        """Put back what ``at_epoch`` took back, as rows of the epoch :meth:`publish` publishes
        next, the undoing one (see the module's docstring). Idempotent: a replay of the undoing
        epoch reads the same and publishes the same ids, which the server drops."""
        if not self.writer:
            raise SinkError(f"sink '{self.name}': asked to put back epoch {at_epoch}'s take-back before it was opened")
        p: NatsOut = self.spec.params
        mine = f"{self.writer}/{self.name}/"
        taken: dict[int, set[int]] = {}  # correcting epoch -> the epochs it took back
        rows: dict[int, list[tuple[str, bytes]]] = {}  # epoch -> its rows, before at_epoch
        for headers, payload in self.server.call(lambda c: list(c.messages_on(p.stream, p.subject))):
            if "Eddyline-Retract" in headers:
                body = json.loads(payload)
                if body.get("writer") == self.writer and body.get("sink") == self.name:
                    taken.setdefault(int(body["at_epoch"]), set()).add(int(body["retract_epoch"]))
                continue
            msg_id = headers.get("Nats-Msg-Id", "")
            if msg_id.startswith(mine):
                epoch, _, pos = msg_id[len(mine):].partition("/")
                if epoch.isdigit() and int(epoch) < at_epoch:
                    rows.setdefault(int(epoch), []).append((pos, payload))
        earlier = set().union(*(e for at, e in taken.items() if at < at_epoch))
        back = sorted(taken.get(at_epoch, set()) - earlier)
        self._restored += [(f"{e}.{pos}", payload) for e in back for pos, payload in rows.get(e, [])]

    def retract(self, epochs: list[int], at_epoch: int) -> None:
        """One correction per epoch taken back (see the module's docstring); a replay of the
        epoch publishes the same ids again, which the server drops."""
        if not epochs:
            return
        if not self.writer:
            raise SinkError(f"sink '{self.name}': asked to retract epochs {sorted(epochs)} before it was opened")
        subject = self.spec.params.subject
        corrections = [
            (
                [(subject, f"{self.writer}/{self.name}/retract/{epoch}", json.dumps(
                    {"retract_epoch": epoch, "at_epoch": at_epoch, "writer": self.writer, "sink": self.name}
                ).encode())],
                b"Eddyline-Retract: %d\r\n" % epoch,
            )
            for epoch in sorted(set(epochs))
        ]

        def send(conn: NatsConnection) -> None:  # all again after a lost connection: ids dedupe
            for message, headers in corrections:
                self._publish_fenced(conn, message, headers)

        self.server.call(send)


@SOURCES.register
class NatsSourceKind(SourceKind):
    key = "nats"
    params = NatsIn
    offsets = "stream sequences"

    def make(self, spec: SourceSpec) -> NatsSource:
        return NatsSource(spec)


@SINKS.register
class NatsSinkKind(SinkKind):
    key = "nats"
    params = NatsOut
    live_params = ("url", "stream", "subject")

    def describe(self, params: Any) -> str:
        return f"NATS stream {params.stream} at {redact(params.url)}, subject {params.subject} (JSON)"

    def make(self, spec: SinkSpec, console: Any = None) -> NatsSink:
        return NatsSink(spec)
