"""End-to-end latency at fixed input rates (issue #24, item 3).

Events are produced at a fixed rate of wall time (``--rates``, events per second) into a window
aggregate, a dedup and a join, and each engine's latency is measured per event: from the
event's production to the moment its result is committed. Engines:

* ``eddyline``: a ``nats`` source on a JetStream stream the producer publishes to, ``trigger:
  0`` (epochs back to back), a ``files`` sink (Parquet). The engine runs in this process
  (``Engine``, like ``run_bench.py``), so that it shares one SparkSession with Structured
  Streaming; the producer is a separate process (no GIL shared with the driver). An epoch's
  commit time is its progress record's ``committedAt`` (records before it had one: the
  ``timestamp``, written right after the commit, less ``durationMs.cleanup``); its output is ``out/epoch=N/``.
* ``spark``: Structured Streaming micro-batches, ``trigger(processingTime="0 seconds")``. Spark
  has no NATS source, so the producer writes the same events as JSON-lines files, one file per
  ``--file-ms`` (100 ms) of production, each written aside and renamed in whole, read by
  ``readStream.json``; an event therefore waits on average half a file period before Spark can
  see it, which a NATS message does not (the JSON output records that wait as ``file_wait_ms``).
  Output: the Parquet file sink (append); a batch's files come from its ``_spark_metadata``
  log entry and its commit time is its progress ``timestamp`` + ``durationMs.triggerExecution``.
* ``eddyline-files`` (not in the default list): Eddyline on those same JSON files (a ``files``
  source), to tell the source's share from the engine's.
* ``eddyline-resident`` (not in the default list): the same on resident lanes (``execution:
  resident``, no Spark job an epoch); it takes the dedup only (the window and the join prepare
  their rows in Spark, and are refused).
* ``spark-rtm``: Structured Streaming's Real-Time Mode (``trigger(realTime=...)``). In the
  installed PySpark its only sources are Kafka (the connector is not on PyPI) and Spark's
  ``LowLatencyMemoryStream``, an in-JVM memory source meant for tests; it is used here, fed from
  this process through py4j by a paced thread (no broker, no files: the most favourable input
  any engine gets here). Its sinks are Kafka, the console and ``foreach``; PySpark's Python
  ``foreach`` hands rows to Python only when a batch ends, so a small Java ``ForeachWriter``
  (compiled with ``javac`` at start, put on the driver's class path) records the wall time at
  which each row reaches the sink. Real-Time Mode commits at the end of each ``--rtm-batch``;
  rows reach the sink before that, so its latency is to the *emission*, not to a commit. The
  window aggregate runs in update mode (every update of a window's count is emitted; the latency
  is to the update that includes an event, from ``max(produced_us)`` of the window so far); the
  dedup is ``dropDuplicates`` (Real-Time Mode refuses ``dropDuplicatesWithinWatermark``); the
  join is refused (stream-stream joins are not in its allowlist): the error is recorded. A
  pipelined query needs a task slot per source partition and per shuffle partition at once, so
  it runs with one of each on ``local[2]``.
* ``flink``: not run here unless PyFlink is installed (see ``bench/latency_flink.py``); the
  results say why not.

The queries (the same for every engine; event time is the production time):

* ``window``: count per ``key`` (1,000 keys) per tumbling 1 s window, watermark delay
  ``--watermark-ms`` (200 ms), results in append mode (once the watermark passes the window).
  Its latency is measured from the window's *end* to the commit of the epoch that emitted it
  (per event, so weighted by the events in each window): the wait for the window to close is
  the query's, not the engine's; it includes the watermark delay. The JSON also gives the
  latency from each event's own production (``per_event_ms``), which adds up to the window size.
* ``dedup``: the first event per ``uid``, a uid remembered for 10 s of event time; every 4th
  event repeats the uid of one of the 1,000 events before it. Latency of each first occurrence:
  its output row's commit time - its ``produced_us``.
* ``join``: every 10th event is an auction, the others are bids on one of the 50 latest
  auctions; an interval join of each bid with its auction when the bid comes within 10 s of the
  auction. Latency of each bid: the commit time of its pair - the bid's ``produced_us`` (the bid
  always comes after its auction).

Every run produces for ``--warmup`` s (not measured), ``--seconds`` s (measured: the events
produced then), and 2 s more (so the last measured windows close); the engine then runs until it
has read every event and a further 2 s, or ``--drain`` s at most. An event whose result never
came counts as infinitely late (so a p99 is ``inf`` when more than 1 % are missing). *Consumed*:
input rows the engine committed during the measured interval per second. *Kept up*: consumed
at least 95 % of produced, at most 0.1 % of the measured events without a result, and the median
latency of the last quarter of the measured interval at most twice that of the first quarter
plus 0.5 s.

Usage: ``python bench/latency.py [--rates 1000,10000,50000] [--seconds 20] [--engines
eddyline,spark,spark-rtm,flink] [--queries window,dedup,join] [--no-md]``. Writes
``bench/results/latency-<timestamp>.json``, a plot ``latency-<timestamp>.svg`` (matplotlib is not
a dependency: the SVG is written directly) and the ``latency`` section of ``bench/RESULTS.md``.
``--md-from RUN.json [RERUN.json ...]`` runs nothing and writes that section (and a plot named
after the files) from saved runs, a later file's cases replacing an earlier one's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import results_io

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
QUERIES = ("window", "dedup", "join")
ENGINES = ("eddyline", "spark", "spark-rtm", "flink")
ALL_ENGINES = (*ENGINES, "eddyline-files", "eddyline-resident")
SCHEMA = "seq long, kind string, key long, uid long, auction long, price long, produced_us long"
KEYS = 1000
WINDOW_US = 1_000_000
TTL_S = 10  # dedup: how long a uid is remembered; join: a bid joins an auction up to 10 s old
AUCTION_EVERY = 10  # event seq is an auction when seq % 10 == 0
DUP_EVERY = 4  # event seq repeats an earlier uid when seq % 4 == 3
TAIL_S = 2.0  # produced after the measured interval, so that its last windows close
SETTLE_S = 2.0  # the engine runs this long after it has read every event
TICK_S = 0.002  # the producer's pause when nothing is due


# ----------------------------------------------------------------------------- the events
class Events:
    """The event stream, the same for every engine apart from the production times. Event
    ``seq`` is an auction (``auction`` = seq) when seq % 10 == 0, else a bid on one of the 50
    latest auctions; ``key`` is uniform over 1,000 keys; when seq % 4 == 3 the event repeats the
    ``uid`` of an earlier original event (one of the 1,000 before it), else uid = seq."""

    def __init__(self, seed: int = 24):
        self.rng = np.random.default_rng(seed)
        self.next = 0

    def take(self, n: int, now_us: int) -> tuple[list[str], dict[str, np.ndarray]]:
        rng = self.rng
        seq = np.arange(self.next, self.next + n, dtype=np.int64)
        self.next += n
        key = rng.integers(0, KEYS, n)
        price = rng.integers(1, 1000, n)
        is_auction = seq % AUCTION_EVERY == 0
        latest = seq // AUCTION_EVERY * AUCTION_EVERY
        auction = np.where(is_auction, seq, latest - AUCTION_EVERY * np.minimum(rng.integers(0, 50, n), seq // AUCTION_EVERY))
        is_new = seq % DUP_EVERY != DUP_EVERY - 1
        back = np.minimum(rng.integers(0, 250, n), np.maximum(seq - 2, 0) // DUP_EVERY)
        uid = np.where(is_new, seq, seq - 1 - DUP_EVERY * back)  # seq - 1 - 4m is an original (≡ 2 mod 4)
        kinds = np.where(is_auction, "a", "b").tolist()
        lines = [
            f'{{"seq":{s},"kind":"{k}","key":{y},"uid":{u},"auction":{a},"price":{p},"produced_us":{now_us}}}'
            for s, k, y, u, a, p in zip(seq.tolist(), kinds, key.tolist(), uid.tolist(), auction.tolist(),
                                        price.tolist(), strict=True)
        ]
        cols = {"seq": seq, "key": key.astype(np.int32), "uid": uid, "is_auction": is_auction, "is_new": is_new,
                "produced_us": np.full(n, now_us, dtype=np.int64)}
        return lines, cols


def paced(rate: float, seconds: float, send: Callable[[list[str]], None],
          stop: Callable[[], bool] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Produce ``rate`` events per second of wall time for ``seconds``: every ``TICK_S`` (or as
    soon as the last send is done, if it took longer), the events due are made, stamped with the
    current wall time (``produced_us``) and handed to ``send`` at once. (Sending again as soon as
    a send returned made this process busy-wait on the server's acknowledgements of two or three
    events at a time: 2/3 of a core at 10,000 events/s, on the two cores the engine measured
    runs on.) Returns a summary and the log of what was produced."""
    events, parts = Events(), []
    total = int(rate * seconds)
    t0 = time.time()
    sent = most = 0
    while sent < total and not (stop is not None and stop()):
        due = min(int(rate * (time.time() - t0)), total) - sent
        if due <= 0:
            time.sleep(TICK_S)
            continue
        most = max(most, due)
        tick = time.monotonic()
        lines, cols = events.take(due, time.time_ns() // 1000)
        send(lines)
        parts.append(cols)
        sent += due
        time.sleep(max(0.0, TICK_S - (time.monotonic() - tick)))
    end = time.time()
    log = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}
    return {"t0_us": int(t0 * 1e6), "end_us": int(end * 1e6), "events": sent, "rate": rate,
            "produced_eps": sent / (end - t0), "largest_send": most}, log


class FileBatches:
    """``send`` for file-reading engines: events collect in memory and are written as one
    JSON-lines file per ``period_s`` (written aside, then renamed into ``directory``)."""

    def __init__(self, directory: Path, period_s: float):
        self.dir, self.period_s = directory, period_s
        self.lines: list[str] = []
        self.count = 0  # events written so far
        self.files = 0
        self.started = time.monotonic()
        self.visible: list[tuple[int, int]] = []  # (events written before, wall time µs) per file

    def __call__(self, lines: list[str]) -> None:
        self.lines += lines
        if time.monotonic() - self.started >= self.period_s * (self.files + 1):
            self.flush()

    def flush(self) -> None:
        if not self.lines:
            return
        self.files += 1
        tmp = self.dir / f".part-{self.files:06d}.json"
        tmp.write_text("\n".join(self.lines) + "\n")
        tmp.rename(self.dir / f"part-{self.files:06d}.json")
        self.count += len(self.lines)
        self.visible.append((self.count, time.time_ns() // 1000))
        self.lines = []

    def visible_us(self, n: int) -> np.ndarray:
        """When each of the first ``n`` events became visible (its file was renamed in)."""
        out = np.zeros(n, dtype=np.int64)
        start = 0
        for end, us in self.visible:
            out[start:min(end, n)] = us
            start = end
        return out


def produce_main(cfg: dict[str, Any]) -> None:
    """The producer process: ``cfg`` says the rate, the duration and where to (``nats``: a
    JetStream stream; ``files``: a directory). Writes its log (``.npz``) and summary (``.json``)."""
    if cfg["mode"] == "nats":
        from eddyline.io.natswire import NatsConnection

        conn = NatsConnection(cfg["url"])
        subject = cfg["subject"]

        def send(lines: list[str]) -> None:
            conn.publish([(subject, None, line.encode()) for line in lines])

        summary, log = paced(cfg["rate"], cfg["seconds"], send)
        conn.close()
    else:
        files = FileBatches(Path(cfg["dir"]), cfg["file_ms"] / 1000)
        summary, log = paced(cfg["rate"], cfg["seconds"], files)
        files.flush()
        if log:
            log["visible_us"] = files.visible_us(len(log["seq"]))
        summary["files"] = files.files
    np.savez(cfg["log"], **log)
    Path(cfg["log"] + ".json").write_text(json.dumps(summary))


class Producer:
    """The producer as a separate process (see :func:`produce_main`)."""

    def __init__(self, rate: float, seconds: float, target: dict[str, Any], workdir: Path):
        self.cfg = {"rate": rate, "seconds": seconds, "log": str(workdir / "produced"), **target}
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.summary: dict[str, Any] | None = None

    def start(self) -> None:
        with open(self.workdir / "producer.log", "wb") as err:
            self.proc = subprocess.Popen([sys.executable, __file__, "_produce", json.dumps(self.cfg)],
                                         stdout=err, stderr=subprocess.STDOUT)

    def done(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is None:
            return False
        if self.proc.returncode != 0:
            tail = (self.workdir / "producer.log").read_text()[-2000:]
            raise RuntimeError(f"the producer failed (exit {self.proc.returncode}): {tail}")
        if self.summary is None:
            self.summary = json.loads(Path(self.cfg["log"] + ".json").read_text())
        return True

    @property
    def total(self) -> int:
        assert self.summary is not None
        return int(self.summary["events"])

    def result(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        while not self.done():
            time.sleep(0.1)
        with np.load(self.cfg["log"] + ".npz") as z:
            log = {k: z[k] for k in z.files}
        assert self.summary is not None
        return self.summary, log

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ThreadProducer:
    """The producer as a thread of this process (Real-Time Mode's memory source is fed here)."""

    def __init__(self, rate: float, seconds: float, send: Callable[[list[str]], None]):
        self.rate, self.seconds, self.send = rate, seconds, send
        self.out: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="latency-producer", daemon=True)

    def _run(self) -> None:
        try:
            self.out = paced(self.rate, self.seconds, self.send, self._halt.is_set)
        except BaseException as e:  # handed to the caller by done()
            self.error = e

    def start(self) -> None:
        self.thread.start()

    def done(self) -> bool:
        if self.thread.is_alive():
            return False
        if self.error is not None:
            raise RuntimeError(f"the producer failed: {self.error}") from self.error
        return True

    @property
    def total(self) -> int:
        assert self.out is not None
        return int(self.out[0]["events"])

    def result(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        self.thread.join()
        self.done()
        assert self.out is not None
        return self.out

    def stop(self) -> None:
        self._halt.set()
        self.thread.join(30)


class Until:
    """When a run ends: after the producer finished, once the engine has read every event and
    then ``SETTLE_S`` more seconds passed, or ``drain_s`` after the producer finished."""

    def __init__(self, producer: Producer | ThreadProducer, consumed: Callable[[], int], drain_s: float):
        self.producer, self.consumed, self.drain_s = producer, consumed, drain_s
        self.ended: float | None = None
        self.caught: float | None = None
        self.drained_s: float | None = None  # producer end -> every event read

    def __call__(self) -> bool:
        if not self.producer.done():
            return False
        now = time.monotonic()
        if self.ended is None:
            self.ended = now
        if self.caught is None and self.consumed() >= self.producer.total:
            self.caught, self.drained_s = now, now - self.ended
        if self.caught is not None:
            return now - self.caught >= SETTLE_S
        return now - self.ended >= self.drain_s

    def wait(self, poll_s: float = 0.2, failed: Callable[[], str | None] | None = None) -> None:
        while not self():
            if failed is not None and (why := failed()):
                raise RuntimeError(why)
            time.sleep(poll_s)


# ----------------------------------------------------------------------------- Eddyline
def eddyline_network(query: str, source: dict[str, Any], out: Path, watermark_ms: int) -> dict[str, Any]:
    ts = "timestamp_micros(produced_us) AS ts"
    if query == "window":
        steps = [
            {"name": "timed", "input": "events", "select": ["key", "produced_us", ts]},
            {"name": "result", "input": "timed", "window_aggregate": {
                "key": "key", "time": "ts", "window": {"size": "1s"}, "aggregates": {"n": "count(*)"},
                "watermark_delay": f"{watermark_ms}ms"}},
        ]
    elif query == "dedup":
        steps = [
            {"name": "timed", "input": "events", "select": ["seq", "uid", "produced_us", ts]},
            {"name": "result", "input": "timed", "dedup": {"key": "uid", "time": "ts", "ttl": f"{TTL_S}s"}},
        ]
    else:
        steps = [
            {"name": "auctions", "input": "events", "filter": "kind = 'a'"},
            {"name": "a", "input": "auctions", "select": [
                "auction AS id", "timestamp_micros(produced_us) AS a_ts",
                f"timestamp_micros(produced_us) + INTERVAL {TTL_S} SECONDS AS expires"]},
            {"name": "bids", "input": "events", "filter": "kind = 'b'"},
            {"name": "b", "input": "bids", "select": ["seq", "auction", "produced_us", ts]},
            {"name": "result", "join": {"left": "a", "right": "b", "left_key": "id", "right_key": "auction",
                                        "kind": "interval", "left_time": "a_ts", "left_end": "expires",
                                        "right_time": "ts"}},
        ]
    return {"name": f"latency-{query}", "trigger": 0, "lanes": 2,
            "sources": [{"name": "events", **source}], "steps": steps,
            "sinks": [{"name": "out", "input": "result", "files": {"path": str(out), "format": "parquet"}}]}


def run_eddyline(ctx: Context, query: str, rate: int, tmp: Path, files: bool, execution: str = "job") -> dict[str, Any]:
    import pyarrow.parquet as pq

    from eddyline.api.validate import load_spec
    from eddyline.io.natswire import NatsConnection, ensure_stream
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    out = tmp / "out"
    seconds = ctx.args.warmup + ctx.args.seconds + TAIL_S
    if files:
        indir = tmp / "in"
        indir.mkdir()
        source = {"files": {"path": str(indir), "format": "json", "schema": SCHEMA}}
        producer = Producer(rate, seconds, {"mode": "files", "dir": str(indir), "file_ms": ctx.args.file_ms}, tmp)
    else:
        ctx.runs += 1
        stream, subject = f"LATENCY{ctx.runs}", f"latency.{ctx.runs}"
        with NatsConnection(ctx.nats_url) as conn:
            ensure_stream(conn, stream, [subject])
        source = {"nats": {"url": ctx.nats_url, "stream": stream, "subject": subject, "schema": SCHEMA}}
        producer = Producer(rate, seconds, {"mode": "nats", "url": ctx.nats_url, "subject": subject}, tmp)
    spec = load_spec({**eddyline_network(query, source, out, ctx.args.watermark_ms), "execution": execution})
    progress = tmp / "progress.jsonl"
    read = [0]

    class Tap(ProgressReporter):  # counts the rows read, for the end of the run
        def report(self, record: dict[str, Any]) -> None:
            super().report(record)
            read[0] += int(record["numInputRows"])

    try:
        with Tap(live=False, json_path=str(progress)) as reporter:
            engine = Engine(spec, ctx.spark, str(tmp / "ckpt"), reporter=reporter)
            producer.start()
            until = Until(producer, lambda: read[0], ctx.args.drain)
            engine.run(should_stop=until)
    finally:
        producer.stop()
        if not files:
            with contextlib.suppress(Exception), NatsConnection(ctx.nats_url) as conn:
                conn.api(f"STREAM.DELETE.{stream}")
    summary, log = producer.result()
    epochs = [json.loads(line) for line in progress.read_text().splitlines()]
    commit_us = {r["batchId"]: _iso_us(r["committedAt"]) if "committedAt" in r
                 else _iso_us(r["timestamp"]) - int(r["durationMs"]["cleanup"] * 1000) for r in epochs}
    tables = []
    for d in sorted(out.glob("epoch=*")):
        epoch = int(d.name.split("=")[1])
        if not any(d.glob("*.parquet")):
            continue
        t = pq.read_table(d)
        if t.num_rows:
            tables.append(_with_emit(_plain(t), commit_us[epoch]))
    return {"summary": summary, "log": log, "rows": _concat(tables), "drained_s": until.drained_s,
            "inputs": [(commit_us[r["batchId"]], int(r["numInputRows"])) for r in epochs],
            # (start, end) µs of each epoch that read rows, for --profile
            "windows": [(commit_us[r["batchId"]] - int(r["durationMs"]["triggerExecution"] * 1000), commit_us[r["batchId"]])
                        for r in epochs if r["numInputRows"]],
            "batches": len(epochs),
            "batch_ms_median": float(np.median([r["durationMs"]["triggerExecution"] for r in epochs])) if epochs else None,
            "source": f"JSON files, one per {ctx.args.file_ms} ms" if files else "NATS JetStream",
            "basis": "commit", "file_wait_ms": _file_wait_ms(log),
            # where an epoch's time goes: median ms per stage
            "epoch_ms": {k: float(np.median([r["durationMs"][k] for r in epochs])) if epochs else None
                         for k in ("planning", "execution", "publish", "commit")}}


# ----------------------------------------------------------------------------- Structured Streaming
def spark_query(query: str, ev: Any, watermark_ms: int, rtm: bool = False, bids: Any = None) -> Any:
    """The query in the DataFrame API. ``rtm``: the forms Real-Time Mode takes (update mode:
    a window's count with the newest production time in it; ``dropDuplicates``)."""
    from pyspark.sql import functions as F

    if query == "window":
        grouped = ev.withWatermark("ts", f"{watermark_ms} milliseconds").groupBy(F.window("ts", "1 second"), "key")
        if rtm:
            return grouped.agg(F.count(F.lit(1)).alias("n"), F.max("produced_us").alias("last_us")).select(
                "key", F.col("window.start").alias("window_start"), "n", "last_us")
        return grouped.agg(F.count(F.lit(1)).alias("n")).select(
            "key", F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "n")
    if query == "dedup":
        if rtm:
            return ev.dropDuplicates(["uid"]).select("seq", "uid", "produced_us")
        return ev.withWatermark("ts", f"{TTL_S} seconds").dropDuplicatesWithinWatermark(["uid"]).select(
            "seq", "uid", "produced_us")
    auctions = ev.filter("kind = 'a'").select(F.col("auction").alias("id"), F.col("ts").alias("a_ts")).withWatermark(
        "a_ts", f"{TTL_S} seconds")
    b = (bids if bids is not None else ev).filter("kind = 'b'").select("seq", "auction", "produced_us", "ts").withWatermark(
        "ts", f"{TTL_S} seconds")
    return auctions.join(b, F.expr(f"id = auction AND ts >= a_ts AND ts <= a_ts + INTERVAL {TTL_S} SECONDS")).select(
        "seq", "id", "produced_us")


def run_spark(ctx: Context, query: str, rate: int, tmp: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    spark = ctx.spark
    indir, out = tmp / "in", tmp / "out"
    indir.mkdir()
    producer = Producer(rate, ctx.args.warmup + ctx.args.seconds + TAIL_S,
                        {"mode": "files", "dir": str(indir), "file_ms": ctx.args.file_ms}, tmp)
    # every batch's progress is kept, and the file sink's log is never compacted: a batch's files
    # are then listed in _spark_metadata/<batch>
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000000")
    spark.conf.set("spark.sql.streaming.fileSink.log.compactInterval", "1000000")
    ev = spark.readStream.schema(SCHEMA).json(str(indir)).withColumn("ts", F.timestamp_micros("produced_us"))
    producer.start()
    q = (spark_query(query, ev, ctx.args.watermark_ms).writeStream.format("parquet").outputMode("append")
         .option("path", str(out)).option("checkpointLocation", str(tmp / "ckpt"))
         .trigger(processingTime="0 seconds").start())
    progress: dict[int, dict[str, Any]] = {}

    def batches() -> dict[int, dict[str, Any]]:
        for p in q.recentProgress:
            if "addBatch" in p["durationMs"]:  # a batch that ran (not an idle report)
                progress[p["batchId"]] = p
        return progress

    until = Until(producer, lambda: sum(p["numInputRows"] for p in batches().values()), ctx.args.drain)
    try:
        until.wait(failed=lambda: str(q.exception()) if q.exception() is not None else None)
    finally:
        producer.stop()
        _quiet_stop(spark, q)
    summary, log = producer.result()
    batches()
    commit_us = {b: _iso_us(p["timestamp"]) + int(p["durationMs"]["triggerExecution"] * 1000) for b, p in progress.items()}
    tables = []
    for entry in sorted((out / "_spark_metadata").glob("[0-9]*"), key=lambda p: int(p.name.split(".")[0])):
        batch = int(entry.name.split(".")[0])
        paths = [json.loads(line)["path"] for line in entry.read_text().splitlines()[1:] if line.strip()]
        for path in paths:
            t = pq.read_table(path.removeprefix("file://"))
            if t.num_rows and batch in commit_us:
                tables.append(_with_emit(_plain(t), commit_us[batch]))
    return {"summary": summary, "log": log, "rows": _concat(tables), "drained_s": until.drained_s,
            "inputs": [(commit_us[b], int(p["numInputRows"])) for b, p in progress.items()],
            "windows": [(_iso_us(p["timestamp"]), commit_us[b]) for b, p in progress.items() if p["numInputRows"]],
            "batches": len(progress),
            "batch_ms_median": float(np.median([p["durationMs"]["triggerExecution"] for p in progress.values()]))
            if progress else None,
            "source": f"JSON files, one per {ctx.args.file_ms} ms", "basis": "commit",
            "file_wait_ms": _file_wait_ms(log)}


def _quiet_stop(spark: Any, q: Any) -> None:
    """Stop a query whose source may still have a batch in flight (Spark logs its abort at ERROR)."""
    spark.sparkContext.setLogLevel("OFF")
    try:
        q.stop()
    finally:
        spark.sparkContext.setLogLevel("ERROR")


def _file_wait_ms(log: dict[str, np.ndarray]) -> float | None:
    if "visible_us" not in log or not len(log["seq"]):
        return None
    return float(np.mean(log["visible_us"] - log["produced_us"]) / 1000)


# ----------------------------------------------------------------------------- Real-Time Mode
RTM_WRITER = r"""
import java.io.FileWriter;
import java.io.IOException;
import java.io.Writer;
import java.time.Instant;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/** Appends "emit_us v1 v2 ..." per row: the wall time (µs) at which the row reached the sink,
 *  then the row's long columns named in the constructor. Buffered; written every 100 ms and at
 *  the end of a batch (the time is taken per row, so buffering does not change it). */
public class LatencyRowWriter extends ForeachWriter<Row> {
  private final String dir;
  private final String[] columns;
  private transient Writer out;
  private transient StringBuilder buf;
  private transient long flushedAt;

  public LatencyRowWriter(String dir, String columns) { this.dir = dir; this.columns = columns.split(","); }

  @Override public boolean open(long partitionId, long epochId) {
    try {
      out = new FileWriter(dir + "/part-" + partitionId + "-" + epochId + "-" + System.nanoTime() + ".txt");
    } catch (IOException e) { throw new RuntimeException(e); }
    buf = new StringBuilder();
    flushedAt = System.nanoTime();
    return true;
  }

  @Override public void process(Row row) {
    Instant now = Instant.now();
    buf.append(now.getEpochSecond() * 1_000_000L + now.getNano() / 1000);
    for (String c : columns) buf.append(' ').append(row.getLong(row.fieldIndex(c)));
    buf.append('\n');
    if (System.nanoTime() - flushedAt > 100_000_000L) flush();
  }

  private void flush() {
    try { out.write(buf.toString()); out.flush(); } catch (IOException e) { throw new RuntimeException(e); }
    buf.setLength(0);
    flushedAt = System.nanoTime();
  }

  @Override public void close(Throwable error) {
    flush();
    try { out.close(); } catch (IOException e) { throw new RuntimeException(e); }
  }
}
"""


def compile_rtm_writer(workdir: Path) -> str:
    """Compile :data:`RTM_WRITER` against PySpark's jars; returns the class directory."""
    import pyspark

    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac not found (needed for Real-Time Mode's latency sink)")
    src, classes = workdir / "LatencyRowWriter.java", workdir / "rtm-classes"
    src.write_text(RTM_WRITER)
    jars = Path(pyspark.__file__).parent / "jars"
    subprocess.run([javac, "-nowarn", "-cp", f"{jars}/*", "-d", str(classes), str(src)], check=True,
                   capture_output=True)
    return str(classes)


def run_rtm(ctx: Context, query: str, rate: int, tmp: Path) -> dict[str, Any]:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.query import StreamingQuery

    if ctx.rtm_classes is None:
        raise RuntimeError(ctx.rtm_error or "Real-Time Mode's latency sink is not available")
    spark = ctx.spark
    jvm = spark._jvm
    memory = getattr(jvm, "org.apache.spark.sql.execution.streaming.sources.LowLatencyMemoryStream")
    encoder = getattr(jvm, "org.apache.spark.sql.Encoders").STRING()
    # one source partition and one shuffle partition: a pipelined query needs a slot for each at once
    streams = [memory.apply(spark._jsparkSession, 1, encoder) for _ in range(2 if query == "join" else 1)]

    def events(stream: Any) -> DataFrame:
        raw = DataFrame(stream.toDF(), spark)
        return raw.select(F.from_json("value", SCHEMA).alias("e")).select("e.*").withColumn(
            "ts", F.timestamp_micros("produced_us"))

    # a join of one source with itself is refused ("identical sources"), so the join reads two
    # copies of the stream; it is then refused for the join itself
    result = spark_query(query, events(streams[0]), ctx.args.watermark_ms, rtm=True,
                         bids=events(streams[1]) if query == "join" else None)
    columns = {"window": "key,n,last_us", "dedup": "seq,uid,produced_us"}.get(query, "seq,produced_us")
    out = tmp / "out"
    out.mkdir()
    writer = jvm.LatencyRowWriter(str(out), columns)
    trigger = getattr(jvm, "org.apache.spark.sql.streaming.Trigger").RealTime(f"{ctx.args.rtm_batch} seconds")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        jq = (result._jdf.writeStream().foreach(writer).outputMode("update")
              .option("checkpointLocation", str(tmp / "ckpt")).trigger(trigger).start())
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", ctx.shuffle_partitions)
    q = StreamingQuery(jq)
    split = jvm.java.util.regex.Pattern.compile("\n")
    wrap = jvm.scala.collection.immutable.ArraySeq.unsafeWrapArray

    def send(lines: list[str]) -> None:
        batch = wrap(split.split("\n".join(lines)))
        for stream in streams:
            stream.addData(batch)

    producer = ThreadProducer(rate, ctx.args.warmup + ctx.args.seconds + TAIL_S, send)
    progress: dict[int, dict[str, Any]] = {}

    def batches() -> dict[int, dict[str, Any]]:
        for p in q.recentProgress:
            progress[p["batchId"]] = p
        return progress

    until = Until(producer, lambda: sum(p["numInputRows"] for p in batches().values()) // len(streams),
                  ctx.args.drain)
    try:
        producer.start()
        until.wait(failed=lambda: str(q.exception()) if q.exception() is not None else None)
    finally:
        producer.stop()
        _quiet_stop(spark, q)
    summary, log = producer.result()
    batches()
    names = ["emit_us", *columns.split(",")]
    parts = [np.loadtxt(p, dtype=np.int64, ndmin=2) for p in out.glob("*.txt") if p.stat().st_size]
    data = np.concatenate(parts) if parts else np.zeros((0, len(names)), dtype=np.int64)
    import pandas as pd

    rows = pd.DataFrame({n: data[:, i] for i, n in enumerate(names)})
    ends = {b: _iso_us(p["timestamp"]) + int(p["durationMs"]["triggerExecution"] * 1000) for b, p in progress.items()}
    return {"summary": summary, "log": log, "rows": rows, "drained_s": until.drained_s,
            "inputs": [(ends[b], int(p["numInputRows"]) // len(streams)) for b, p in progress.items()],
            "batches": len(progress), "batch_ms_median": None,
            "source": "LowLatencyMemoryStream fed through py4j (no broker)", "basis": "emit", "updates": True}


# ----------------------------------------------------------------------------- output rows
def _plain(t: Any) -> Any:
    """``t`` as pandas, timestamps as µs since the epoch (int64)."""
    import pyarrow as pa

    cols = {}
    for name, col in zip(t.column_names, t.columns, strict=True):
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.timestamp("us", col.type.tz)).cast(pa.int64())
        cols[name] = col
    return pa.table(cols).to_pandas()


def _with_emit(df: Any, emit_us: int) -> Any:
    df["emit_us"] = emit_us
    return df


def _concat(frames: list[Any]) -> Any:
    import pandas as pd

    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"emit_us": np.zeros(0, dtype=np.int64)})


def _iso_us(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1_000_000)


# ----------------------------------------------------------------------------- latency
def percentiles(lat_ms: np.ndarray) -> dict[str, float]:
    """p50 / p99 / max of latencies in ms; a missing result is ``inf`` (so it counts as late)."""
    if not len(lat_ms):
        return {"p50": math.nan, "p99": math.nan, "max": math.nan}
    q = np.quantile(lat_ms, [0.5, 0.99], method="higher")
    return {"p50": float(q[0]), "p99": float(q[1]), "max": float(np.max(lat_ms))}


def analyse(query: str, basis: str, run: dict[str, Any], m0: int, m1: int) -> dict[str, Any]:
    """Per measured event (produced in [m0, m1) µs) the latency of its result; see the module
    docstring for what counts as an event's result in each query."""
    import pandas as pd

    log, rows = run["log"], run["rows"]
    measured = (log["produced_us"] >= m0) & (log["produced_us"] < m1) if log else np.zeros(0, dtype=bool)
    ev = pd.DataFrame({k: v[measured] for k, v in log.items()})
    if len(ev):
        ev["key"] = ev["key"].astype(np.int64)
    out: dict[str, Any] = {"check": {}}
    if query == "window" and run.get("updates"):  # Real-Time Mode's updates
        mine = rows[(rows["last_us"] >= m0) & (rows["last_us"] < m1)]
        lat = ((mine["emit_us"] - mine["last_us"]) / 1000).to_numpy(dtype=float)
        # events never reflected in an emitted count: each window's count against its largest update
        ev["window_start"] = ev["produced_us"] // WINDOW_US * WINDOW_US
        counts = ev.groupby(["key", "window_start"]).size()
        rows = rows.assign(window_start=rows["last_us"] // WINDOW_US * WINDOW_US)
        top = rows.groupby(["key", "window_start"])["n"].max()
        seen = top.reindex(counts.index).fillna(0).clip(upper=counts)
        missing = int((counts - seen).sum())
        lat = np.concatenate([lat, np.full(missing, np.inf)])
        out |= {"latency_ms": percentiles(lat), "measured": int(len(ev)), "missing": missing,
                "results": int(len(mine)), "definition": "emit time of the update that includes the event "
                "- the newest production time in that update"}
        out["trend"] = _trend(mine["last_us"].to_numpy(), lat[: len(mine)], m0, m1)
        return out
    if query == "window":
        if "revision" in rows:
            rows = rows[rows["revision"] == 0]
        per_window = rows.groupby(["key", "window_start"]).agg(emit_us=("emit_us", "min"), n=("n", "sum"))
        ev["window_start"] = ev["produced_us"] // WINDOW_US * WINDOW_US
        joined = ev.join(per_window, on=["key", "window_start"])
        emit = joined["emit_us"].to_numpy(dtype=float)
        emit[np.isnan(emit)] = np.inf
        lat = (emit - (joined["window_start"].to_numpy() + WINDOW_US)) / 1000
        out["per_event_ms"] = percentiles((emit - joined["produced_us"].to_numpy()) / 1000)
        # the counts of windows whose every event was measured, against the events produced
        whole = ev.groupby(["key", "window_start"]).size()
        whole = whole[(whole.index.get_level_values(1) >= m0) & (whole.index.get_level_values(1) + WINDOW_US <= m1)]
        got = per_window["n"].reindex(whole.index)
        out["check"] = {"windows": int(len(whole)), "wrong_counts": int((got != whole).sum())}
        out["definition"] = "commit time of the epoch that emitted the event's window - the window's end"
    else:
        if query == "dedup":  # a uid's result: its first output row, whichever of its events that carries
            ev, by = ev[ev["is_new"]], "uid"  # (an original event's uid is its seq)
            out["check"] = {"uids_out_twice": int(rows.duplicated("uid").sum()) if len(rows) else 0,
                            # rows carrying a repeat, not the uid's first event (it came in the same batch)
                            "repeat_not_first": int((~rows["seq"].isin(log["seq"][log["is_new"]])).sum())
                            if len(rows) else 0}
        else:
            ev, by = ev[~ev["is_auction"]], "seq"
            out["check"] = {"bids_out_twice": int(rows.duplicated("seq").sum()) if len(rows) else 0}
        first = rows.groupby(by)["emit_us"].min() if len(rows) else pd.Series(dtype=float)
        emit = first.reindex(ev[by]).to_numpy(dtype=float)
        emit[np.isnan(emit)] = np.inf
        lat = (emit - ev["produced_us"].to_numpy()) / 1000
        out["definition"] = ("commit" if basis == "commit" else "emit") + " time of the row - the event's produced_us"
    out |= {"latency_ms": percentiles(lat), "measured": int(len(lat)), "missing": int(np.isinf(lat).sum())}
    out["trend"] = _trend(ev["produced_us"].to_numpy(), lat, m0, m1)
    return out


def _trend(produced: np.ndarray, lat: np.ndarray, m0: int, m1: int) -> dict[str, float]:
    """Median latency of the events of the first and the last quarter of the measured interval."""
    q = (m1 - m0) // 4
    first, last = lat[produced < m0 + q], lat[produced >= m1 - q]
    return {"first_quarter_p50": float(np.median(first)) if len(first) else math.nan,
            "last_quarter_p50": float(np.median(last)) if len(last) else math.nan}


def _consumed(inputs: list[tuple[int, int]], m0: int, m1: int) -> float | None:
    """Input rows per second over the measured interval [m0, m1) µs, from (commit time, rows) per
    epoch: the rows of the epochs committed in it after the first one, over the time from the
    first commit to the last (whole epochs, so long epochs do not skew it at the edges); None
    with fewer than two commits in it."""
    inside = sorted((t, n) for t, n in inputs if m0 <= t < m1)
    if len(inside) < 2:
        return None
    return sum(n for _, n in inside[1:]) / ((inside[-1][0] - inside[0][0]) / 1e6)


def summarise(engine: str, query: str, rate: int, run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    s = run["summary"]
    m0 = s["t0_us"] + int(args.warmup * 1e6)
    m1 = m0 + int(args.seconds * 1e6)
    a = analyse(query, run["basis"], run, m0, m1)
    log = run["log"]
    produced = int(((log["produced_us"] >= m0) & (log["produced_us"] < m1)).sum()) if log else 0
    consumed = _consumed(run["inputs"], m0, m1) if run["inputs"] is not None else None
    span = (m1 - m0) / 1e6
    t = a["trend"]
    growing = not (t["last_quarter_p50"] <= 2 * t["first_quarter_p50"] + 500)  # nan/inf: growing
    # (fewer than two commits in the measured interval: consumed is None, and the engine fell behind)
    kept_up = (run["inputs"] is None or (consumed is not None and consumed >= 0.95 * produced / span)) and a["missing"] <= 0.001 * max(a["measured"], 1) and not growing
    r = {"engine": engine, "query": query, "rate": rate, "source": run["source"], "basis": run["basis"],
         "produced_eps": produced / span, "consumed_eps": consumed,
         "kept_up": bool(kept_up),
         "drained_s": run["drained_s"], "batches": run["batches"], "batch_ms_median": run["batch_ms_median"],
         "producer": {k: s[k] for k in ("events", "produced_eps", "largest_send") if k in s}, **a}
    for k in ("file_wait_ms", "epoch_ms"):
        if k in run:
            r[k] = run[k]
    if getattr(args, "event_log", None) is not None and run.get("windows") is not None:
        import sparklog

        # the epochs that began in the measured interval
        windows = [(a_us / 1e6, b_us / 1e6) for a_us, b_us in run["windows"] if m0 <= a_us < m1]
        r["profile"] = sparklog.profile(args.event_log.read(), windows)
    return r


# ----------------------------------------------------------------------------- the run
class Context:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.workdir = args, workdir
        self.spark: Any = None
        self.nats_url = ""
        self.runs = 0
        self.shuffle_partitions = "2"
        self.rtm_classes: str | None = None
        self.rtm_error: str | None = None


def flink_unavailable() -> str | None:
    """Why PyFlink cannot run here, or None when ``bench/latency_flink.py`` can run it."""
    runner = HERE / "latency_flink.py"
    if not runner.exists():
        return ("not run: no PyFlink environment in this repository yet (bench/latency_flink.py is missing; "
                "PyFlink is not installed in .venv)")
    sys.path.insert(0, str(HERE))
    import latency_flink

    return latency_flink.unavailable()


def run_case(ctx: Context, engine: str, query: str, rate: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"{engine}-{query}-{rate}-", dir=ctx.workdir))
    t0 = time.monotonic()
    try:
        if engine == "eddyline":
            run = run_eddyline(ctx, query, rate, tmp, files=False)
        elif engine == "eddyline-files":
            run = run_eddyline(ctx, query, rate, tmp, files=True)
        elif engine == "eddyline-resident":
            run = run_eddyline(ctx, query, rate, tmp, files=True, execution="resident")
        elif engine == "spark":
            run = run_spark(ctx, query, rate, tmp)
        elif engine == "spark-rtm":
            run = run_rtm(ctx, query, rate, tmp)
        else:
            sys.path.insert(0, str(HERE))
            import latency_flink

            run = latency_flink.run(ctx, query, rate, tmp)
        if getattr(ctx.args, "event_log", None) is not None:
            ctx.args.event_log.read(ctx.spark)  # the run's events, all written
        r = summarise(engine, query, rate, run, ctx.args)
    except Exception as e:  # one engine failing (or refusing the query) does not stop the others
        r = {"engine": engine, "query": query, "rate": rate, "error": f"{type(e).__name__}: {_first_lines(str(e))}",
             "error_text": str(e)[-4000:]}
    finally:
        if not ctx.args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    r["wall_s"] = round(time.monotonic() - t0, 1)
    r["load_after"] = _load()  # other work on the machine shows here
    return r


def prewarm(ctx: Context, engines: list[str], queries: list[str], rate: int) -> None:
    """Run every engine and query once, briefly, unmeasured: the first runs in a new JVM are
    slower (its code is not compiled yet, Spark's Python workers start), whichever engine has them."""
    args = ctx.args
    ctx.args = argparse.Namespace(**{**vars(args), "warmup": 2.0, "seconds": args.prewarm, "drain": 20.0, "keep": False})
    try:
        for query in queries:
            for engine in engines:
                r = run_case(ctx, engine, query, rate)
                print(f"warm-up {engine} {query}: {r['wall_s']} s{' ' + r['error'] if 'error' in r else ''}", flush=True)
    finally:
        ctx.args = args


def _first_lines(text: str, n: int = 3) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:n])[:600]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,10000,50000", help="events per second of wall time")
    ap.add_argument("--seconds", type=float, default=20, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=8, help="seconds produced before the measured ones")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"of {', '.join(ALL_ENGINES)}")
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--watermark-ms", type=int, default=200, help="the window query's watermark delay")
    ap.add_argument("--file-ms", type=int, default=100, help="file-reading engines: one file per this long")
    ap.add_argument("--rtm-batch", type=int, default=5, help="Real-Time Mode's batch (checkpoint) seconds")
    ap.add_argument("--drain", type=float, default=30, help="at most this long after the producer ended")
    # A continuous query runs for hours: its latency is measured once the JVM has compiled its
    # hot code, which takes a few dozen epochs (docs/perf-notes.md, "A join of two branches of
    # one source reads it once"), not in the first seconds after a JVM starts.
    ap.add_argument("--prewarm", type=float, default=30, help="seconds of an unmeasured first run of each engine "
                    "and query (0: none)")
    ap.add_argument("--profile", action="store_true", help="record Spark's event log and split the measured "
                    "epochs of Eddyline and Structured Streaming around their Spark jobs (bench/sparklog.py; "
                    "it costs time of its own)")
    ap.add_argument("--keep", action="store_true", help="keep the working files (for debugging)")
    ap.add_argument("--no-md", action="store_true", help="do not write bench/RESULTS.md")
    ap.add_argument("--md-from", nargs="+", metavar="JSON", help="run nothing: write the RESULTS.md section from "
                    "these result files (a later file's cases replace an earlier one's)")
    args = ap.parse_args()
    if args.md_from:
        md_from(args.md_from)
        return
    rates = [int(float(r)) for r in args.rates.split(",")]
    engines, queries = args.engines.split(","), args.queries.split(",")
    for e in engines:
        if e not in ALL_ENGINES:
            ap.error(f"--engines: unknown engine {e!r}")
    for q in queries:
        if q not in QUERIES:
            ap.error(f"--queries: unknown query {q!r}")

    workdir = Path(tempfile.mkdtemp(prefix="eddyline-latency-"))
    ctx = Context(args, workdir)
    when = datetime.now(UTC)
    out: dict[str, Any] = {
        "when": when.isoformat(), "rates": rates, "engines": engines, "queries": queries,
        "settings": {k: getattr(args, k) for k in ("seconds", "warmup", "prewarm", "watermark_ms", "file_ms", "rtm_batch", "drain")},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": _load(), "unavailable": {}, "runs": [],
    }
    if "flink" in engines and (why := flink_unavailable()):
        out["unavailable"]["flink"] = why
        engines = [e for e in engines if e != "flink"]
        print(f"flink: {why}", flush=True)
    try:
        conf = {"spark.sql.shuffle.partitions": ctx.shuffle_partitions}
        args.event_log = None
        if args.profile:
            import sparklog

            events = Path(tempfile.mkdtemp(prefix="eddyline-latency-events-"))  # kept: Spark renames it at exit
            print(f"Spark's event log: {events}", flush=True)
            args.event_log = sparklog.EventLog(events)
            conf |= args.event_log.spark_conf
        if "spark-rtm" in engines:
            try:
                ctx.rtm_classes = compile_rtm_writer(workdir)
                conf["spark.driver.extraClassPath"] = ctx.rtm_classes
            except Exception as e:
                ctx.rtm_error = f"{type(e).__name__}: {e}"
        from eddyline.io.local import LocalNats
        from eddyline.runtime.session import get_spark

        ctx.spark = get_spark("local[2]", conf)
        out["spark"] = ctx.spark.version
        with LocalNats() as nats:
            ctx.nats_url = nats.url
            if args.prewarm:
                prewarm(ctx, engines, queries, min(rates))
            for rate in rates:
                for query in queries:
                    for engine in engines:
                        r = run_case(ctx, engine, query, rate)
                        out["runs"].append(r)
                        print(_line(r), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept {workdir}")
    out["load_after"] = _load()
    RESULTS.mkdir(exist_ok=True)
    stamp = when.strftime("%Y-%m-%dT%H%M%S")
    path = RESULTS / f"latency-{stamp}.json"
    results_io.write(path, out, default=_json_default)
    svg = RESULTS / f"latency-{stamp}.svg"
    svg.write_text(plot_svg(out))
    print(f"wrote {path.relative_to(HERE.parent)} and {svg.relative_to(HERE.parent)}; "
          f"load average before {out['load_before']}, after {out['load_after']}")
    if not args.no_md:
        write_md(merged([path]), svg)


def md_from(files: list[str]) -> None:
    """``--md-from``: the RESULTS.md section (and a plot) from saved result files, later files'
    cases replacing earlier ones'."""
    paths = [Path(f).resolve() for f in files]
    out = merged(paths)
    stamps = [p.stem.removeprefix("latency-") for p in paths]
    svg = RESULTS / f"latency-{'-with-'.join(stamps)}.svg"
    svg.write_text(plot_svg(out))
    write_md(out, svg)
    print(f"wrote {svg.relative_to(HERE.parent)} and the latency section of bench/RESULTS.md")


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))


def _ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "∞"
    return f"{x:,.0f}"


def _eps(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _line(r: dict[str, Any]) -> str:
    head = f"{r['engine']:>14} {r['query']:>6} {r['rate']:>6,}/s:"
    if "error" in r:
        return f"{head} {r['error']}"
    lat = r["latency_ms"]
    extra = f" (per event p50 {_ms(r['per_event_ms']['p50'])} p99 {_ms(r['per_event_ms']['p99'])})" if "per_event_ms" in r else ""
    return (f"{head} p50 {_ms(lat['p50'])} p99 {_ms(lat['p99'])} max {_ms(lat['max'])} ms{extra}; produced "
            f"{r['produced_eps']:,.0f}/s consumed {_eps(r['consumed_eps'])}/s; kept up: {'yes' if r['kept_up'] else 'no'}; "
            f"missing {r['missing']} of {r['measured']}; {r['batches']} batches; check {r['check']}"
            + (_profile_line(r["profile"]) if r.get("profile") else ""))


def _profile_line(p: dict[str, Any]) -> str:
    stages = "; ".join(f"{label} {d['wall']:.0f} ms" for label, d in p["stages"].items())
    return (f"\n{'':>24}epoch {p['wall']:.0f} ms: before its jobs {p['before_jobs']:.0f}, jobs {p['jobs']:.0f} "
            f"({stages}), between and after {p['between_jobs'] + p['after_jobs']:.0f}")


# ----------------------------------------------------------------------------- the plot
COLORS = {"eddyline": "#1f77b4", "eddyline-files": "#17becf", "eddyline-resident": "#9467bd", "spark": "#d62728", "spark-rtm": "#ff7f0e",
          "flink": "#2ca02c"}


def plot_svg(out: dict[str, Any]) -> str:
    """Latency against rate, one panel per query, log-log: p99 solid, p50 dashed, one colour per
    engine; a hollow marker where the engine did not keep up. Missing points (an error, or a
    p99 of ∞) are left out."""
    runs = [r for r in out["runs"] if "error" not in r]
    queries = [q for q in out["queries"] if any(r["query"] == q for r in runs)] or out["queries"]
    rates = sorted(out["rates"])
    vals = [r["latency_ms"][k] for r in runs for k in ("p50", "p99") if math.isfinite(r["latency_ms"][k]) and r["latency_ms"][k] > 0]
    lo = 10 ** math.floor(math.log10(min(vals))) if vals else 1
    hi = 10 ** math.ceil(math.log10(max(vals))) if vals else 10_000
    hi = max(hi, lo * 10)
    pw, ph, ml, mt, mb, gap = 250, 220, 60, 34, 44, 20
    engines = [e for e in ALL_ENGINES if any(r["engine"] == e for r in runs)]
    width = ml + len(queries) * (pw + gap) + 10
    per_row = max(1, (width - ml) // 140)  # legend entries per line
    height = mt + ph + mb + 18 * (-(-len(engines) // per_row) + 1) + 10
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']

    def x_of(i: int, rate: float) -> float:
        x0 = ml + i * (pw + gap)
        if len(rates) == 1:
            return x0 + pw / 2
        a, b = math.log10(rates[0]), math.log10(rates[-1])
        return x0 + 15 + (math.log10(rate) - a) / (b - a) * (pw - 30)

    def y_of(ms: float) -> float:
        a, b = math.log10(lo), math.log10(hi)
        return mt + ph - (math.log10(min(max(ms, lo), hi)) - a) / (b - a) * ph

    for i, q in enumerate(queries):
        x0 = ml + i * (pw + gap)
        svg.append(f'<rect x="{x0}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        svg.append(f'<text x="{x0 + pw / 2}" y="{mt - 10}" text-anchor="middle" font-size="13">{q}</text>')
        decade = lo
        while decade <= hi:
            y = y_of(decade)
            svg.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
            if i == 0:
                svg.append(f'<text x="{x0 - 5}" y="{y + 4:.1f}" text-anchor="end">{_ms(decade)}</text>')
            decade *= 10
        if lo < 500 < hi:  # issue #24's goal: p99 at most 500 ms at 10,000 events/s
            y = y_of(500)
            svg.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#888" stroke-dasharray="1,3"/>')
            svg.append(f'<text x="{x0 + pw - 4}" y="{y - 4:.1f}" text-anchor="end" fill="#666">goal: p99 500 ms</text>')
        for rate in rates:
            x = x_of(i, rate)
            label = f"{rate // 1000}K" if rate >= 1000 else str(rate)
            svg.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#444"/>')
            svg.append(f'<text x="{x:.1f}" y="{mt + ph + 16}" text-anchor="middle">{label}</text>')
        svg.append(f'<text x="{x0 + pw / 2}" y="{mt + ph + 32}" text-anchor="middle">events/s</text>')
        for e in engines:
            mine = sorted((r for r in runs if r["engine"] == e and r["query"] == q), key=lambda r: r["rate"])
            for stat, dash in (("p99", ""), ("p50", ' stroke-dasharray="4,3"')):
                pts = [(x_of(i, r["rate"]), y_of(r["latency_ms"][stat]), r["kept_up"]) for r in mine
                       if math.isfinite(r["latency_ms"][stat])]
                if len(pts) > 1:
                    path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in pts)
                    svg.append(f'<polyline points="{path}" fill="none" stroke="{COLORS[e]}" stroke-width="1.6"{dash}/>')
                for x, y, ok in pts:
                    fill = COLORS[e] if ok else "white"
                    svg.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{fill}" stroke="{COLORS[e]}"/>')
            for r in mine:  # p99 ∞ (results missing): a cross on the top edge
                if not math.isfinite(r["latency_ms"]["p99"]):
                    x = x_of(i, r["rate"])
                    svg.append(f'<path d="M{x - 4:.1f},{mt - 4} l8,8 m0,-8 l-8,8" stroke="{COLORS[e]}" stroke-width="1.6"/>')
    svg.append(f'<text x="14" y="{mt + ph / 2}" transform="rotate(-90 14 {mt + ph / 2})" text-anchor="middle">'
               'latency, ms (log)</text>')
    ly = mt + ph + mb + 8
    for j, e in enumerate(engines):
        lx, yy = ml + (j % per_row) * 140, ly + (j // per_row) * 18
        svg.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{yy}" y2="{yy}" stroke="{COLORS[e]}" stroke-width="2"/>')
        svg.append(f'<text x="{lx + 30}" y="{yy + 4}">{e}</text>')
    yy = ly + -(-len(engines) // per_row) * 18
    svg.append(f'<text x="{ml}" y="{yy + 4}">solid: p99 · dashed: p50 · hollow: did not keep up · × on the top edge: '
               'p99 ∞ (results missing) · window: from its end</text>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


# ----------------------------------------------------------------------------- RESULTS.md
def _short_error(text: str) -> str:
    """An error for a table cell: up to Spark's "To bypass" advice or SQLSTATE, classes without
    their packages."""
    import re

    text = re.split(r" To bypass| SQLSTATE| === Streaming Query", text)[0]
    return re.sub(r"\b(?:[a-z_][a-z0-9_]*\.)+([A-Z]\w*)", r"\1", text)[:300]


def merged(paths: list[Path]) -> dict[str, Any]:
    """The runs of several result files as one: a case (engine, query, rate) of a later file
    replaces the same case of an earlier one (a rerun); ``runs_from`` says which file each
    case comes from, ``files`` every file with its time and load averages."""
    out: dict[str, Any] | None = None
    cases: dict[tuple[str, str, int], dict[str, Any]] = {}
    for i, path in enumerate(paths):
        d = json.loads(path.read_text())
        for r in d["runs"]:
            r["run_file"] = i
            cases[(r["engine"], r["query"], r["rate"])] = r
        if out is None:
            out = {**d, "files": []}
        else:
            out["rates"] = sorted({*out["rates"], *d["rates"]})
            out["unavailable"] = {**out["unavailable"], **d["unavailable"]}
        out["files"].append({"path": str(path.relative_to(HERE)), "when": d["when"], "load_before": d["load_before"],
                             "load_after": d["load_after"], "settings": d["settings"]})
    assert out is not None
    out["runs"] = list(cases.values())
    return out


def write_md(out: dict[str, Any], svg: Path) -> None:
    """The ``latency`` section of RESULTS.md from :func:`merged` runs."""
    from run_bench import write_section

    rows = []
    order = {e: i for i, e in enumerate(ALL_ENGINES)}
    for r in sorted(out["runs"], key=lambda r: (QUERIES.index(r["query"]), r["rate"], order[r["engine"]])):
        if "error" in r:
            rows.append(f"| {r['query']} | {r['rate']:,} | {r['engine']} | – | – | – | – | – | – | {_short_error(r['error'])} |")
            continue
        lat = r["latency_ms"]
        note = []
        if "per_event_ms" in r:
            note.append(f"from production: p50 {_ms(r['per_event_ms']['p50'])}, p99 {_ms(r['per_event_ms']['p99'])}")
        if r["basis"] == "emit":
            note.append("to emission (update mode)" if r["engine"] == "spark-rtm" and r["query"] == "window"
                        else "to emission")
        if r["missing"]:
            note.append(f"{r['missing']:,} of {r['measured']:,} without a result")
        if r.get("file_wait_ms") is not None:
            note.append(f"file wait {r['file_wait_ms']:.0f}")
        if r.get("run_file"):
            note.append(f"rerun {out['files'][r['run_file']]['when'][:16]}")
        if r["check"].get("repeat_not_first"):
            note.append(f"{r['check']['repeat_not_first']:,} uids' row was a repeat, not the first event")
        bad = {k: v for k, v in r["check"].items() if v and k not in ("windows", "repeat_not_first")}
        if bad:
            note.append(f"check: {bad}")
        rows.append(
            f"| {r['query']} | {r['rate']:,} | {r['engine']} | {r['produced_eps']:,.0f} / {_eps(r['consumed_eps'])} "
            f"| {_ms(lat['p50'])} | {_ms(lat['p99'])} | {_ms(lat['max'])} | {'yes' if r['kept_up'] else '**no**'} "
            f"| {_ms(r['batch_ms_median'])} | {'; '.join(note)} |")
    unavailable = "".join(f"\n\n{e}: {why}" for e, why in out["unavailable"].items())
    runs = "; ".join(
        f"{'run' if i == 0 else 'rerun'} {f['when'][:16]} (`bench/{f['path']}`, {f['settings']['seconds']:.0f} s "
        f"measured per case after {f['settings']['warmup']:.0f} s of warm-up, each engine and query first run "
        f"{f['settings'].get('prewarm', 0):.0f} s unmeasured; load average (1, 5, 15 min) "
        f"{f['load_before']} before, {f['load_after']} after)" for i, f in enumerate(out["files"]))
    generated = (
        f"Spark {out.get('spark', '?')}, {out['machine']['cpus']} cores; {runs}.\n\n"
        "| query | events/s | engine | produced / consumed per s | p50 ms | p99 ms | max ms | kept up "
        "| median batch ms | notes |\n|---|---:|---|---|---:|---:|---:|---|---:|---|\n" + "\n".join(rows)
        + f"\n\n![latency against rate]({svg.relative_to(HERE)}){unavailable}"
    )
    write_section(
        ("<!-- latency:start -->", "<!-- latency:end -->"),
        ("<!-- latency-table:start -->", "<!-- latency-table:end -->"),
        generated,
        "## End-to-end latency at fixed rates (`bench/latency.py`, issue #24)\n\n"
        "**Measures** the time from an event's production to the commit of the epoch (micro-batch) whose "
        "output holds its result, with events produced at fixed rates of wall time into three queries: "
        "a count per key per tumbling 1 s window (watermark delay 200 ms), a dedup (first event per uid, "
        "10 s) and an interval join of bids with their auctions. Definitions, sources and what each engine "
        "reads: the docstring of `bench/latency.py`.\n\n"
        "**Reproduce:** `python bench/latency.py --engines eddyline,eddyline-files,eddyline-resident,spark,spark-rtm,flink` "
        "(rates 1,000 / 10,000 / 50,000 events/s, 20 s each after 8 s of warm-up, every query, each engine and "
        "query first run 30 s unmeasured so that a JVM's code is compiled, as in a query that runs for hours; "
        "PyFlink needs the virtualenv `bench/nexmark/run_nexmark.py --engines flink` makes). About 50 minutes.\n\n",
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_produce":
        produce_main(json.loads(sys.argv[2]))
    else:
        main()
