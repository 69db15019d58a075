"""Writing and reading Kafka topics for the tests, with confluent-kafka used plainly (a producer,
a ``read_committed`` consumer), so that tests check what Eddyline wrote as any client would see it."""

from __future__ import annotations

import time
import uuid
from typing import Any


def topic_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions)]).values():
        f.result()
    return topic


def produce(bootstrap: str, topic: str, values: list[bytes], *, partition: int | None = None,
            keys: list[bytes | None] | None = None, batched: bool = True, headers: Any = None) -> None:
    """``values`` to ``topic`` (to ``partition``, or by key / round robin), batched by the producer
    (many records a batch) unless ``batched`` is False (one a batch)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50 if batched else 0,
                  **({} if batched else {"batch.num.messages": 1})})
    for i, v in enumerate(values):
        kw: dict[str, Any] = {"headers": headers} if headers else {}
        if partition is not None:
            kw["partition"] = partition
        p.produce(topic, v, keys[i] if keys else None, **kw)
        if not batched:
            p.flush()
    assert p.flush(30) == 0


def read_committed(bootstrap: str, topic: str, idle_s: float = 2.0,
                   isolation: str = "read_committed") -> list[Any]:
    """Every record of every partition of ``topic`` a ``read_committed`` consumer (or one of
    ``isolation``) sees, in partition and offset order: (partition, offset, key, value, headers)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ref-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.partition.eof": True, "enable.auto.commit": False})
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof, last = [], set(), time.monotonic()
    while len(eof) < len(parts) and time.monotonic() - last < idle_s:
        for m in c.consume(1000, 0.2):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue
            last = time.monotonic()
            out.append((m.partition(), m.offset(), m.key(), m.value(), m.headers()))
    c.close()
    return sorted(out, key=lambda r: (r[0], r[1]))
