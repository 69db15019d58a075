"""Resident lanes: the lanes of a stateful step as the tasks of one long-lived Spark stage.

An epoch of the per-epoch-job engine is a Spark job: planning it, scheduling its stages and
handing its rows to Python cost 100–150 ms on a 2-core machine before a row is processed
(docs/perf-notes.md, "What is left of a small epoch"). Here the lanes' tasks start once, as one
*barrier* stage (all of its tasks run at once or none does), and then serve epoch after epoch
that the driver sends them over a socket:

1. each task connects back to the driver's :class:`ResidentStage`, names its lane and stage
   attempt and the stage's secret, and receives its key groups' state index as of the commit the
   stage starts from, which it loads once;
2. per epoch it receives its rows (Arrow IPC) with the epoch's number and watermarks, refuses an
   epoch out of sequence, runs the step's kernel against the state it holds, writes the changed
   key groups' new versions and the epoch's output to files that name the epoch, the lane and
   the stage attempt, and acknowledges with the lane's manifest (the new chains and counts);
3. the driver folds the acknowledgements into its commit, as it does the per-epoch lanes'
   manifest files.

The state a task holds is a cache of committed state only in so far as the driver commits what
it acknowledged: after a failure (a task, the socket, the driver) the stage ends and a new one
starts from the last commit, reloading. What a stage of an aborted attempt wrote is never named
by a commit, since its file names carry the attempt.

This module is the prototype of issue #55 (its item 3): one stateful step, the rows keyed by the
driver, no stateless steps around it. ``bench/resident.py`` measures it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa

from eddyline import objectstore
from eddyline.columns import KG
from eddyline.errors import TASK_MARK as MARK
from eddyline.operators.base import Kernel
from eddyline.runtime.faults import FaultPoint, Faults, NoFaults
from eddyline.runtime.lanes import process
from eddyline.state.store import Chain, KeyGroupStore, StateCache, with_chains
from eddyline.storage import Gate, makedirs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the Spark job tag of a resident stage's job (cancelled when the stage ends early)
JOB_TAG = "eddyline-resident"

#: a stage attempt's files sit beside the per-epoch lanes' files: its id in the file names is
#: the lane in the low 16 bits (the slices of :func:`~eddyline.runtime.lanes.state_file_id` use
#: bits 16–23) and the attempt, counted from 1, above them
_ATTEMPT_SHIFT = 24


def next_attempt(checkpoint: str, gate: Gate | None = None, limit: int = (1 << 7) - 1) -> int:
    """A stage attempt number no stage on ``checkpoint`` had before (from 1): the lowest free one,
    claimed by creating ``resident/attempt-<n>`` exclusively, so two drivers (or a driver and its
    restart) never write under the same attempt's names."""
    gate = gate or Gate(checkpoint)
    folder = f"{gate.base}/resident"
    makedirs(gate.fs, folder)
    for n in range(1, limit + 1):
        if gate.put(f"{folder}/attempt-{n}", b"", exclusive=True):
            return n
    raise RuntimeError(f"{checkpoint}: all {limit} resident stage attempts are used; clean resident/ up")


def attempt_file_id(lane: int, attempt: int) -> int:
    """The id of the state file lane ``lane`` of stage attempt ``attempt`` (from 1) writes."""
    if not 0 <= lane < 1 << 16 or not 0 < attempt < 1 << 7:
        raise ValueError(f"lane {lane} / attempt {attempt} out of range for a resident state file id")
    return lane | (attempt << _ATTEMPT_SHIFT)


# ----------------------------------------------------------------------------- the wire
# A frame: two big-endian uint32 (header bytes, body bytes), a JSON header, an Arrow IPC
# stream (empty body: no table).


def send(out: BinaryIO, header: Mapping[str, Any], table: pa.Table | None = None) -> None:
    head = json.dumps(header, separators=(",", ":")).encode()
    body = b""
    if table is not None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        body = sink.getvalue().to_pybytes()
    out.write(struct.pack("!II", len(head), len(body)) + head + body)
    out.flush()


def receive(src: BinaryIO) -> tuple[dict[str, Any], pa.Table | None]:
    """The next frame (``({"op": "eof"}, None)`` once the other side closed the connection)."""
    prefix = src.read(8)
    if len(prefix) < 8:
        return {"op": "eof"}, None
    n_head, n_body = struct.unpack("!II", prefix)
    header = json.loads(_exactly(src, n_head))
    table = pa.ipc.open_stream(_exactly(src, n_body)).read_all() if n_body else None
    return header, table


def _exactly(src: BinaryIO, n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise ConnectionError(f"the connection ended {n - len(data)} bytes into a frame of {n}")
    return data


# ----------------------------------------------------------------------------- the lanes' side


@dataclass(frozen=True)
class ResidentLanes:
    """What every task of a resident stage is given (pickled once, with the stage)."""

    step: str
    checkpoint: str
    kernel: Kernel
    routing: tuple[int, ...]  # virtual key group -> lane
    address: tuple[str, int]  # the driver's stage server
    secret: str
    #: the driver's count of the stages it started on this checkpoint, from 1: the lanes' files
    #: carry it. Should Spark retry the stage by itself, the retried tasks find the driver no
    #: longer accepting (its connections to the first tasks broke: the stage has ended), so no
    #: two tasks ever write under one attempt's names.
    attempt: int
    #: the lanes write epoch <e>'s output to <output>/<e>/<lane>-a<attempt>.arrow; None: they send
    #: it back with their acknowledgement (the engine's resident mode, whose sinks write it)
    output: str | None
    snapshot_every: int = 8
    generation: int = 0
    store: dict[str, str] = field(default_factory=objectstore.settings)
    #: told when lane 0 has written an epoch's state (:attr:`FaultPoint.IN_TASK`), as a per-epoch
    #: lane tells it: crash tests cut the epoch there
    faults: Faults = field(default_factory=NoFaults)


def serve(lanes: ResidentLanes, _rows: Iterator[Any]) -> Iterator[Any]:
    """The body of one task of the barrier stage (``mapPartitions``): its lane, until the
    driver says stop or goes away."""
    from pyspark import BarrierTaskContext

    lane = BarrierTaskContext.get().partitionId()
    objectstore.adopt(lanes.store)
    with socket.create_connection(lanes.address, timeout=60) as conn:
        conn.settimeout(None)  # an epoch may be long in coming
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        src, out = conn.makefile("rb"), conn.makefile("wb")
        send(out, {"op": "hello", "lane": lane, "secret": lanes.secret, "pid": os.getpid()})
        Lane(lanes, lane).serve(src, out)
    yield from ()


class Lane:
    """One resident lane: the state of its key groups in memory, an epoch at a time."""

    def __init__(self, lanes: ResidentLanes, lane: int):
        self.lanes, self.lane, self.attempt = lanes, lane, lanes.attempt
        kernel = lanes.kernel
        # a cache of its own: the lane keeps its state itself, the store needs none
        self.store = KeyGroupStore(lanes.checkpoint, lanes.step, kernel.state_schema, kernel.primary_key,
                                   snapshot_every=lanes.snapshot_every, cache=StateCache(0),
                                   gate=Gate(lanes.checkpoint, lanes.generation))
        self.owners = np.asarray(lanes.routing)
        self.index: dict[int, Chain] = {}
        self.state = kernel.state_schema.empty_table()
        self.epoch = 0  # the last epoch served (or the commit the stage started from)
        self._output: pa.Table | None = None  # the last epoch's output, sent back with its manifest

    def serve(self, src: BinaryIO, out: BinaryIO) -> None:
        while True:
            header, rows = receive(src)
            op = header["op"]
            if op in ("stop", "eof"):
                return
            if op == "load":
                self.load(int(header["after"]), {int(k): v for k, v in header["index"].items()})
                send(out, {"op": "loaded", "lane": self.lane, "state_rows": self.state.num_rows})
            elif op == "epoch":
                done = self.run(header, rows)
                send(out, done, self._output if self.lanes.output is None else None)
            else:
                raise RuntimeError(f"{MARK} resident lane {self.lane}: unknown operation {op!r} from the driver")

    def load(self, after: int, index: dict[int, Chain]) -> None:
        """The lane's key groups' state as of the commit of epoch ``after``."""
        mine = [kg for kg in index if kg < self.owners.size and self.owners[kg] == self.lane]
        self.index = {kg: index[kg] for kg in mine}
        self.state = self.store.load(self.index, mine) if mine else self.lanes.kernel.state_schema.empty_table()
        self.epoch = after

    def run(self, header: dict[str, Any], rows: pa.Table | None) -> dict[str, Any]:
        """One epoch: the kernel over the rows against the state held, the changes and the
        output written, the manifest returned."""
        epoch = int(header["epoch"])
        if epoch != self.epoch + 1:  # a lost or repeated epoch would be state applied wrongly
            raise RuntimeError(f"{MARK} resident lane {self.lane}: epoch {epoch} after epoch {self.epoch}; "
                               "epochs must come in sequence")
        t0, c0 = time.perf_counter(), time.thread_time()
        kernel = self.lanes.kernel
        batch = kernel.input_schema.empty_table() if rows is None else rows.select(kernel.input_schema.names)
        kgs = batch.column(KG).to_numpy() if batch.num_rows else np.zeros(0, np.int32)
        strays = np.unique(kgs[self.owners[kgs] != self.lane]) if kgs.size else kgs
        if strays.size:
            raise RuntimeError(f"{MARK} resident lane {self.lane}: rows of key groups {strays[:5].tolist()} "
                               "routed elsewhere")
        result = process(kernel, batch, self.state, int(header["watermark_ms"]), header.get("advance_ms"))
        t1 = time.perf_counter()
        file_id = attempt_file_id(self.lane, self.attempt)
        written = self.store.write(epoch, file_id, self.index, result.state, result.upserts, result.deletes,
                                   result.changed_key_groups)
        t2 = time.perf_counter()
        if self.lane == 0:
            self.lanes.faults.reached(FaultPoint.IN_TASK, epoch)
        output = None
        if result.output.num_rows and self.lanes.output is not None:
            output = f"{self.lanes.output}/{epoch:010d}/{self.lane:04d}-a{self.attempt}.arrow"
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, result.output.schema) as writer:
                writer.write_table(result.output)
            makedirs(self.store.fs, output.rsplit("/", 1)[0])
            self.store.gate.put(output, sink.getvalue().to_pybytes())
        t3 = time.perf_counter()
        self.index = {int(k): v for k, v in with_chains(self.index, written.chains).items()}
        self.state = result.state
        self.epoch = epoch
        self._output = result.output
        in_counts = np.bincount(kgs) if kgs.size else np.zeros(0, np.int64)
        state_counts = (np.bincount(result.state.column(KG).to_numpy(zero_copy_only=False)) if result.state.num_rows
                        else np.zeros(0, np.int64))
        # the fields of a per-epoch lane's manifest the fold and the controller read
        # (eddyline.runtime.lanes, eddyline.control.stats.step_load)
        return {
            "op": "done", "epoch": epoch, "lane": self.lane, "attempt": self.attempt,
            "chains": {str(k): v for k, v in written.chains.items()},
            "input_rows": batch.num_rows, "output_rows": result.output.num_rows, "output": output,
            "state_rows": result.state.num_rows, "state_bytes": result.state.nbytes,
            "bytes_written": written.bytes_written, "snapshots": written.snapshots, "deltas": written.deltas,
            "metrics": {k: int(v) for k, v in result.metrics.items()},
            "kg_rows": {str(k): int(in_counts[k]) for k in np.flatnonzero(in_counts)},
            "kg_state_rows": {str(k): int(state_counts[k]) for k in np.flatnonzero(state_counts)},
            **({"kg_cost": {str(g): int(c) for g, c in result.kg_cost.items()}} if result.kg_cost else {}),
            "key_groups": len(self.index), "pid": os.getpid(),
            # every key group's state is in the lane's memory: none is loaded
            "cache_hits": len(self.index), "cache_misses": 0, "cache_bytes": result.state.nbytes,
            "ms": {"kernel": round((t1 - t0) * 1000, 3), "write": round((t2 - t1) * 1000, 3),
                   "output": round((t3 - t2) * 1000, 3)},
            "cpu_ms": {"lane": round((time.thread_time() - c0) * 1000, 3)},
        }


# ----------------------------------------------------------------------------- the driver's side


class StageEnded(RuntimeError):
    """The resident stage is gone (a task failed, the job was cancelled, a connection broke):
    start a new one from the last commit."""


def checked(done: list[dict[str, Any]], attempt: int, epoch: int) -> list[dict[str, Any]]:
    """The lanes' manifests of ``epoch``, if every one is of stage attempt ``attempt`` and that
    epoch: only those may reach a commit (:class:`StageEnded` otherwise)."""
    for d in done:
        if d.get("attempt") != attempt or d.get("epoch") != epoch:
            raise StageEnded(f"resident lane {d.get('lane')} answered for attempt {d.get('attempt')}, epoch "
                             f"{d.get('epoch')}; expected attempt {attempt}, epoch {epoch}")
    return done


class ResidentStage:
    """The driver's end of a resident stage of ``lanes`` lanes: started with the state index of
    the commit of epoch ``after``, then fed one epoch at a time by :meth:`run`."""

    def __init__(self, spark: SparkSession, *, step: str, checkpoint: str, kernel: Kernel, routing: tuple[int, ...],
                 lanes: int, output: str, attempt: int, after: int = 0, index: Mapping[int, Chain] | None = None,
                 generation: int = 0, host: str = "127.0.0.1", connect_s: float = 120.0, faults: Faults | None = None):
        self.lanes = lanes
        self.owners = np.asarray(routing)
        if self.owners.size and int(self.owners.max()) >= lanes:
            raise ValueError(f"the routing table names lane {int(self.owners.max())} of a stage of {lanes}")
        self._server = socket.create_server((host, 0))
        self._server.settimeout(1.0)
        self.spec = ResidentLanes(step=step, checkpoint=checkpoint, kernel=kernel, routing=tuple(routing),
                                  address=(host, self._server.getsockname()[1]), secret=secrets.token_hex(16),
                                  attempt=attempt, output=output, generation=generation, faults=faults or NoFaults())
        self.error: BaseException | None = None
        self._spark = spark
        self._job = threading.Thread(target=self._run_job, name="eddyline-resident-stage", daemon=True)
        self._job.start()
        self._conns: dict[int, tuple[socket.socket, BinaryIO, BinaryIO]] = {}
        self.pids: dict[int, int] = {}
        try:
            self._accept(connect_s)
            for lane, (_, _, out) in self._conns.items():
                mine = {str(kg): chain for kg, chain in (index or {}).items() if self.owners[kg] == lane}
                send(out, {"op": "load", "after": after, "index": mine})
            for lane, (_, src, _) in self._conns.items():
                self._expect(lane, src, "loaded")
        except BaseException:
            self.close()
            raise
        self.epoch = after

    def _run_job(self) -> None:
        import functools

        sc = self._spark.sparkContext
        sc.addJobTag(JOB_TAG)
        try:
            sc.setJobDescription(f"eddyline resident lanes of step {self.spec.step}")
            sc.parallelize(range(self.lanes), self.lanes).barrier().mapPartitions(
                functools.partial(serve, self.spec)).collect()
        except BaseException as e:  # the stage failed or was cancelled: the driver's next read says so
            self.error = e
        finally:
            sc.removeJobTag(JOB_TAG)

    def _accept(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self._conns) < self.lanes:
            if self.error is not None or not self._job.is_alive():
                raise StageEnded(f"the resident stage ended before its lanes connected: {self.error}")
            if time.monotonic() > deadline:
                raise StageEnded(f"{len(self._conns)} of {self.lanes} resident lanes connected in {timeout_s:.0f} s")
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            src, out = conn.makefile("rb"), conn.makefile("wb")
            hello, _ = receive(src)
            if hello.get("secret") != self.spec.secret or hello.get("op") != "hello":
                conn.close()  # not one of ours
                continue
            lane = int(hello["lane"])
            self._conns[lane] = (conn, src, out)
            self.pids[lane] = int(hello["pid"])

    def _expect(self, lane: int, src: BinaryIO, op: str) -> dict[str, Any]:
        """The lane's next answer, which must be ``op`` (a table sent with it under ``"table"``)."""
        try:
            header, table = receive(src)
        except (OSError, ValueError) as e:
            raise StageEnded(f"resident lane {lane}: {e}") from e
        if header.get("op") != op:
            self._job.join(5.0)
            raise StageEnded(f"resident lane {lane} answered {header.get('op')!r}, expected {op!r}"
                             + (f": {self.error}" if self.error is not None else ""))
        if table is not None:
            header["table"] = table
        return header

    def run(self, epoch: int, rows: pa.Table, watermark_ms: int, advance_ms: int | None = None) -> list[dict[str, Any]]:
        """Epoch ``epoch``'s rows (with ``_kg``) to their lanes; their manifests, by lane."""
        if epoch != self.epoch + 1:
            raise ValueError(f"epoch {epoch} after epoch {self.epoch}: a resident stage runs epochs in sequence")
        lane_of = self.owners[rows.column(KG).to_numpy()] if rows.num_rows else np.zeros(0, np.int64)
        header = {"op": "epoch", "epoch": epoch, "watermark_ms": watermark_ms, "advance_ms": advance_ms}
        try:
            if self.lanes == 1:
                parts = {0: rows}
            else:
                order = np.argsort(lane_of, kind="stable")
                bounds = np.searchsorted(lane_of[order], np.arange(self.lanes + 1))
                ordered = rows.take(order)
                parts = {lane: ordered.slice(bounds[lane], bounds[lane + 1] - bounds[lane]) for lane in range(self.lanes)}
            for lane, (_, _, out) in self._conns.items():  # every lane gets the epoch, rows or not: its tick
                send(out, header, parts[lane])
        except OSError as e:
            raise StageEnded(f"sending epoch {epoch}: {e}") from e
        done = checked([self._expect(lane, src, "done") for lane, (_, src, _) in sorted(self._conns.items())],
                       self.spec.attempt, epoch)
        self.epoch = epoch
        return done

    def close(self) -> None:
        """Stop the lanes and wait for the stage's job to end (cancelled if it does not)."""
        for conn, _, out in self._conns.values():
            with contextlib.suppress(OSError):
                send(out, {"op": "stop"})
            with contextlib.suppress(OSError):
                conn.close()
        self._conns = {}
        self._server.close()
        self._job.join(10.0)
        if self._job.is_alive():
            with contextlib.suppress(Exception):
                self._spark.sparkContext.cancelJobsWithTag(JOB_TAG)
            self._job.join(10.0)
