"""What handing raw rows to Python lanes costs, against Spark's own deduplication.

Times Spark jobs over the adaptive benchmark's Parquet slices (two files, 400,000 rows per job,
``local[2]``, a ``noop`` sink), each one layer longer than the last:

1. read the two files;
2. + the key group and routing columns and a shuffle on the routing column into 2 partitions
   (what the lane shuffle costs);
3. + ``mapInArrow`` with a function that receives every batch and returns nothing (the hand-off
   to Python, with no kernel), once with all 6 columns, once without the routing column (what
   the engine hands over since it drops that column after the shuffle), once with only 2;
4. a JVM pre-filter for a dedup, before the same shuffle and hand-off: each key's remembered
   interval (10,000 keys, as the lanes' state would give it) joined as a broadcast table built
   in the driver, the rows inside it dropped, and one row per key kept (``min_by`` on event
   time, aggregated partially before its shuffle); once more without the broadcast (a lower
   bound: an exact filter needs it, and would also have to pass every row of a key whose rows
   span more than the ttl);
5. Spark's ``dropDuplicates`` with a watermark on the same files, as a batch job (the JVM
   state-store dedup's work without its streaming bookkeeping).

Usage: ``python bench/adaptive/arrow_handoff.py [--data DIR] [--repeat 6]``; ``DIR`` defaults to
the data set cached by ``run_adaptive.py``. Prints the median build (driver) and run ms per layer.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any


def _drop(batches: Iterator[Any]) -> Iterator[Any]:
    for _ in batches:
        pass
    return iter(())


def main() -> None:
    ap = argparse.ArgumentParser()
    default = sorted(glob.glob(os.path.join(tempfile.gettempdir(), "eddyline-adaptive-400000-*", "events")))
    ap.add_argument("--data", default=default[0] if default else None)
    ap.add_argument("--repeat", type=int, default=6)
    args = ap.parse_args()
    if not args.data:
        raise SystemExit("no data: run bench/adaptive/run_adaptive.py once, or give --data")

    from eddyline.runtime.session import get_spark

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    files = sorted(os.listdir(args.data))
    schema = spark.read.parquet(os.path.join(args.data, files[0])).schema
    turn = [0]

    def read() -> Any:  # the next two files, like consecutive epochs
        turn[0] = (turn[0] + 2) % (len(files) - 1)
        return spark.read.schema(schema).parquet(*(os.path.join(args.data, f) for f in files[turn[0]: turn[0] + 2]))

    def timed(name: str, build: Callable[[], Any]) -> None:
        samples = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            df = build()
            t1 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            samples.append((t1 - t0, time.perf_counter() - t1))
        warm = samples[2:] or samples
        print(f"{name:48s} build {statistics.median(a for a, _ in warm) * 1000:6.0f} ms"
              f"   run {statistics.median(b for _, b in warm) * 1000:6.0f} ms")

    def routed() -> Any:  # as the engine routes: key group, routing value, shuffle on it
        return (read().selectExpr("*", "CAST(pmod(xxhash64(key), 128) AS INT) AS _kg")
                .selectExpr("*", "element_at(array(0L, 1L), (_kg % 2) + 1) AS _route").repartition(2, "_route"))

    timed("read", read)
    timed("read + shuffle", routed)
    timed("read + shuffle + mapInArrow (drop), 6 columns", lambda: routed().mapInArrow(_drop, "offset long"))
    timed("  ... 5 columns (_route dropped after the shuffle)", lambda: routed().drop("_route").mapInArrow(_drop, "offset long"))
    timed("  ... 2 columns (key, _kg)", lambda: routed().select("key", "_kg").mapInArrow(_drop, "offset long"))
    def first_per_key(rows: Any) -> Any:  # one row per key, then the engine's lane shuffle and hand-off
        from pyspark.sql import functions as F

        others = [c for c in schema.names if c != "key"]
        first = rows.groupBy("key").agg(F.min_by(F.struct(*others), "_t").alias("r")).select("key", "r.*")
        routed = (first.selectExpr("*", "CAST(pmod(xxhash64(key), 128) AS INT) AS _kg")
                  .selectExpr("*", "element_at(array(0L, 1L), (_kg % 2) + 1) AS _route").repartition(2, "_route"))
        return routed.drop("_route").mapInArrow(_drop, "offset long")

    def prefiltered(remembered: bool) -> Any:
        import pandas as pd
        from pyspark.sql import functions as F

        rows = read().withColumn("_t", F.expr("unix_millis(event_time)"))
        if remembered:
            keys = pd.DataFrame({"key": range(10_000), "_first_ms": 0, "_last_ms": 0})  # the lanes' intervals
            rows = rows.join(F.broadcast(spark.createDataFrame(keys)), "key", "left").where(
                "_first_ms IS NULL OR _t < _first_ms OR _t > _last_ms + 4000").drop("_first_ms", "_last_ms")
        return first_per_key(rows)

    timed("JVM pre-filter (remembered intervals + first per key) + shuffle + mapInArrow", lambda: prefiltered(True))
    timed("  ... first per key only (lower bound)", lambda: prefiltered(False))
    timed("Spark dropDuplicates with watermark (batch)",
          lambda: read().withWatermark("event_time", "2 seconds").dropDuplicates(["key"]))


if __name__ == "__main__":
    main()
