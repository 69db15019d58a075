"""PyFlink for ``bench/latency.py``: the same three queries as Flink SQL on the same JSON-lines
files Structured Streaming reads (one file per 100 ms of production, renamed in whole).

It runs in the PyFlink virtualenv that ``bench/nexmark/run_nexmark.py`` makes (``apache-flink``
pins versions that clash with PySpark's): ``$XDG_CACHE_HOME`` (or ``~/.cache``)
``/eddyline-bench/flink-venv``. When that does not exist, ``bench/latency.py`` reports PyFlink
as not run (``python bench/nexmark/run_nexmark.py --engines flink`` makes it).

The job: a ``TableEnvironment`` in streaming mode on the local mini-cluster, parallelism 2, a
``filesystem`` source of ``format = json`` that lists the directory every 100 ms
(``source.monitor-interval``), event time = production time with the same watermark delay,
``pipeline.auto-watermark-interval`` 50 ms, sources idle after 500 ms (the join's watermark
trails by 10 s, like Structured Streaming's: Flink's interval join drops rows behind the
watermark, and with 200 ms 15 % of the bids at 50,000 events/s had no result, presumably
dropped as late, its two file readers being out of step; the watermark does not delay the join's output). Queries: a ``TUMBLE``
window count per key; the first row per uid (``ROW_NUMBER() OVER (PARTITION BY uid ORDER BY
PROCTIME())``, state kept 10 s); an interval join of bids with auctions (``B.ts BETWEEN A.ts
AND A.ts + 10 s``). Flink works record by record and has no epoch to commit: the sink is
``print`` and each row carries ``CURRENT_TIMESTAMP`` (evaluated per record in streaming mode,
millisecond precision) taken in the last operator before it, so Flink's latency is to the
*emission* of a row, like Real-Time Mode's. An exactly-once Flink sink (the filesystem sink)
makes its rows visible only when a checkpoint completes, which would add up to the checkpoint
interval to these figures.

``python latency_flink.py --query window --dir DIR --watermark-ms 200`` (in the PyFlink
virtualenv) runs the job until it is killed; it prints ``@@running`` once the job is submitted,
then the print sink's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNNING = "@@running"
TTL_S = 10
#: the job is stopped once the producer ended and it printed nothing for this long (a lagging
#: job may pause for a few seconds: a shorter wait cut off its last rows)
QUIET_S = 5.0


def flink_venv() -> Path:
    """Where ``bench/nexmark/run_nexmark.py`` keeps the PyFlink virtualenv."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "eddyline-bench" / "flink-venv"


def unavailable() -> str | None:
    python = flink_venv() / "bin" / "python"
    if not python.exists():
        return (f"not run: no PyFlink virtualenv at {flink_venv()} (python bench/nexmark/run_nexmark.py "
                "--engines flink makes it)")
    return None


# ----------------------------------------------------------------------------- in .venv
def start_job(script: Path, args: list[str], tmp: Path) -> subprocess.Popen[bytes]:
    """``script`` (a job of :func:`submit`) in the PyFlink virtualenv, with none of this
    environment's Python or Spark settings, in a session of its own (its JVM with it): what it
    prints goes to ``tmp/flink.out``, its log to ``tmp/flink.log``. Returns once the job runs."""
    printed, log = tmp / "flink.out", tmp / "flink.log"
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    with printed.open("wb") as out, log.open("wb") as err:
        job = subprocess.Popen([str(flink_venv() / "bin" / "python"), str(script), *args],
                               stdout=out, stderr=err, env=env, start_new_session=True)
    deadline = time.monotonic() + 180
    while RUNNING not in printed.read_text(errors="replace"):
        if job.poll() is not None or time.monotonic() > deadline:
            _stop(job)
            raise RuntimeError(f"the Flink job did not start: {log.read_text()[-1500:]}")
        time.sleep(0.2)
    return job


def run(ctx: Any, query: str, rate: int, tmp: Path) -> dict[str, Any]:
    """One run, called by ``bench/latency.py``: starts the job, then the producer; stops the job
    once the producer ended and the job printed nothing for :data:`QUIET_S` (or after ``--drain``)."""
    import numpy as np
    import pandas as pd
    from latency import TAIL_S, Producer, Until, _file_wait_ms

    indir, printed = tmp / "in", tmp / "flink.out"
    indir.mkdir()
    job = start_job(Path(__file__), ["--query", query, "--dir", str(indir), "--watermark-ms", str(ctx.args.watermark_ms)],
                    tmp)
    producer = Producer(rate, ctx.args.warmup + ctx.args.seconds + TAIL_S,
                        {"mode": "files", "dir": str(indir), "file_ms": ctx.args.file_ms}, tmp)
    try:
        producer.start()
        grown = [0, time.monotonic()]

        def quiet() -> int:  # nothing printed for QUIET_S: count every event as read
            size = printed.stat().st_size
            if size != grown[0]:
                grown[:] = [size, time.monotonic()]
            return producer.total if time.monotonic() - grown[1] >= QUIET_S else 0

        until = Until(producer, quiet, ctx.args.drain)
        until.wait(failed=lambda: "the Flink job ended" if job.poll() is not None else None)
    finally:
        producer.stop()
        _stop(job)
    summary, log = producer.result()
    rows = parse(printed.read_text(errors="replace"), query)
    return {"summary": summary, "log": log, "rows": rows if len(rows) else pd.DataFrame({"emit_us": np.zeros(0)}),
            "drained_s": None, "inputs": None, "batches": None, "batch_ms_median": None,
            "source": f"JSON files, one per {ctx.args.file_ms} ms", "basis": "emit",
            "file_wait_ms": _file_wait_ms(log)}


def _stop(job: subprocess.Popen[bytes]) -> None:
    """Stop the job's process group (its Python and its JVM)."""
    if job.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            return
        try:
            job.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


COLUMNS = {"window": ["key", "first_us", "n", "emitted"], "dedup": ["seq", "uid", "produced_us", "emitted"],
           "join": ["seq", "produced_us", "emitted"]}


def parse(text: str, query: str) -> Any:
    """The print sink's lines (``[subtask> ]+I[v1, v2, ...]``) as a frame with ``emit_us``."""
    import pandas as pd

    names = COLUMNS[query]
    rows = [line[line.index("[") + 1: line.rindex("]")].split(", ") for line in text.splitlines()
            if "+I[" in line]
    df = pd.DataFrame(rows, columns=names)
    for c in names[:-1]:
        df[c] = df[c].astype("int64")
    df["emit_us"] = (pd.to_datetime(df.pop("emitted"), format="%Y-%m-%d %H:%M:%S.%f", utc=True)
                     .astype("int64") // 1000)
    if query == "window":  # the window's start from the first event in it (windows start at whole seconds)
        df["window_start"] = df.pop("first_us") // 1_000_000 * 1_000_000
    return df


# ----------------------------------------------------------------------------- in the PyFlink venv
def sql(query: str, directory: str, watermark_ms: int) -> list[str]:
    # the join's watermark trails by the join's 10 s, as Structured Streaming's does: an interval
    # join drops a row behind the watermark, and the two readers of the files are not in step
    if query == "join":
        watermark_ms = TTL_S * 1000
    emitted = "DATE_FORMAT(CURRENT_TIMESTAMP, 'yyyy-MM-dd HH:mm:ss.SSS')"
    source = f"""CREATE TABLE events (
        seq BIGINT, kind STRING, `key` BIGINT, uid BIGINT, auction BIGINT, price BIGINT, produced_us BIGINT,
        ts AS TO_TIMESTAMP_LTZ(produced_us / 1000, 3),
        proc AS PROCTIME(),
        WATERMARK FOR ts AS ts - INTERVAL '{watermark_ms / 1000:.3f}' SECOND
    ) WITH ('connector' = 'filesystem', 'path' = '{directory}', 'format' = 'json',
            'source.monitor-interval' = '100 ms')"""
    columns = {"window": "`key` BIGINT, first_us BIGINT, n BIGINT, emitted STRING",
               "dedup": "seq BIGINT, uid BIGINT, produced_us BIGINT, emitted STRING",
               "join": "seq BIGINT, produced_us BIGINT, emitted STRING"}[query]
    sink = f"CREATE TABLE results ({columns}) WITH ('connector' = 'print')"
    if query == "window":
        insert = f"""INSERT INTO results SELECT `key`, MIN(produced_us), COUNT(*), {emitted}
            FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND))
            GROUP BY `key`, window_start, window_end"""
    elif query == "dedup":
        insert = f"""INSERT INTO results SELECT seq, uid, produced_us, {emitted} FROM (
            SELECT seq, uid, produced_us, ROW_NUMBER() OVER (PARTITION BY uid ORDER BY proc ASC) AS rn
            FROM events) WHERE rn = 1"""
    else:
        insert = f"""INSERT INTO results SELECT B.seq, B.produced_us, {emitted}
            FROM events A, events B
            WHERE A.kind = 'a' AND B.kind = 'b' AND A.auction = B.auction
              AND B.ts BETWEEN A.ts AND A.ts + INTERVAL '{TTL_S}' SECOND"""
    return [source, sink, insert]


def job_main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--query", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--watermark-ms", type=int, default=200)
    args = ap.parse_args()
    submit(sql(args.query, args.dir, args.watermark_ms),
           {"pipeline.auto-watermark-interval": "50 ms", "table.exec.source.idle-timeout": "500 ms",
            "table.exec.state.ttl": f"{TTL_S} s"})


def submit(statements: list[str], settings: dict[str, str]) -> None:
    """In the PyFlink virtualenv: a streaming job on the local mini-cluster (parallelism 2, UTC,
    and ``settings``) of ``statements``, the last its ``INSERT``; prints :data:`RUNNING` once it
    is submitted, then runs until it is killed."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    for key, value in {"parallelism.default": "2", "table.local-time-zone": "UTC", **settings}.items():
        config.set(key, value)
    *ddl, insert = statements
    for statement in ddl:
        env.execute_sql(statement)
    result = env.execute_sql(insert)
    print(RUNNING, json.dumps({"job": str(result.get_job_client().get_job_id())}), flush=True)
    result.wait()


if __name__ == "__main__":
    sys.exit(job_main())
