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

The driver feeds the lanes in one of two ways: the rows of one step at a time, keyed by the
driver (:meth:`ResidentStage.run`: ``bench/resident.py`` and ``bench/state_growth.py`` measure
the lanes so), or the epoch's plan only, each lane then reading its share of the sources and
exchanging rows with the others over connections of their own (:meth:`ResidentStage.run_network`,
:class:`Peers`, :mod:`eddyline.runtime.lanenetwork`: the engine's resident mode).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa

from eddyline import objectstore
from eddyline.columns import KG, PROBE
from eddyline.errors import TASK_MARK as MARK
from eddyline.hashing import spark_xxhash64_of_columns
from eddyline.operators.base import Kernel, KernelResult
from eddyline.runtime.faults import FaultPoint, Faults, NoFaults
from eddyline.runtime.lanes import _Tally as Tally
from eddyline.runtime.lanes import chain_rows, memory_bytes, process, slices
from eddyline.state.inplace import InPlaceState, local
from eddyline.state.store import Chain, KeyGroupStore, StateCache, with_chains
from eddyline.storage import Gate, makedirs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eddyline.runtime.lanenetwork import LaneNetwork

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


def split_by_lane(rows: pa.Table, owners: np.ndarray, lanes: int) -> dict[int, pa.Table]:
    """``rows`` (with ``_kg``) cut by the lane ``owners`` gives their key group, each lane's
    rows in their order in ``rows``; every lane has a part, empty or not."""
    if lanes == 1:
        return {0: rows}
    lane_of = owners[rows.column(KG).to_numpy()] if rows.num_rows else np.zeros(0, np.int64)
    order = np.argsort(lane_of, kind="stable")
    bounds = np.searchsorted(lane_of[order], np.arange(lanes + 1))
    ordered = rows.take(order)
    return {lane: ordered.slice(bounds[lane], bounds[lane + 1] - bounds[lane]) for lane in range(lanes)}


def spread_rows(rows: pa.Table, key_groups: int, fragments: Mapping[int, int]) -> pa.Table:
    """SPREADFIRE as the per-epoch job's shuffle does it (:func:`eddyline.runtime.shuffle.spread`),
    on ``rows`` (with ``_kg``, key groups in ``[0, key_groups)``): a row of a group split into
    ``n = fragments[g]`` fragments is stored in fragment ``pmod(xxhash64(its other columns, in
    order), n)`` (Spark's hash of the row's content, so either mode chooses the same fragment)
    and sent as a probe copy (``_probe`` true) to every other; fragment ``f`` is the virtual key
    group ``g + key_groups * f``. Every row gains ``_probe``; one of a group that is not split
    stays as it is (false)."""
    n = rows.num_rows
    count = np.ones(key_groups, np.int64)
    for g, f in fragments.items():
        count[g] = f
    kgs = rows.column(KG).to_numpy(zero_copy_only=False).astype(np.int64) if n else np.zeros(0, np.int64)
    copies = count[kgs]
    home = np.zeros(n, np.int64)
    hot = copies > 1
    if hot.any():
        content = rows.filter(pa.array(hot))
        home[hot] = np.mod(spark_xxhash64_of_columns(*[content.column(c) for c in rows.column_names if c != KG]),
                           copies[hot])
    take = np.repeat(np.arange(n), copies)
    frag = np.arange(take.size) - np.repeat(np.cumsum(copies) - copies, copies)
    out = rows.take(pa.array(take, pa.int64()))
    out = out.set_column(out.schema.get_field_index(KG), pa.field(KG, pa.int32()),
                         pa.array((kgs[take] + key_groups * frag).astype(np.int32)))
    return out.append_column(pa.field(PROBE, pa.bool_()), pa.array(frag != home[take]))


# ----------------------------------------------------------------------------- the lanes' side


@dataclass(frozen=True)
class ResidentStep:
    """One stateful step the lanes of a stage run: its kernel and routing table."""

    name: str
    kernel: Kernel
    routing: tuple[int, ...]  # virtual key group -> lane
    #: the key groups split by SPREADFIRE and their fragments (:func:`spread_rows`), and K
    spread: tuple[tuple[int, int], ...] = ()
    key_groups: int = 0


@dataclass(frozen=True)
class ResidentLanes:
    """What every task of a resident stage is given (pickled once, with the stage). Lane ``i``
    of the stage is lane ``i`` of every step it runs."""

    steps: tuple[ResidentStep, ...]
    checkpoint: str
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
    #: the whole network, for epochs the lanes run from their own reads
    #: (:meth:`ResidentStage.run_network`); None: the driver feeds each step's rows (:meth:`ResidentStage.run`)
    network: LaneNetwork | None = None
    #: the lanes' memory budget for state (bytes a lane; None: a lane holds all of its state):
    #: as a per-epoch lane does, a lane keeps at most half of it cached and works through its key
    #: groups in slices of at most the other half, loaded from the state files and written back
    state_budget: int | None = None


def serve(lanes: ResidentLanes, _rows: Iterator[Any]) -> Iterator[Any]:
    """The body of one task of the barrier stage (``mapPartitions``): its lane, until the
    driver says stop or goes away."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    lane, count = ctx.partitionId(), len(ctx.getTaskInfos())
    objectstore.adopt(lanes.store)
    # lanes that exchange rows listen for each other; the driver tells every lane the addresses
    # (the barrier's own allGather answers only on a poll of a second)
    listen = socket.create_server(("", 0)) if lanes.network is not None and count > 1 else None
    host = ctx.getTaskInfos()[lane].address.rsplit(":", 1)[0] or socket.gethostname()
    try:
        with socket.create_connection(lanes.address, timeout=60) as conn:
            conn.settimeout(None)  # an epoch may be long in coming
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            src, out = conn.makefile("rb"), conn.makefile("wb")
            send(out, {"op": "hello", "lane": lane, "secret": lanes.secret, "pid": os.getpid(),
                       **({"peer": [host, listen.getsockname()[1]]} if listen is not None else {})})
            Lane(lanes, lane, listen).serve(src, out)
    finally:
        if listen is not None:
            listen.close()
    yield from ()


class Peers:
    """A lane's connections to the other lanes of its stage, for the rows of the stateful steps'
    key groups: one connection to send to each lane, one to receive from each, the receiving
    ones drained by a thread each into a queue, so that a lane sending never waits for another
    to read (all send, then all receive, with no deadlock). ``addresses``: every lane's, by lane,
    as the driver gathered them; ``listen``: this lane's listening socket."""

    def __init__(self, secret: str, lane: int, addresses: Sequence[Sequence[Any]], listen: socket.socket,
                 connect_s: float = 60.0):
        self.lane, self.lanes = lane, len(addresses)
        self.queues: dict[int, queue.Queue[tuple[dict[str, Any], pa.Table | None]]] = {
            j: queue.Queue() for j in range(self.lanes) if j != lane}
        self._out: dict[int, tuple[socket.socket, BinaryIO]] = {}
        self._in: dict[int, socket.socket] = {}
        try:
            for j, (peer_host, port) in enumerate(addresses):
                if j != lane:
                    conn = socket.create_connection((peer_host, int(port)), timeout=connect_s)
                    conn.settimeout(None)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._out[j] = (conn, conn.makefile("wb"))
                    send(self._out[j][1], {"op": "peer", "lane": lane, "secret": secret})
            listen.settimeout(connect_s)
            while len(self._in) < self.lanes - 1:
                conn, _ = listen.accept()
                conn.settimeout(None)
                src = conn.makefile("rb")
                hello, _ = receive(src)
                if hello.get("op") != "peer" or hello.get("secret") != secret:
                    conn.close()  # not one of ours
                    continue
                j = int(hello["lane"])
                self._in[j] = conn
                threading.Thread(target=self._drain, args=(j, src), name=f"eddyline-lane-{lane}-from-{j}",
                                 daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _drain(self, lane: int, src: BinaryIO) -> None:
        try:
            while True:
                header, table = receive(src)
                self.queues[lane].put((header, table))
                if header["op"] == "eof":
                    return
        except (OSError, ValueError) as e:
            self.queues[lane].put(({"op": "eof", "error": str(e)}, None))

    def exchange(self, epoch: int, step: str, parts: Mapping[int, pa.Table]) -> list[pa.Table]:
        """Send each lane its part of ``step``'s rows of ``epoch``; every lane's part for this
        one, in lane order (its own included)."""
        head = {"op": "rows", "epoch": epoch, "step": step, "lane": self.lane}
        for j, (_, out) in self._out.items():
            send(out, head, parts[j])
        got = []
        for j in range(self.lanes):
            if j == self.lane:
                got.append(parts[j])
                continue
            header, table = self.queues[j].get()
            if header["op"] != "rows" or header["epoch"] != epoch or header["step"] != step:
                raise PeerLost(f"resident lane {self.lane}: lane {j} sent {header}, expected step '{step}' rows "
                               f"of epoch {epoch}")
            got.append(table if table is not None else parts[j].schema.empty_table())
        return got

    def close(self) -> None:
        for conn in [*(c for c, _ in self._out.values()), *self._in.values()]:
            with contextlib.suppress(OSError):
                conn.close()


class PeerLost(RuntimeError):
    """Another lane of the stage went away or sent what it should not have."""


class _Held:
    """What a lane holds of one step: its key groups' chains and state, and the last epoch."""

    def __init__(self, lanes: ResidentLanes, step: ResidentStep):
        self.step, self.kernel = step, step.kernel
        #: with a budget the store's cache holds what the lane keeps of its state (half the
        #: budget), the rest is in the state files only; without, the lane keeps its state itself
        self.budget = lanes.state_budget
        cache = StateCache(0 if self.budget is None else self.budget // 2)
        self.store = KeyGroupStore(lanes.checkpoint, step.name, step.kernel.state_schema, step.kernel.primary_key,
                                   snapshot_every=lanes.snapshot_every, cache=cache,
                                   gate=Gate(lanes.checkpoint, lanes.generation))
        self.bytes_per_row = 0.0  # (budgeted) the state's bytes a row, as the last epoch found
        self.owners = np.asarray(step.routing)
        self.index: dict[int, Chain] = {}
        #: a local kernel's rows are held in place once they are many times an epoch's rows (an
        #: epoch then costs what it touches); below that, and for any other kernel, they are one
        #: table given whole and taken back whole, which costs less while it is small
        self.local = local(step.kernel)
        self.in_place: InPlaceState | None = None
        self.state = step.kernel.state_schema.empty_table()
        #: the rows of the last epochs and the rows they changed (their upserts): their medians
        #: choose the form (a median, so that one large epoch, a backfill, does not hold it back)
        self.recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=8)
        self.epoch = 0  # the last epoch run (or the commit the stage started from)

    def load(self, rows: pa.Table) -> None:
        self.in_place, self.state = None, rows
        self._choose()

    def _choose(self) -> None:
        """In place once the state holds IN_PLACE_FROM times an epoch's rows and CHANGED_UNDER
        times the rows an epoch changes; back to a table below a quarter of either (each switch
        costs a pass over the state, so not every epoch)."""
        if not self.local:
            return
        rows = self.rows
        batch, changed = (np.median(np.asarray(self.recent), axis=0) if self.recent else (0, 0))
        per_epoch = max(float(batch), MIN_BATCH_ROWS)
        if self.in_place is None:
            if rows >= IN_PLACE_FROM * per_epoch and rows >= CHANGED_UNDER * changed:
                self.in_place = InPlaceState(self.kernel)
                self.in_place.load(self.state)
                self.state = self.kernel.state_schema.empty_table()
        elif rows < IN_PLACE_FROM * per_epoch / 4 or rows < CHANGED_UNDER * changed / 4:
            self.state, self.in_place = self.in_place.table(), None

    @property
    def rows(self) -> int:
        return self.in_place.num_rows if self.in_place is not None else self.state.num_rows

    def process(self, batch: pa.Table, watermark_ms: int,
                advance_ms: int | None) -> tuple[KernelResult, InPlaceState | _Whole]:
        """The kernel over ``batch``; its result and the state held after it."""
        self._choose()
        if self.in_place is None:
            result = process(self.kernel, batch, self.state, watermark_ms, advance_ms)
            self.state = result.state
            held: InPlaceState | _Whole = _Whole(result.state)
        else:
            touched, where = self.in_place.touched(batch, max(watermark_ms, advance_ms or watermark_ms))
            result = process(self.kernel, batch, touched, watermark_ms, advance_ms)
            self.in_place.apply(touched, where, result)
            held = self.in_place
        self.recent.append((batch.num_rows, result.upserts.num_rows))
        return result, held


#: a local kernel's state is held in place from this many times an epoch's rows (measured: in
#: place costs a few milliseconds more an epoch than a table below ~50 times, less above)
IN_PLACE_FROM = 64
#: the fewest rows an epoch is taken to have when choosing (idle ticks would make it zero)
MIN_BATCH_ROWS = 2_000
#: ... and only while an epoch changes fewer than this share of its rows: changed rows are
#: merged into the in-place form's base when they reach a sixteenth of it, a pass over all of
#: it (about 2 s at five million rows), so that pass must come rarely (here: at most every 64 epochs)
CHANGED_UNDER = 1_024


class _Whole:
    """A state table as :class:`~eddyline.state.store.GroupedRows`."""

    def __init__(self, table: pa.Table):
        self.table, self.num_rows, self.nbytes = table, table.num_rows, table.nbytes
        self._counts: np.ndarray | None = None

    def group_counts(self) -> np.ndarray:
        """(Counted once: the store's write and the lane's manifest both ask.)"""
        if self._counts is None:
            kgs = self.table.column(KG).to_numpy(zero_copy_only=False)
            self._counts = np.bincount(kgs) if self.num_rows else np.zeros(0, np.int64)
        return self._counts

    def group_rows(self, groups: np.ndarray) -> pa.Table:
        return self.table.filter(pa.array(np.isin(self.table.column(KG).to_numpy(zero_copy_only=False), groups)))


class Lane:
    """One resident lane: the state of its key groups of every step in memory, an epoch at a time."""

    def __init__(self, lanes: ResidentLanes, lane: int, listen: socket.socket | None = None):
        self.lanes, self.lane, self.attempt = lanes, lane, lanes.attempt
        self.held = {step.name: _Held(lanes, step) for step in lanes.steps}
        self.listen = listen
        self.peers: Peers | None = None

    def serve(self, src: BinaryIO, out: BinaryIO) -> None:
        try:
            self._serve(src, out)
        finally:
            if self.peers is not None:
                self.peers.close()

    def _serve(self, src: BinaryIO, out: BinaryIO) -> None:
        while True:
            header, rows = receive(src)
            op = header["op"]
            if op in ("stop", "eof"):
                return
            if op == "load":
                if header.get("peers") and self.listen is not None:
                    self.peers = Peers(self.lanes.secret, self.lane, header["peers"], self.listen)
                self.load(int(header["after"]), {name: {int(k): v for k, v in index.items()}
                                                 for name, index in header["index"].items()})
                send(out, {"op": "loaded", "lane": self.lane,
                           "state_rows": sum(h.rows for h in self.held.values())})
            elif op == "epoch":
                done, output = self.run(header, rows)
                send(out, done, output if self.lanes.output is None else None)
            elif op == "network":
                if not self.run_network(header, out):
                    return  # (the stage has ended: the driver starts another)
            else:
                raise RuntimeError(f"{MARK} resident lane {self.lane}: unknown operation {op!r} from the driver")

    def load(self, after: int, index: Mapping[str, Mapping[int, Chain]]) -> None:
        """The lane's key groups' state of every step as of the commit of epoch ``after``."""
        for name, held in self.held.items():
            given = index.get(name, {})
            mine = [kg for kg in given if kg < held.owners.size and held.owners[kg] == self.lane]
            held.index = {kg: given[kg] for kg in mine}
            if held.budget is None:  # (with a budget each epoch loads what it works on)
                held.load(held.store.load(held.index, mine) if mine else held.kernel.state_schema.empty_table())
            held.epoch = after

    def run_network(self, header: dict[str, Any], out: BinaryIO) -> bool:
        """A whole epoch of the network from this lane's own reads (:mod:`.lanenetwork`), the
        answer sent: ``ran`` with the lane's observations and manifests, then a frame per table
        (the rows of each sink it did not write itself, the dead letters); or ``failed`` with the
        error, and False: the lane stops, its peers stop on losing it, and the stage is over."""
        network = self.lanes.network
        assert network is not None
        try:
            done = network.run(self.lane, self._lanes(), header, self._exchange, self._step,
                               f"{self.lane:05d}-a{self.attempt}")
        except Exception as e:  # told to the driver, which raises it (a SourceError, a SpecError) or starts again
            send(out, {"op": "failed", "lane": self.lane, "epoch": header.get("epoch"), "kind": type(e).__name__,
                       "peer": isinstance(e, PeerLost), "message": str(e)})
            return False
        send(out, {"op": "ran", "lane": self.lane, "epoch": int(header["epoch"]), "attempt": self.attempt,
                   "observed": done.observed, "manifests": done.manifests, "written": done.written,
                   "late": done.late, "digests": done.digests, "tables": list(done.tables)})
        for name, table in done.tables.items():
            send(out, {"op": "table", "name": name}, table)
        return True

    def _lanes(self) -> int:
        return self.peers.lanes if self.peers is not None else 1

    def _exchange(self, epoch: int, step: str, keyed: pa.Table) -> pa.Table:
        """``keyed``'s rows to the lanes that own their key groups; this lane's rows from all."""
        held = self.held[step]
        if held.step.spread:  # (a split group stays split on one lane too)
            keyed = spread_rows(keyed, held.step.key_groups, dict(held.step.spread))
        if self.peers is None:
            return keyed
        owners = held.owners
        parts = split_by_lane(keyed, owners, self.peers.lanes)
        got = self.peers.exchange(epoch, step, parts)
        return pa.concat_tables([g.select(keyed.schema.names).cast(keyed.schema) for g in got])

    def _step(self, epoch: int, name: str, rows: pa.Table, watermark_ms: int,
              advance_ms: int | None) -> tuple[dict[str, Any], pa.Table]:
        return self.run({"epoch": epoch, "step": name, "watermark_ms": watermark_ms, "advance_ms": advance_ms}, rows)

    def run(self, header: dict[str, Any], rows: pa.Table | None) -> tuple[dict[str, Any], pa.Table]:
        """One epoch of one step (``header["step"]``, or the only one): the kernel over the rows
        against the state held, the changes and the output written; the manifest and the output
        rows returned."""
        epoch = int(header["epoch"])
        name = header.get("step") or self.lanes.steps[0].name
        held = self.held[name]
        if epoch != held.epoch + 1:  # a lost or repeated epoch would be state applied wrongly
            raise RuntimeError(f"{MARK} resident lane {self.lane}: step '{name}' epoch {epoch} after epoch "
                               f"{held.epoch}; epochs must come in sequence")
        t0, c0 = time.perf_counter(), time.thread_time()
        mem0 = memory_bytes()
        kernel = held.kernel
        names = [*kernel.input_schema.names, *([PROBE] if rows is not None and PROBE in rows.column_names else [])]
        batch = kernel.input_schema.empty_table() if rows is None else rows.select(names)
        kgs = batch.column(KG).to_numpy() if batch.num_rows else np.zeros(0, np.int32)
        strays = np.unique(kgs[held.owners[kgs] != self.lane]) if kgs.size else kgs
        if strays.size:
            raise RuntimeError(f"{MARK} resident lane {self.lane}: rows of key groups {strays[:5].tolist()} "
                               "routed elsewhere")
        if held.budget is not None:
            return self._run_sliced(held, epoch, batch, kgs, int(header["watermark_ms"]), header.get("advance_ms"))
        result, state = held.process(batch, int(header["watermark_ms"]), header.get("advance_ms"))
        t1 = time.perf_counter()
        file_id = attempt_file_id(self.lane, self.attempt)
        written = held.store.write(epoch, file_id, held.index, state, result.upserts, result.deletes,
                                   result.changed_key_groups)
        t2 = time.perf_counter()
        if self.lane == 0 and name == self.lanes.steps[-1].name:
            self.lanes.faults.reached(FaultPoint.IN_TASK, epoch)
        output = None
        if result.output.num_rows and self.lanes.output is not None:
            output = f"{self.lanes.output}/{epoch:010d}/{self.lane:04d}-a{self.attempt}.arrow"
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, result.output.schema) as writer:
                writer.write_table(result.output)
            makedirs(held.store.fs, output.rsplit("/", 1)[0])
            held.store.gate.put(output, sink.getvalue().to_pybytes())
        t3 = time.perf_counter()
        held.index = {int(k): v for k, v in with_chains(held.index, written.chains).items()}
        held.epoch = epoch
        in_counts = np.bincount(kgs) if kgs.size else np.zeros(0, np.int64)
        state_counts = state.group_counts()
        # the fields of a per-epoch lane's manifest the fold and the controller read
        # (eddyline.runtime.lanes, eddyline.control.stats.step_load)
        return {
            "op": "done", "epoch": epoch, "step": name, "lane": self.lane, "attempt": self.attempt,
            "chains": {str(k): v for k, v in written.chains.items()},
            "input_rows": batch.num_rows, "output_rows": result.output.num_rows, "output": output,
            "state_rows": state.num_rows, "state_bytes": state.nbytes,
            "bytes_written": written.bytes_written, "snapshots": written.snapshots, "deltas": written.deltas,
            "metrics": {k: int(v) for k, v in result.metrics.items()},
            "kg_rows": {str(k): int(in_counts[k]) for k in np.flatnonzero(in_counts)},
            "kg_state_rows": {str(k): int(state_counts[k]) for k in np.flatnonzero(state_counts)},
            **({"kg_cost": {str(g): int(c) for g, c in result.kg_cost.items()}} if result.kg_cost else {}),
            "key_groups": len(held.index), "pid": os.getpid(),
            # every key group's state is in the lane's memory: none is loaded
            "cache_hits": len(held.index), "cache_misses": 0, "cache_bytes": state.nbytes,
            # (the state held, as of before and after the epoch: the reading after it is the peak
            # but for the kernel's and the write's passing use)
            "memory": {"start": mem0, "received": mem0, "peak": memory_bytes()},
            "ms": {"kernel": round((t1 - t0) * 1000, 3), "write": round((t2 - t1) * 1000, 3),
                   "output": round((t3 - t2) * 1000, 3)},
            "cpu_ms": {"lane": round((time.thread_time() - c0) * 1000, 3)},
        }, result.output


    def _run_sliced(self, held: _Held, epoch: int, batch: pa.Table, kgs: np.ndarray, watermark_ms: int,
                    advance_ms: int | None) -> tuple[dict[str, Any], pa.Table]:
        """One epoch of a step within the state budget, as a per-epoch lane runs it
        (:func:`eddyline.runtime.lanes.slices`): the key groups with state or rows in slices whose
        state fits half the budget, each loaded (from the cache or the files), run and written
        (a file a slice), then let go; the manifest says how much state was not kept in memory."""
        c0 = time.thread_time()
        assert held.budget is not None
        name, kernel, store = held.step.name, held.kernel, held.store
        mem = {"start": memory_bytes()}
        in_counts = np.bincount(kgs) if kgs.size else np.zeros(0, np.int64)
        groups = sorted(set(held.index) | set(np.flatnonzero(in_counts).tolist()))
        if not held.bytes_per_row and held.index:  # (a new stage) one key group's state tells the size of a row
            kg = max(held.index, key=lambda g: chain_rows(held.index[g]))
            probe = store.load(held.index, [kg])
            held.bytes_per_row = probe.nbytes / probe.num_rows if probe.num_rows else 0.0
            del probe
        work = slices(groups, {kg: chain_rows(held.index[kg]) for kg in held.index}, held.bytes_per_row,
                      held.budget // 2)
        if len(work) > 1:  # slices are ranges of key groups: the rows sorted by key group to cut them out
            order = np.argsort(kgs, kind="stable")
            batch, kgs = batch.take(order), kgs[order]
        if len(work) >= 1 << (_ATTEMPT_SHIFT - 16):
            raise RuntimeError(f"{MARK} resident lane {self.lane}: step '{name}' needs {len(work)} slices for its "
                               f"state budget; at most {(1 << (_ATTEMPT_SHIFT - 16)) - 1} name their files")
        tally = Tally(np.zeros(0, np.int64), np.zeros(0, np.int64))
        outputs, peak = [], dict(mem["start"])
        hits0, misses0 = store.cache.hits, store.cache.misses
        for part, group in enumerate(work):
            lo, hi = (np.searchsorted(kgs, group[0], "left"), np.searchsorted(kgs, group[-1], "right")) \
                if len(work) > 1 else (0, batch.num_rows)
            t_a = time.perf_counter()
            state = store.load(held.index, [kg for kg in group if kg in held.index])
            t_b, c_b = time.perf_counter(), time.thread_time()
            result = process(kernel, batch.slice(lo, hi - lo), state, watermark_ms, advance_ms)
            t_c = time.perf_counter()
            tally.kernel_cpu += time.thread_time() - c_b
            written = store.write(epoch, attempt_file_id(self.lane, self.attempt) | (part << 16), held.index,
                                  result.state, result.upserts, result.deletes, result.changed_key_groups)
            tally.ms["load"] += t_b - t_a
            tally.ms["kernel"] += t_c - t_b
            tally.ms["write"] += time.perf_counter() - t_c
            tally.add(result, written)
            outputs.append(result.output)
            del state, result
            if len(work) > 1:
                pa.default_memory_pool().release_unused()
            now = memory_bytes()
            peak = {k: max(peak[k], now[k]) for k in peak}
        if self.lane == 0 and name == self.lanes.steps[-1].name:
            self.lanes.faults.reached(FaultPoint.IN_TASK, epoch)
        held.index = {int(k): v for k, v in with_chains(held.index, tally.chains).items()}
        held.epoch = epoch
        held.bytes_per_row = tally.state_bytes / tally.state_rows if tally.state_rows else held.bytes_per_row
        output = pa.concat_tables(outputs) if outputs else kernel.output_schema.empty_table()
        kept = store.cache.resident_bytes(store.root, store.step, [int(k) for k in tally.kg_state])
        return {
            "op": "done", "epoch": epoch, "step": name, "lane": self.lane, "attempt": self.attempt,
            "input_rows": batch.num_rows, **tally.manifest(), "output": None,
            "kg_rows": {str(k): int(in_counts[k]) for k in np.flatnonzero(in_counts)},
            "key_groups": len(groups), "pid": os.getpid(), "slices": len(work),
            "cache_hits": store.cache.hits - hits0, "cache_misses": store.cache.misses - misses0,
            "cache_bytes": store.cache.used, "spilled_bytes": max(0, tally.state_bytes - kept),
            "memory": {"start": mem["start"], "received": mem["start"], "peak": peak},
            "ms": {k: round(v * 1000, 3) for k, v in tally.ms.items()},
            "cpu_ms": {"lane": round((time.thread_time() - c0) * 1000, 3), "kernel": round(tally.kernel_cpu * 1000, 3)},
        }, output


# ----------------------------------------------------------------------------- the driver's side


class StageEnded(RuntimeError):
    """The resident stage is gone (a task failed, the job was cancelled, a connection broke):
    start a new one from the last commit."""


class LaneFailed(StageEnded):
    """A lane could not run an epoch; ``kind`` is the name of its error's type (the stage is over:
    that lane has stopped)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def checked(done: list[dict[str, Any]], attempt: int, epoch: int, step: str | None = None) -> list[dict[str, Any]]:
    """The lanes' manifests of ``epoch`` (of ``step``), if every one is of stage attempt
    ``attempt``, that epoch and that step: only those may reach a commit (:class:`StageEnded`
    otherwise)."""
    for d in done:
        if d.get("attempt") != attempt or d.get("epoch") != epoch or (step is not None and d.get("step") != step):
            raise StageEnded(f"resident lane {d.get('lane')} answered for attempt {d.get('attempt')}, epoch "
                             f"{d.get('epoch')}, step {d.get('step')!r}; expected attempt {attempt}, epoch {epoch}"
                             + (f", step {step!r}" if step is not None else ""))
    return done


class ResidentStage:
    """The driver's end of a resident stage of ``lanes`` lanes running ``steps``: started with the
    state indexes (by step) of the commit of epoch ``after``, then fed one epoch of one step at a
    time by :meth:`run`, each step's epochs in sequence. (An epoch that continues from an earlier
    commit than the one before it, a correction of tentative epochs, starts a stage with that
    commit's indexes and ``after`` the epoch before it.)"""

    def __init__(self, spark: SparkSession, *, steps: Sequence[ResidentStep], checkpoint: str, lanes: int,
                 output: str | None, attempt: int, after: int = 0, index: Mapping[str, Mapping[int, Chain]] | None = None,
                 generation: int = 0, host: str = "127.0.0.1", connect_s: float = 120.0, faults: Faults | None = None,
                 network: LaneNetwork | None = None, state_budget: int | None = None):
        self.lanes = lanes
        self.owners = {step.name: np.asarray(step.routing) for step in steps}
        for name, owners in self.owners.items():
            if owners.size and int(owners.max()) >= lanes:
                raise ValueError(f"step '{name}': the routing table names lane {int(owners.max())} of a stage of {lanes}")
        self._server = socket.create_server((host, 0))
        self._server.settimeout(1.0)
        self.spec = ResidentLanes(steps=tuple(steps), checkpoint=checkpoint,
                                  address=(host, self._server.getsockname()[1]), secret=secrets.token_hex(16),
                                  attempt=attempt, output=output, generation=generation, faults=faults or NoFaults(),
                                  network=network, state_budget=state_budget)
        self.error: BaseException | None = None
        self._spark = spark
        self._job = threading.Thread(target=self._run_job, name="eddyline-resident-stage", daemon=True)
        self._job.start()
        self._conns: dict[int, tuple[socket.socket, BinaryIO, BinaryIO]] = {}
        self.pids: dict[int, int] = {}
        self._peers: dict[int, list[Any]] = {}  # each lane's address for the others (network stages)
        try:
            self._accept(connect_s)
            for lane, (_, _, out) in self._conns.items():
                mine = {name: {str(kg): chain for kg, chain in (index or {}).get(name, {}).items() if owners[kg] == lane}
                        for name, owners in self.owners.items()}
                peers = [self._peers[i] for i in range(lanes)] if len(self._peers) == lanes else None
                send(out, {"op": "load", "after": after, "index": mine, **({"peers": peers} if peers else {})})
            for lane, (_, src, _) in self._conns.items():
                self._expect(lane, src, "loaded")
        except BaseException:
            self.close()
            raise
        self.epochs = dict.fromkeys(self.owners, after)  # per step, the last epoch run

    @property
    def epoch(self) -> int:
        """The last epoch every step ran."""
        return min(self.epochs.values())

    def _run_job(self) -> None:
        import functools

        sc = self._spark.sparkContext
        sc.addJobTag(JOB_TAG)
        try:
            sc.setJobDescription(f"eddyline resident lanes of {', '.join(s.name for s in self.spec.steps)}")
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
            if hello.get("peer"):
                self._peers[lane] = hello["peer"]

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

    def run(self, epoch: int, rows: pa.Table, watermark_ms: int, advance_ms: int | None = None,
            step: str | None = None) -> list[dict[str, Any]]:
        """Epoch ``epoch`` of ``step`` (or the only one): its rows (with ``_kg``) to their lanes;
        their manifests, by lane (with their output under ``"table"`` when they send it back)."""
        name = step or next(iter(self.owners))
        if epoch != self.epochs[name] + 1:
            raise ValueError(f"step '{name}': epoch {epoch} after epoch {self.epochs[name]}: a resident stage runs "
                             "a step's epochs in sequence")
        header = {"op": "epoch", "epoch": epoch, "step": name, "watermark_ms": watermark_ms, "advance_ms": advance_ms}
        try:
            parts = split_by_lane(rows, self.owners[name], self.lanes)
            for lane, (_, _, out) in self._conns.items():  # every lane gets the epoch, rows or not: its tick
                send(out, header, parts[lane])
        except OSError as e:
            raise StageEnded(f"sending epoch {epoch}: {e}") from e
        done = checked([self._expect(lane, src, "done") for lane, (_, src, _) in sorted(self._conns.items())],
                       self.spec.attempt, epoch, name)
        self.epochs[name] = epoch
        return done

    def run_network(self, epoch: int, order: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Epoch ``epoch`` of every step, run by the lanes from ``order``, what each of them is
        told of it (the plan's slices, watermarks and more: :meth:`.lanenetwork.LaneNetwork.run`
        says what it reads): each lane's answer, in lane order, with its observations, its
        manifests (by step, checked), the parts it wrote (of sinks, of late targets), the digests
        asked for and its tables (under ``"tables"``, by name). :class:`LaneFailed` if a lane
        could not run it."""
        if self.spec.network is None:
            raise ValueError("this stage's lanes were not given the network")
        for name, last in self.epochs.items():
            if epoch != last + 1:
                raise ValueError(f"step '{name}': epoch {epoch} after epoch {last}: a resident stage runs a step's "
                                 "epochs in sequence")
        header = {"op": "network", "epoch": epoch, **order}
        try:
            for _, _, out in self._conns.values():
                send(out, header)
        except OSError as e:
            raise StageEnded(f"sending epoch {epoch}: {e}") from e
        answers, failed = [], []
        for lane, (_, src, _) in sorted(self._conns.items()):
            try:
                answer, _ = receive(src)
            except (OSError, ValueError) as e:
                raise StageEnded(f"resident lane {lane}: {e}") from e
            if answer.get("op") == "failed":
                failed.append(answer)
                continue
            if answer.get("op") != "ran":
                self._job.join(5.0)
                raise StageEnded(f"resident lane {lane} answered {answer.get('op')!r} to epoch {epoch}"
                                 + (f": {self.error}" if self.error is not None else ""))
            tables = {}
            for name in answer["tables"]:
                tables[name] = self._expect(lane, src, "table")["table"]
            answer["tables"] = tables
            answers.append(answer)
        if failed:  # the lane that failed first, not the ones that then lost it
            first = next((f for f in failed if not f.get("peer")), failed[0])
            raise LaneFailed(f"resident lane {first['lane']}, epoch {epoch}: {first['message']}", first["kind"])
        for name in self.epochs:
            checked([a["manifests"][name] for a in answers], self.spec.attempt, epoch, name)
            self.epochs[name] = epoch
        return answers

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
