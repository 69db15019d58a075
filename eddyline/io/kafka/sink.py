"""The ``kafka`` sink: each epoch's rows in one Kafka transaction, exactly once.

The rows are collected in the driver (as the ``nats`` sink does) and produced as JSON objects,
revisions' ``_op``/``_diff`` among their fields, keyed by the ``key`` columns (one column: its
value as text; several: a JSON array of them; none: no key), so that the producer's partitioner
puts equal keys in one partition (``murmur2_random``, the Java client's); the headers
``eddyline-epoch`` and ``eddyline-writer`` say which epoch of which network wrote a record.

Exactly once. :meth:`KafkaSink.publish` runs one transaction per epoch: the rows, then the epoch
number as the committed offset of a consumer group of the sink's own (``eddyline.sink.<network>.
<checkpoint>.<sink>.epochs``, on partition 0 of the topic; ``send_offsets_to_transaction``) and
the lease generation as the offset of another (``... .generation``), then the commit. (Not in the
offset's metadata: Tansu 0.6.0 drops the metadata of committed offsets.) A reader with ``isolation.level=read_committed``
sees the records and the group sees the epoch at once, or neither. A driver killed after the
transaction committed but before the checkpoint did replays the epoch: publish finds the epoch in
the group's offset and writes nothing. One killed in the middle left a transaction open, which
the broker aborts when the next producer of the same transactional id starts (or after
``transaction.timeout.ms``); meanwhile ``read_committed`` readers wait at it.

One transaction an epoch, from the driver, not one a lane from the lanes' tasks: Kafka commits
the transactions of several transactional ids one by one, never together, nor together with
the checkpoint, so per-lane transactions would show readers epochs in part, and would write
each row once only with a marker per lane, every lane id of every older generation and lane
count fenced, and replays that give each lane the very rows it had (docs/io.md, "One
transaction an epoch, not one a lane"). The cost is every output row through the driver
(docs/perf-notes.md).

Fencing. The transactional id is ``eddyline.<network>.<checkpoint>.<sink>.g<generation>``: it
depends on the lease generation, so that only the newer generation can fence the older and not
the other way round. (With one id for every generation, a zombie driver that opened its
producer again would fence the driver that holds the lease.) Opening under generation G, the
sink starts its producer, then starts the producers of the generations since the one the
group records (which bumps their epochs: the broker aborts their open transactions and refuses
everything more from them), records G in a transaction of its own, and
fences those generations once more (one that started its producer meanwhile). A zombie that opens
finds a newer generation recorded and stops; one that was open already is refused
by the broker (``PRODUCER_FENCED``): :class:`~eddyline.errors.Fenced` either way.

A hot pair. Its two drivers write under one generation and share the id (the sink knows the
pair by the group's id, as every sink does), so each takes the id over with a fresh producer
before an epoch's transaction (which fences the other's producer and aborts the other's open
transaction), then looks whether the epoch is in the sink's group already (the other committed it:
nothing to do). One whose transaction the other took over looks again, after a pause, and takes it
back if the epoch is still not there.

Brokers without abort filtering. Tansu 0.6.0 keeps the records of aborted transactions visible
to ``read_committed`` readers (its Fetch responses list no aborted transactions), so on it a
transaction cut in the middle by a crash or a fence leaves its records behind; on Apache Kafka
they are never seen. The header ``eddyline-attempt`` (random, one per transaction) lets a reader
there keep, of each writer's epoch, the records of its last attempt only: an earlier attempt at
an epoch was aborted, since one that committed is never tried again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import Field, field_validator

from eddyline.api.sinks import SINKS, SinkSpec
from eddyline.api.units import Duration, Model
from eddyline.errors import Fenced, SinkError
from eddyline.io.kafka.client import REQUEST_S, settings, unreachable
from eddyline.io.records import to_json_column
from eddyline.io.retry import Health
from eddyline.io.sinks import Sink, SinkKind
from eddyline.io.sparkjson import json_records, key_texts, records_problem

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

#: how many generations before its own a sink fences when it opens, at most (generations that
#: never wrote anything are cheap to fence, but a long gap would be a long start)
FENCE_BACK = 16


class KafkaOut(Model):
    """A Kafka topic to write: each row a JSON object, one epoch a transaction."""

    brokers: str = Field(default="127.0.0.1:9092", min_length=1)
    topic: str
    key: list[str] = []  # the columns that make a record's key (and so its partition)
    partitions: int = Field(default=1, gt=0)  # for a topic the sink creates
    wait: Duration = Field(default=30_000, gt=0)  # how long a transaction may wait for the brokers
    options: dict[str, str] = {}  # librdkafka settings (security.protocol, sasl.*, ...)

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str) -> str:
        if not re.match(r"^[A-Za-z0-9._-]{1,249}$", topic):
            raise ValueError(f"expected a Kafka topic name (1-249 letters, digits, '.', '_', '-'), got {topic!r}")
        return topic


class KafkaSink(Sink):
    counts_itself = True

    def __init__(self, spec: SinkSpec):
        super().__init__(spec)
        self.health = Health()
        self.writer = ""
        self._producer: Producer | None = None
        #: the driver's name in a hot pair (the runtime sets ``writer`` to it before opening), or ""
        self._pair: str | None = None
        self._group: dict[str, Consumer] = {}  # the consumers of the sink's two groups

    @property
    def params(self) -> KafkaOut:
        return self.spec.params

    def status(self) -> dict[str, Any]:
        return self.health.to_json()

    def _settings(self, **extra: Any) -> dict[str, Any]:
        return settings(self.params.brokers, self.params.options, **extra)

    def group_id(self, what: str) -> str:
        """The consumer group whose offset on partition 0 of the topic records ``what``
        (``epochs``: the last epoch committed; ``generation``: the newest lease generation)."""
        return f"eddyline.sink.{self.writer.replace('/', '.')}.{self.name}.{what}"

    def transactional_id(self, generation: int) -> str:
        """The id of generation ``generation``'s producer (see the module: it must depend on the generation)."""
        return f"eddyline.{self.writer.replace('/', '.')}.{self.name}.g{generation}"

    # ------------------------------------------------------------------ opening and fencing
    def open(self, network: str, checkpoint: str, schema: StructType, tentative: bool = False) -> None:
        if tentative:
            raise SinkError(f"sink '{self.name}': a kafka sink cannot take back tentative epochs (max_delay): "
                            "what a transaction committed stays in the topic")
        missing = [k for k in self.params.key if k not in schema.fieldNames()]
        if missing:
            raise SinkError(f"sink '{self.name}': key: no column(s) {missing} in its input (columns: {schema.fieldNames()})")
        self.close()  # opened again: the clients start anew
        if self._pair is None:
            self._pair = self.writer
        self.writer = f"{network}/{checkpoint}"
        self._ensure_topic()
        self._start()

    def close(self) -> None:
        """Let go of the producer and the groups' consumers (the runtime calls it when a live
        change moves the sink to another target)."""
        self._close()
        for consumer in self._group.values():
            consumer.close()
        self._group.clear()

    def fence(self, generation: int) -> None:
        renewed = generation != self.generation
        super().fence(generation)
        if renewed and self._producer is not None:  # took a lease over while open: a producer of the new id
            self._close()
            self._start()

    def _ensure_topic(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        p = self.params
        admin = AdminClient(self._settings())
        try:
            md = admin.list_topics(timeout=p.wait / 1000)
        except KafkaException as e:
            raise SinkError(f"sink '{self.name}': Kafka brokers {p.brokers} unreachable: {e.args[0]}") from e
        if p.topic in md.topics and md.topics[p.topic].error is None:
            return
        try:
            for future in admin.create_topics([NewTopic(p.topic, p.partitions)], request_timeout=REQUEST_S).values():
                future.result()
        except KafkaException as e:
            if e.args[0].code() != e.args[0].TOPIC_ALREADY_EXISTS:
                raise SinkError(f"sink '{self.name}': cannot create topic {p.topic} ({p.partitions} partition(s)) "
                                f"at Kafka brokers {p.brokers}: {e.args[0]}") from e

    def _marker(self) -> tuple[int, int]:
        """(the last epoch the sink's transactions committed, the newest generation recorded),
        read from the sink's consumer groups; 0 before any."""
        from confluent_kafka import KafkaException, TopicPartition

        out = []
        for what in ("epochs", "generation"):
            try:
                [tp] = self._groups(what).committed([TopicPartition(self.params.topic, 0)], timeout=self.params.wait / 1000)
            except KafkaException as e:
                raise SinkError(f"sink '{self.name}': reading consumer group {self.group_id(what)}'s offset: "
                                f"{e.args[0]}") from e
            out.append(max(tp.offset, 0))
        return out[0], out[1]

    def _groups(self, what: str) -> Consumer:
        from confluent_kafka import Consumer

        if what not in self._group:
            self._group[what] = Consumer(self._settings(**{"group.id": self.group_id(what), "enable.auto.commit": False}))
        return self._group[what]

    def _fenced(self, newer: int | None = None) -> Fenced:
        by = f"generation {newer}" if newer else "a newer generation"
        return Fenced(f"sink '{self.name}': lease generation {self.generation} was taken over by {by}: Kafka refuses "
                      f"the transactions of producer {self.transactional_id(self.generation)}; stopping without "
                      "writing anything more")

    def _start(self) -> None:
        """Start this generation's producer and fence the older ones (see the module)."""
        self._producer = self._new_producer(time.monotonic() + self.params.wait / 1000)
        _, recorded = self._marker()
        if recorded > self.generation:
            self._close()
            raise self._fenced(recorded)
        if self.generation:
            older = range(max(recorded, self.generation - FENCE_BACK, 0), self.generation)
            self._fence_older(older)
            for _ in range(PAIR_TRIES):
                try:
                    epoch, _ = self._marker()
                    self._transaction(lambda: None, epoch, again=True)  # records this generation
                    break
                except _PartnerClaimed:  # the other driver of a hot pair took the id: take it back
                    time.sleep(random.uniform(0.2, 1.0))
                    self._producer = self._new_producer(time.monotonic() + self.params.wait / 1000)
            self._fence_older(older)

    def _new_producer(self, deadline: float) -> Producer:
        """This generation's transactional producer, started (which aborts a transaction an earlier
        producer of the id left open, and fences that producer)."""
        from confluent_kafka import KafkaException, Producer

        producer = Producer(self._settings(**{
            "transactional.id": self.transactional_id(self.generation), "enable.idempotence": True,
            "partitioner": "murmur2_random", "transaction.timeout.ms": max(60_000, self.params.wait * 2),
            "linger.ms": 5,
        }))
        try:
            self._patiently(producer.init_transactions, deadline)
        except (KafkaException, _Stuck) as e:
            raise SinkError(f"sink '{self.name}': starting transactional producer "
                            f"{self.transactional_id(self.generation)} at {self.params.brokers}: {e}") from e
        return producer

    def _fence_older(self, generations: range) -> None:
        """Start a producer of each of ``generations``' ids and close it: the broker bumps the
        id's epoch, aborting its open transaction and refusing its older producer from then on."""
        from confluent_kafka import KafkaException, Producer

        for g in generations:
            old = Producer(self._settings(**{"transactional.id": self.transactional_id(g)}))
            try:
                old.init_transactions(self.params.wait / 1000)
            except KafkaException as e:
                raise SinkError(f"sink '{self.name}': fencing producer {self.transactional_id(g)}: {e.args[0]}") from e
            finally:
                old.flush(0)

    def _close(self) -> None:
        if self._producer is not None:
            self._producer.flush(0)
            self._producer = None

    # ------------------------------------------------------------------ writing
    def stage(self, df: DataFrame, epoch: int) -> None:
        keys = self.params.key
        if not keys:
            key = "CAST(NULL AS STRING) AS k"
        elif len(keys) == 1:
            key = f"CAST(`{keys[0]}` AS STRING) AS k"
        else:
            key = f"to_json(array({', '.join(f'`{k}`' for k in keys)})) AS k"
        table = to_json_column(df, also=(key,)).toArrow()
        self._collect(epoch, table.column("k").to_pylist(), table.column("v").to_pylist())

    takes_arrow = True

    def stage_table(self, table: pa.Table, epoch: int) -> None:
        """A resident epoch's rows: the same records as :meth:`stage` makes in Spark."""
        self._collect(epoch, key_texts(table, list(self.params.key or [])), json_records(table))

    def arrow_problem(self, schema: pa.Schema) -> str | None:
        return records_problem(schema, list(self.params.key or []))

    def _collect(self, epoch: int, keys: list[str | None], values: list[str]) -> None:
        pairs = sorted(zip(keys, values, strict=True),
                       key=lambda kv: (kv[0] or "", kv[1]))  # a replay produces the same records in the same order
        self.collected[epoch] = pa.table({"k": pa.array([k for k, _ in pairs], pa.string()),
                                          "v": pa.array([v for _, v in pairs], pa.string())})

    def publish(self, epoch: int, midway: Callable[[], None] = lambda: None, tentative: bool = False) -> None:
        staged = self.collected.get(epoch)
        if staged is None:
            return
        rows = list(zip(staged.column("k").to_pylist(), staged.column("v").to_pylist(), strict=True))
        topic = self.params.topic

        def produce(part: list[tuple[str | None, str]], headers: list[tuple[str, bytes]]) -> None:
            assert self._producer is not None
            for key, value in part:
                self._producer.produce(topic, value.encode(), None if key is None else key.encode(), headers=headers)
                self._producer.poll(0)

        half = len(rows) // 2  # two steps, so that a crash test can cut the transaction between them

        def body() -> None:
            # a new attempt each try: it tells two tries at one epoch apart where a broker hands
            # aborted records to read_committed readers (see the module)
            headers = [("eddyline-epoch", str(epoch).encode()), ("eddyline-writer", self.writer.encode()),
                       ("eddyline-attempt", os.urandom(6).hex().encode())]
            produce(rows[:half], headers)
            assert self._producer is not None
            self._producer.flush(self.params.wait / 1000)
            midway()
            produce(rows[half:], headers)

        for tries in range(PAIR_TRIES):
            if self._done(epoch):
                break
            try:
                self._transaction(body, epoch)
                break
            except _PartnerClaimed:  # the other driver of a hot pair is publishing: it may finish
                if tries == PAIR_TRIES - 1:
                    raise SinkError(f"sink '{self.name}': the two drivers of the hot pair kept taking epoch {epoch}'s "
                                    "transaction from each other") from None
                time.sleep(random.uniform(0.2, 1.0))
        self.collected.pop(epoch, None)

    def _done(self, epoch: int) -> bool:
        """Whether ``epoch``'s transaction committed already (before a crash kept it from the
        checkpoint, or by the other driver of a hot pair); :class:`Fenced` for a newer generation.
        A driver of a hot pair first takes the transactional id over with a fresh producer (the
        two share it: see the module)."""
        if self._pair:
            self._close()
            self._producer = self._new_producer(time.monotonic() + self.params.wait / 1000)
        done, recorded = self._marker()
        if recorded > self.generation:
            raise self._fenced(recorded)
        return done >= epoch

    def _transaction(self, body: Callable[[], None], epoch: int, again: bool = False) -> None:
        """One transaction: ``body``'s records and ``epoch`` as the sink's group offset, under this
        generation; aborted on an error (Fenced when the broker fenced this producer).

        librdkafka can block for good in a transactional call, its timeout notwithstanding (seen
        with a transaction open while Tansu was killed and restarted): a call still blocked after
        its time is left to its thread, and the transaction tried again from the start with a
        fresh producer of the same id, whose start aborts the stuck one, until ``wait`` has
        passed. ``again``: try it again even if the sink's group already shows ``epoch`` (a
        transaction that records no epoch of its own)."""
        from confluent_kafka import KafkaError, KafkaException

        wait = self.params.wait / 1000
        deadline = time.monotonic() + wait
        while True:
            try:
                self._attempt(body, epoch, deadline)
                break
            except _Stuck as e:
                self.health.failing(RuntimeError(str(e)))
                self._producer = None  # its thread holds it; the new one fences it
                if time.monotonic() >= deadline:
                    raise SinkError(f"sink '{self.name}': Kafka brokers {self.params.brokers} did not finish the "
                                    f"transaction of epoch {epoch} within {wait:.0f}s (wait): {e}") from e
                self._producer = self._new_producer(deadline)
                done, recorded = self._marker()
                if recorded > self.generation:
                    raise self._fenced(recorded) from e
                if done >= epoch and not again:
                    break  # the stuck one committed after all
            except KafkaException as e:
                err: KafkaError = e.args[0]
                fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
                # in a hot pair, the other driver's producer taking the shared id over while this
                # one's request is in flight can come back as a local _STATE ("Erroneous state")
                # or as a request that timed out, instead of a fence: the other driver may have
                # committed the epoch, so look again rather than stop the driver (an error of its
                # own recurs in every try; a broker that is down fails the look itself)
                if err.code() in fenced or (self._pair and err.code() in (KafkaError._STATE, KafkaError._TIMED_OUT)):
                    self._close()
                    if self._pair and self._marker()[1] <= self.generation:
                        raise _PartnerClaimed() from e
                    raise self._fenced() from e
                self.health.failing(RuntimeError(str(err)))
                if err.txn_requires_abort() and self._producer is not None:
                    with contextlib.suppress(KafkaException, _Stuck):  # the error above is what to report
                        _bounded(self._producer.abort_transaction, wait)
                if err.fatal():
                    self._close()
                what = "unreachable" if unreachable(err) else "refused the transaction"
                raise SinkError(f"sink '{self.name}': Kafka brokers {self.params.brokers} {what} (epoch {epoch}, "
                                f"topic {self.params.topic}): {err}") from e
        if self.health.since is not None:
            self.health.recovered()

    def _attempt(self, body: Callable[[], None], epoch: int, deadline: float) -> None:
        from confluent_kafka import TopicPartition

        producer = self._producer
        assert producer is not None, "open() first"
        producer.begin_transaction()
        body()
        for what, offset in (("epochs", epoch), ("generation", self.generation)):
            send = functools.partial(producer.send_offsets_to_transaction, [TopicPartition(self.params.topic, 0, offset)],
                                     self._groups(what).consumer_group_metadata())
            self._patiently(send, deadline)
        self._patiently(producer.commit_transaction, deadline)

    def _patiently(self, call: Callable[[float], None], deadline: float) -> None:
        """``call(seconds left)`` again while librdkafka says its error is retriable (a broker that
        does not answer in time: librdkafka allows calling again) until ``deadline``;
        :class:`_Stuck` if a call blocks past its time."""
        from confluent_kafka import KafkaException

        while True:
            # a call at a time gets a request's time, not all that is left: one that blocks for good
            # is then found while there is time left to try again
            left = max(0.1, min(REQUEST_S, deadline - time.monotonic()))
            try:
                _bounded(call, left)
                return
            except KafkaException as e:
                if not e.args[0].retriable() or time.monotonic() >= deadline:
                    raise
                self.health.failing(RuntimeError(str(e.args[0])))
                time.sleep(0.2)

    def staged_rows(self, epoch: int) -> int:
        staged = self.collected.get(epoch)
        return staged.num_rows if staged is not None else 0


class _PartnerClaimed(Exception):
    """The other driver of a hot pair started a producer of the shared transactional id."""


#: how often a driver of a hot pair takes an epoch's transaction back from the other before it gives up
PAIR_TRIES = 8


class _Stuck(Exception):
    """A librdkafka call still blocked well after its timeout."""


#: how long past its own timeout a librdkafka call may block before it counts as stuck
GRACE_S = 5.0


def _bounded(call: Callable[[float], Any], timeout_s: float) -> Any:
    """``call(timeout_s)`` in a thread of its own, its result or error; :class:`_Stuck` when it
    has not returned :data:`GRACE_S` after ``timeout_s`` (the thread is left to it)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call(timeout_s)
        except BaseException as e:  # noqa: BLE001 (handed to the caller)
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True, name="kafka-call")
    thread.start()
    thread.join(timeout_s + GRACE_S)
    if thread.is_alive():
        name = getattr(getattr(call, "func", call), "__name__", "a call")
        raise _Stuck(f"{name} blocked past its {timeout_s:.0f}s timeout")
    if "error" in out:
        raise out["error"]
    return out.get("value")


@SINKS.register
class KafkaSinkKind(SinkKind):
    key = "kafka"
    params = KafkaOut
    live_params = ("brokers", "topic", "key")

    def describe(self, params: Any) -> str:
        key = f", key {params.key}" if params.key else ""
        return f"Kafka topic {params.topic} at {params.brokers}{key} (JSON, a transaction an epoch)"

    def make(self, spec: SinkSpec, console: Any = None) -> KafkaSink:
        return KafkaSink(spec)
