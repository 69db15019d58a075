"""The parts of the fault matrix: the input, the network, the faults, the verifier.

**Input.** ``n`` JSON records ``{"seq", "key", "ts"}`` in a NATS JetStream stream, ``seq`` = 1..n
(unique and increasing), ``key`` = a hash of ``seq`` over 13 keys, ``ts`` = 2026-01-01 + 5 ms × seq.
The Kafka cells read the same records from a Kafka topic of two partitions (odd and even ``seq``).

**Network.** The stream, read ``per_epoch`` sequences an epoch (one epoch a second), goes

* as it is (``seq, key, ts``) into a files sink, a PostgreSQL table (append) and a NATS stream;
* through a tumbling 2 s window per key (``n`` = count, ``s`` = sum(seq), ``lo`` / ``hi`` =
  min / max(seq)) into a files sink, a PostgreSQL table (append) and a NATS stream.

The Kafka cells' network reads the topic and writes a files sink and a Kafka topic of each
(``kafka`` sinks: one transaction an epoch); a ``read_committed`` reader reads those back. Tansu,
the broker, hands aborted transactions' records to such readers too (docs/perf-notes.md): the
reader keeps, of each epoch, the records of the sink's last attempt only (its
``eddyline-attempt`` header) and the cell's notes say how many it dropped.

A relocation drill moves 2 random key groups every third epoch (``control.chaos``), so epochs 3, 6,
9, ... change the routing: the lanes that receive a group load its state from the checkpoint.

**Verifier.** Every sink is read back (files with pyarrow, PostgreSQL with psycopg, NATS with
nats-py, the reference client) and checked against what the input makes, computed here in
Python: every raw sink must hold each sequence number exactly once; every window sink must hold
each window once, with its count, sum, min and max of sequence numbers (a lost record lowers a
count, a duplicated one raises it; a window written twice counts its records twice). And every sink
must equal the same sink of an uninterrupted reference run. Append-only sinks everywhere, so a
duplicate cannot hide in an upsert.

**Recovery time.** A thread watches ``<checkpoint>/commits/`` while a cell runs and notes each
commit's ``committed_at``; a cell's recovery time is from the moment the fault began to the first
commit after what it took away is back (for a server, the imposed outage is part of it and
reported beside; for a driver, a new driver's start, i.e. its Spark session, is part of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def code_root() -> Path:
    """Where the ``eddyline`` this process imported lives: the drivers run there (the cwd comes
    first on their and their Python workers' module path), so they run the same code."""
    import eddyline

    return Path(eddyline.__file__).resolve().parents[1]

# ---------------------------------------------------------------------------- the input

T0_MS = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
STEP_MS = 5
KEYS = 13
WINDOW_MS = 2_000
SCHEMA = "seq long, key long, ts timestamp"
#: routing changes (random key-group moves) every this many epochs
MOVE_EVERY = 3

Window = tuple[int, int, int, int, int, int, int, int]  # key, start, end (ms), n, s, lo, hi, revision


def key_of(seq: int) -> int:
    return seq * 7919 % KEYS


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def publish_input(url: str, stream: str, n: int) -> None:
    """Publish records 1..n to ``stream`` (created if missing; subject ``<stream>.in``)."""
    from eddyline.io.natswire import DEDUP_WINDOW_MS, NatsConnection, ensure_stream

    subject = f"{stream}.in"
    with NatsConnection(url) as conn:
        ensure_stream(conn, stream, [subject], DEDUP_WINDOW_MS)
        for lo in range(1, n + 1, 10_000):
            conn.publish([
                (subject, f"seq/{s}",
                 json.dumps({"seq": s, "key": key_of(s), "ts": iso(T0_MS + s * STEP_MS)}).encode())
                for s in range(lo, min(n, lo + 9_999) + 1)
            ])
        held = conn.stream_info(stream)["state"]["messages"]
    if held != n:
        raise RuntimeError(f"input stream {stream} holds {held} messages, expected {n}")


def publish_kafka_input(bootstrap: str, topic: str, n: int) -> None:
    """Records 1..n to ``topic`` (created with two partitions), keyed by ``key``, odd and even
    sequence numbers in a partition each: an epoch reads the partitions evenly, so their event
    times stay together (the windows' watermark has no delay: a partition ahead of the other
    would make the other's records late)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # (kept: a client gone aborts its requests)
    for f in admin.create_topics([NewTopic(topic, 2)]).values():
        f.result()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for s in range(1, n + 1):
        producer.produce(topic, json.dumps({"seq": s, "key": key_of(s), "ts": iso(T0_MS + s * STEP_MS)}).encode(),
                         str(key_of(s)).encode(), partition=s % 2)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError(f"input topic {topic}: the broker did not take every record")


def expected_windows(n: int) -> list[Window]:
    """Every window the input makes, computed without Eddyline."""
    acc: dict[tuple[int, int], list[int]] = {}
    for s in range(1, n + 1):
        start = (T0_MS + s * STEP_MS) // WINDOW_MS * WINDOW_MS
        a = acc.setdefault((key_of(s), start), [0, 0, s, s])
        a[0] += 1
        a[1] += s
        a[3] = s
    return sorted((k, w, w + WINDOW_MS, c, total, lo, hi, 0) for (k, w), (c, total, lo, hi) in acc.items())


# ---------------------------------------------------------------------------- the network


@dataclass(frozen=True)
class Outputs:
    """Where one run writes: a directory, two PostgreSQL tables, two NATS streams."""

    directory: Path
    name: str  # [a-z0-9_]: tables <name>_raw / _win, streams <NAME>RAW / WIN

    @property
    def tables(self) -> dict[str, str]:
        return {"raw": f"{self.name}_raw", "win": f"{self.name}_win"}

    @property
    def streams(self) -> dict[str, str]:
        return {"raw": f"{self.name.upper()}RAW", "win": f"{self.name.upper()}WIN"}

    @property
    def topics(self) -> dict[str, str]:
        return {"raw": f"{self.name}-raw", "win": f"{self.name}-win"}


@dataclass(frozen=True)
class Setup:
    """What every run of one matrix shares: the servers' addresses and the input."""

    nats_url: str
    pg_url: str
    input_stream: str
    n: int
    per_epoch: int = 2_000
    trigger_ms: int = 1_000
    kafka: str | None = None  # the broker's bootstrap address: the Kafka cells' network
    input_topic: str = "seqin"


def network(setup: Setup, out: Outputs) -> dict[str, Any]:
    def sinks(kind: str, step: str) -> list[dict[str, Any]]:
        if setup.kafka:
            return [
                {"name": f"{kind}_files", "input": step, "files": {"path": str(out.directory / kind), "format": "parquet"}},
                {"name": f"{kind}_kafka", "input": step,
                 "kafka": {"brokers": setup.kafka, "topic": out.topics[kind], "key": ["key"], "partitions": 2,
                           "wait": "60s"}},
            ]
        return [
            {"name": f"{kind}_files", "input": step, "files": {"path": str(out.directory / kind), "format": "parquet"}},
            {"name": f"{kind}_pg", "input": step,
             "postgres": {"url": setup.pg_url, "table": out.tables[kind], "mode": "append", "retry_for": "60s"}},
            {"name": f"{kind}_nats", "input": step,
             "nats": {"url": setup.nats_url, "stream": out.streams[kind], "subject": f"{out.streams[kind]}.out",
                      "wait": "60s"}},
        ]

    source = ({"kafka": {"brokers": setup.kafka, "topics": [setup.input_topic], "schema": SCHEMA, "wait": "60s"}}
              if setup.kafka else
              {"nats": {"url": setup.nats_url, "stream": setup.input_stream, "schema": SCHEMA, "wait": "60s"}})
    return {
        "name": "fault-matrix", "trigger": setup.trigger_ms, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "seqs", "max_rows_per_epoch": setup.per_epoch, **source}],
        "steps": [
            {"name": "rows", "input": "seqs", "select": ["seq", "key", "ts"]},
            {"name": "windows", "input": "seqs", "window_aggregate": {
                "key": "key", "time": "ts", "window": {"size": f"{WINDOW_MS // 1000}s"}, "watermark_delay": "0s",
                "aggregates": {"n": "count(*)", "s": "sum(seq)", "lo": "min(seq)", "hi": "max(seq)"}}},
        ],
        "sinks": sinks("raw", "rows") + sinks("win", "windows"),
        "control": {"chaos": {"random_moves": 2, "every": MOVE_EVERY, "seed": 7}},
    }


def write_spec(path: Path, setup: Setup, out: Outputs) -> Path:
    path.write_text(yaml.safe_dump(network(setup, out)))
    return path


# ---------------------------------------------------------------------------- reading the sinks


def _ms(v: Any) -> int:
    if isinstance(v, str):
        v = datetime.fromisoformat(v)
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return round(v.timestamp() * 1000)
    raise TypeError(f"not a timestamp: {v!r}")


def _window(r: dict[str, Any]) -> Window:
    return (int(r["key"]), _ms(r["window_start"]), _ms(r["window_end"]), int(r["n"]), int(r["s"]),
            int(r["lo"]), int(r["hi"]), int(r["revision"]))


def _raw(r: dict[str, Any]) -> tuple[int, int, int]:
    return int(r["seq"]), int(r["key"]), _ms(r["ts"])


def read_files(directory: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for f in sorted(directory.glob("epoch=*/*.parquet")):
        rows.extend(pq.read_table(f).to_pylist())
    return rows


def read_table(url: str, table: str) -> list[dict[str, Any]]:
    import psycopg

    with psycopg.connect(url) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, r, strict=True)) for r in cur]


def read_stream(url: str, stream: str) -> list[dict[str, Any]]:
    """Every message of ``stream``, read with nats-py (duplicates stay visible)."""

    async def read() -> list[bytes]:
        import nats

        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            # the sink's subjects only: not its fence messages (eddyline.io.jetstream)
            info = await js.stream_info(stream, subjects_filter=f"{stream}.>")
            total = sum((info.state.subjects or {}).values())
            out: list[bytes] = []
            if total:
                from nats.js.api import AckPolicy, ConsumerConfig

                config = ConsumerConfig(ack_policy=AckPolicy.NONE, inactive_threshold=60.0)
                sub = await js.pull_subscribe(f"{stream}.>", stream=stream, config=config)
                while len(out) < total:
                    out.extend(m.data for m in await sub.fetch(min(5_000, total - len(out)), timeout=10))
                await sub.unsubscribe()
            return out
        finally:
            await nc.close()

    return [json.loads(m) for m in asyncio.run(read())]


def read_topic(bootstrap: str, topic: str) -> tuple[list[dict[str, Any]], int]:
    """The records of ``topic`` a ``read_committed`` reader sees, less those of aborted attempts
    (see the module), as rows; and how many were dropped as aborted."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{os.getpid()}-{time.monotonic_ns()}",
                  "isolation.level": "read_committed", "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        if not parts:
            raise RuntimeError(f"no topic {topic}")
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        records, eof, last = [], set(), time.monotonic()
        while len(eof) < len(parts) and time.monotonic() - last < 10:
            for m in c.consume(1000, 0.2):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                    continue
                last = time.monotonic()
                h = {k: v.decode() for k, v in m.headers() or []}
                records.append((m.partition(), m.offset(), h.get("eddyline-epoch"), h.get("eddyline-attempt"), m.value()))
    finally:
        c.close()
    # an attempt is superseded when a later record (in some partition) belongs to another attempt at its epoch
    superseded: set[tuple[str | None, str | None]] = set()
    for part in parts:
        seen: list[tuple[str | None, str | None]] = []
        for _, _, epoch, attempt, _ in sorted(r for r in records if r[0] == part):
            if seen and seen[-1] != (epoch, attempt):
                superseded.update(x for x in seen if x[0] == epoch and x[1] != attempt)
            seen.append((epoch, attempt))
    kept = [json.loads(r[4]) for r in records if (r[2], r[3]) not in superseded]
    return kept, len(records) - len(kept)


@dataclass
class SinkRows:
    """One run's outputs, in canonical form."""

    raw: dict[str, list[tuple[int, int, int]]]  # sink kind -> (seq, key, ts ms), sorted
    win: dict[str, list[Window]]  # sink kind -> windows, sorted
    aborted: int = 0  # Kafka sinks: records of aborted attempts dropped (see read_topic)


def read_outputs(setup: Setup, out: Outputs) -> SinkRows:
    aborted = [0]

    def topic(kind: str) -> list[dict[str, Any]]:
        assert setup.kafka is not None
        rows, dropped = read_topic(setup.kafka, out.topics[kind])
        aborted[0] += dropped
        return rows

    def each(kind: str) -> dict[str, list[dict[str, Any]]]:
        got: dict[str, list[dict[str, Any]]] = {}
        readers = ((("files", lambda: read_files(out.directory / kind)), ("kafka", lambda: topic(kind)))
                   if setup.kafka else
                   (("files", lambda: read_files(out.directory / kind)),
                    ("pg", lambda: read_table(setup.pg_url, out.tables[kind])),
                    ("nats", lambda: read_stream(setup.nats_url, out.streams[kind]))))
        for where, read in readers:
            try:
                got[where] = read()
            except Exception as e:  # a sink that wrote nothing (its table or stream missing)
                got[where] = []
                print(f"  reading {kind}_{where}: {type(e).__name__}: {e}", file=sys.stderr)
        return got

    raw = {k: sorted(_raw(r) for r in rows) for k, rows in each("raw").items()}
    win = {k: sorted(_window(r) for r in rows) for k, rows in each("win").items()}
    return SinkRows(raw, win, aborted[0])


# ---------------------------------------------------------------------------- zombie writes


def zombie_writes(setup: Setup, out: Outputs, ckpt: Path) -> int | None:
    """What the drivers the lease was taken from wrote, visibly, after it was taken: files
    epochs their generation published (the epoch's ``_generation``, the directory's change time),
    rows of ``eddyline_epochs`` (its ``generation``, ``committed_at``), NATS messages (the
    ``Eddyline-Generation`` header, the server's time). None: nobody took a lease over."""
    leases = sorted((ckpt / "lease").glob("*.json")) if (ckpt / "lease").is_dir() else []
    if len(leases) < 2 or setup.kafka:  # (the Kafka cells kill drivers and brokers: nobody takes a lease from a live one)
        return None
    taken = json.loads(leases[1].read_text())["acquired_at"]  # generation 2 took it from 1 (the cells' case)
    count = 0
    for kind in ("raw", "win"):
        for d in (out.directory / kind).glob("epoch=*"):
            marker = d / "_generation"
            if marker.exists() and marker.read_text() == "1" and d.stat().st_ctime > taken:
                count += 1
    import psycopg

    checkpoint = json.loads((ckpt / "metadata.json").read_text())["id"]
    with psycopg.connect(setup.pg_url, autocommit=True) as conn:
        (has,) = conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('eddyline_epochs') "
                              "AND attname = 'generation'").fetchone()
        if has:  # (no table, or none written under a lease: nothing to count)
            (rows,) = conn.execute(
                "SELECT count(*) FROM eddyline_epochs WHERE checkpoint = %s AND generation = 1 AND committed_at > "
                "to_timestamp(%s)", (checkpoint, taken)).fetchone()
            count += rows
    for stream in out.streams.values():
        count += sum(1 for headers, at in _headers(setup.nats_url, stream)
                     if headers.get("Eddyline-Generation") == "1" and at > taken)
    return count


def _headers(url: str, stream: str) -> list[tuple[dict[str, str], float]]:
    """(headers, time stored) of every message in ``stream``."""

    async def read() -> list[tuple[dict[str, str], float]]:
        import nats
        from nats.js.errors import NotFoundError

        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except NotFoundError:  # a sink that wrote nothing
                return []
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1) if info.state.messages else []:
                m = await js.get_msg(stream, seq)
                out.append((dict(m.headers or {}), _seconds(m.time)))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def _seconds(when: Any) -> float:
    """A message's stored time (nats-py gives a datetime, or its RFC 3339 text) as Unix seconds."""
    if isinstance(when, datetime):
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    text = str(when).rstrip("Z")
    head, _, frac = text.partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00" if frac else f"{head}+00:00").timestamp()


# ---------------------------------------------------------------------------- the verifier


@dataclass
class SinkCheck:
    sink: str
    rows: int
    lost: int  # sequence numbers the sink lacks
    duplicated: int  # sequence numbers it holds more than once
    wrong: int  # rows the input cannot make
    identical: bool  # equal to the reference run's sink

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.wrong == 0 and self.identical


def check_raw(sink: str, rows: list[tuple[int, int, int]], n: int, reference: list | None) -> SinkCheck:
    seen = Counter(r[0] for r in rows)
    wrong = sum(1 for s, k, t in rows if not (1 <= s <= n and k == key_of(s) and t == T0_MS + s * STEP_MS))
    return SinkCheck(
        sink, len(rows),
        lost=sum(1 for s in range(1, n + 1) if s not in seen),
        duplicated=sum(c - 1 for c in seen.values() if c > 1),
        wrong=wrong,
        identical=reference is None or rows == reference,
    )


def check_windows(sink: str, rows: list[Window], expected: list[Window], reference: list | None) -> SinkCheck:
    want = {w[:3]: w for w in expected}
    got: dict[tuple[int, int, int], int] = Counter()
    wrong = 0
    for w in rows:
        if w[:3] not in want or w != want[w[:3]]:
            wrong += 1
        got[w[:3]] += w[3]
    lost = sum(max(0, w[3] - got.get(k, 0)) for k, w in want.items())
    dup = sum(max(0, c - want[k][3]) if k in want else c for k, c in got.items())
    return SinkCheck(sink, len(rows), lost=lost, duplicated=dup, wrong=wrong,
                     identical=reference is None or rows == reference)


def verify(got: SinkRows, n: int, expected: list[Window], reference: SinkRows | None) -> list[SinkCheck]:
    out = [check_raw(f"raw_{k}", rows, n, reference.raw.get(k) if reference else None) for k, rows in got.raw.items()]
    out += [check_windows(f"win_{k}", rows, expected, reference.win.get(k) if reference else None)
            for k, rows in got.win.items()]
    return out


# ---------------------------------------------------------------------------- processes


def descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


class Driver:
    """``eddyline run --until-idle`` in a subprocess, its stderr in ``<dir>/<name>.err``."""

    def __init__(self, name: str, directory: Path, spec: Path, ckpt: Path, master: str, lease_s: float,
                 *extra: str):
        self.name = name
        self.errfile = directory / f"{name}.err"
        self.progress = directory / f"{name}.jsonl"
        cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec), "--checkpoint", str(ckpt), "--until-idle",
               "--no-live", "--master", master, "--lease-timeout", str(lease_s), "--progress-json",
               str(self.progress), *extra]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        with self.errfile.open("w") as err, (directory / f"{name}.out").open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=code_root(), env=env)
        self.started = time.time()
        self.tree: set[int] = set()  # the processes it started (its JVM, Spark's Python workers)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def err(self) -> str:
        return self.errfile.read_text(errors="replace")

    def last_error(self) -> str:
        lines = [x for x in self.err().splitlines() if x.strip()]
        for x in reversed(lines):
            if x.startswith(("error", "Error")) or "Error" in x or "taken over" in x:
                return x.strip()[:240]
        return lines[-1].strip()[:240] if lines else ""

    def progress_records(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        return [json.loads(x) for x in self.progress.read_text().splitlines() if x.strip()]

    def remember_tree(self) -> None:
        self.tree.update(p.pid for p in descendants(self.pid))

    def signal(self, sig: int) -> None:
        self.remember_tree()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def stopped(self) -> bool:
        import psutil

        try:
            return psutil.Process(self.pid).status() == psutil.STATUS_STOPPED
        except psutil.NoSuchProcess:
            return False

    def end(self) -> None:
        """Kill what is left of it (after a failed cell): the driver and the processes it started."""
        import psutil

        self.remember_tree()
        for pid in [self.pid, *self.tree]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class Watch(threading.Thread):
    """Notes every plan and commit of a checkpoint as it appears (the engine deletes old ones)."""

    def __init__(self, ckpt: Path):
        super().__init__(daemon=True, name="fault-watch")
        self.ckpt = ckpt
        self.commits: dict[int, dict[str, Any]] = {}  # epoch -> committed_at, generation, end_of_stream
        self.plans: dict[int, float] = {}  # epoch -> when first seen
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.scan()
            time.sleep(0.03)

    def scan(self) -> None:
        for p in list((self.ckpt / "plans").glob("*.json")) if (self.ckpt / "plans").exists() else []:
            e = int(p.name[:-5]) if p.name[:-5].isdigit() else None
            if e is not None and e not in self.plans:
                self.plans[e] = time.time()
        for p in list((self.ckpt / "commits").glob("*.json")) if (self.ckpt / "commits").exists() else []:
            e = int(p.name[:-5]) if p.name[:-5].isdigit() else None
            if e is None or e in self.commits:
                continue
            try:
                c = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            self.commits[e] = {"at": float(c["committed_at"]), "generation": int(c.get("generation", 0)),
                               "end_of_stream": bool(c.get("end_of_stream"))}

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.scan()

    @property
    def last_commit(self) -> int:
        return max(self.commits, default=0)

    def first_commit_after(self, t: float) -> tuple[int, float] | None:
        after = [(c["at"], e) for e, c in self.commits.items() if c["at"] > t]
        if not after:
            return None
        at, e = min(after)
        return e, at


class CellError(Exception):
    """The cell could not be run as intended (not a finding about Eddyline)."""


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str,
               alive: Callable[[], bool] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise CellError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        if alive is not None and not alive():
            raise CellError(f"gave up waiting for {what}: the process it needs ended")
        time.sleep(0.02)


# ---------------------------------------------------------------------------- servers


class Servers:
    """The NATS server and PostgreSQL under the matrix (``eddyline.io.local.LocalNats`` and
    ``LocalPostgres``, started), and the faults applied to them. Both come back on the same port
    (NATS) or socket (PostgreSQL) with the same store."""

    def __init__(self, nats: Any, pg: Any, kafka: Any = None):
        self.nats, self.pg = nats, pg
        self.kafka = kafka  # LocalTansu, its log on an S3 server, for the Kafka cells

    def pg_processes(self) -> list[Any]:
        """The postmaster and every backend (from ``postmaster.pid``)."""
        import psutil

        try:
            master = psutil.Process(int((Path(self.pg.directory) / "data" / "postmaster.pid").read_text().split()[0]))
            return [master, *master.children(recursive=True)]
        except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
            return []

    def pg_signal(self, sig: int) -> int:
        import psutil

        procs = self.pg_processes()
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT if sig == signal.SIGKILL else sig)
                if sig == signal.SIGKILL:
                    p.kill()
        if sig == signal.SIGKILL:
            psutil.wait_procs(procs, timeout=10)
        return len(procs)

    def pg_up(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.pg.url, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:
            return False

    def heal(self) -> None:
        """After a cell: both servers running and not stopped, whatever the cell left."""
        if self.nats.proc is not None and self.nats.proc.poll() is None:
            self.nats.resume()
        else:
            self.nats.kill()
            self.nats.start()
        if self.kafka is not None:
            if self.kafka.proc is not None and self.kafka.proc.poll() is None:
                self.kafka.resume()
            else:
                self.kafka.kill()
                self.kafka.start()
        self.pg_signal(signal.SIGCONT)
        if not self.pg_up():
            self.pg_signal(signal.SIGKILL)
            self.pg.restart()
