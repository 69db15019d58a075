"""Feeding a broker: publish a built-in generator's rows (``nexmark``, ``generator``) to a NATS
JetStream stream, paced at a number of offsets per second of wall time or as fast as possible.

Rows are computed in Spark exactly as the source of the same settings computes them, and sent as
JSON objects, one per message. Each message's id is ``source/first offset/n`` for the n-th row of
that source since the first offset (rows come in offset order however they are cut into chunks),
so producing from the same offset again (a restarted producer) adds nothing within the stream's
de-duplication window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eddyline.api.sources import SourceSpec
from eddyline.io.natswire import DEDUP_WINDOW_MS, NatsConnection, ensure_stream
from eddyline.io.records import to_json_column
from eddyline.io.sources import Source, make_source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
) -> int:
    """Publish offsets [``start``, ``end``) of every feed (``end`` None: until ``should_stop``),
    at ``rate`` offsets per second (None: as fast as possible). Creates the stream if missing.
    ``on_chunk(offset reached, messages published so far)`` after each chunk. Returns the
    offset reached."""
    sources = [(make_source(f.source), f.subject) for f in feeds]
    published, done, t0 = 0, start, time.monotonic()
    counts = [0] * len(sources)  # rows published per source, for the message ids
    with NatsConnection(url) as conn:
        ensure_stream(conn, stream, sorted({s for _, s in sources}), duplicate_window_ms=DEDUP_WINDOW_MS)
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
            for i, (source, subject) in enumerate(sources):
                n = _publish(spark, conn, source, subject, done, upto, f"{source.name}/{start}/", counts[i])
                counts[i] += n
                published += n
            done = upto
            if on_chunk is not None:
                on_chunk(done, published)
    return done


def _publish(
    spark: SparkSession, conn: NatsConnection, source: Source, subject: str, start: int, end: int,
    prefix: str, first: int,
) -> int:
    df = source.frames(spark, {"start": start, "end": end}, spark.sparkContext.defaultParallelism).data
    rows = to_json_column(df).toArrow().column(0).to_pylist()
    conn.publish([(subject, f"{prefix}{first + i}", row.encode()) for i, row in enumerate(rows)])
    return len(rows)
