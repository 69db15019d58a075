"""What runs inside a Spark task for one lane of a stateful step.

Lane ``i`` is shuffle partition ``i`` (see :mod:`eddyline.plan.keygroups`). For its key groups the
task loads state as of the previous commit, runs the pure kernel on the epoch's partials, writes
the changed key groups' new versions, and leaves a small manifest (new chains + statistics) that
the driver folds into the epoch commit. Everything is a function of the logged plan, so a retried
task or a replayed epoch writes the same bytes.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from eddyline import objectstore
from eddyline.columns import KG, PROBE
from eddyline.errors import TASK_MARK as MARK
from eddyline.operators.base import Kernel, KernelResult, deferred_counts
from eddyline.runtime.checkpoint import manifest_path
from eddyline.runtime.faults import FaultPoint, Faults, NoFaults
from eddyline.state.store import (
    DEFAULT_CACHE_BYTES,
    KeyGroupStore,
    WriteResult,
    merged_changes,
    process_cache,
    with_chains,
)
from eddyline.storage import Gate, filesystem, is_s3, makedirs, read_json

#: the Spark local property (this prefix + the step's name) carrying the epoch's part of a
#: stateful step's lane task (see :meth:`LaneTask.for_epoch`)
LANE_PROPERTY = "eddyline.lanes."


@dataclass(frozen=True)
class LaneTask:
    step: str
    checkpoint: str
    kernel: Kernel
    routing: tuple[int, ...]  # virtual key group -> lane (RoutingTable.owners())
    # The epoch's part: given when the lanes run (for_epoch), so that the frame that runs them
    # can serve many epochs.
    epoch: int = 0
    index: dict[int, list] = field(default_factory=dict)  # key group -> chain, as of the previous commit
    watermark_ms: int = 0
    #: the watermark the lane moves to once it has taken in the epoch's rows (None: it stays)
    advance_ms: int | None = None
    snapshot_every: int = 8
    #: memory budget for this lane's state (None: load all of it at once)
    state_budget: int | None = None
    #: in-memory bytes of one state row, as measured in the previous epoch (for slicing)
    bytes_per_row: float = 0.0
    #: input columns holding the key (alternatives, coalesced: a join's left and right key), for
    #: naming heavy hitters
    key_columns: tuple[str, ...] = ()
    #: told when the first lane has written its state (:attr:`FaultPoint.IN_TASK`)
    faults: Faults = NoFaults()
    #: the driver's lease generation: the lane writes through its gate (:class:`~eddyline.storage.Gate`)
    generation: int = 0
    #: how the driver reaches an object-store checkpoint (:func:`eddyline.objectstore.settings`)
    store: dict[str, str] = field(default_factory=objectstore.settings)

    @property
    def gate(self) -> Gate:
        return Gate(self.checkpoint, self.generation)

    def for_epoch(self) -> LaneTask:
        """In a Spark task: the task with the epoch's part the driver gave the job (the local
        property ``LANE_PROPERTY + step``, set from the logged plan and the last commit)."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        text = ctx.getLocalProperty(LANE_PROPERTY + self.step) if ctx is not None else None
        if text is None:
            raise RuntimeError(f"{MARK} step '{self.step}': this lane was given no epoch to run "
                               f"(local property {LANE_PROPERTY}{self.step} is not set)")
        run = json.loads(text)
        if "path" in run:  # too large to go with the task (a state index over many key groups)
            fs, _ = filesystem(self.checkpoint)
            run = read_json(fs, run["path"])
        return replace(self, epoch=run["epoch"], index={int(kg): chain for kg, chain in run["index"].items()},
                       watermark_ms=run["watermark_ms"], advance_ms=run.get("advance_ms"),
                       bytes_per_row=run["bytes_per_row"], generation=run.get("generation", 0))


class _GcClock:
    """Wall time the cyclic garbage collector takes in this process (a ``gc.callbacks`` entry)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.full = 0  # of them, collections of the oldest generation (every tracked object)
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1
            self.full += info.get("generation") == 2


_gc_clock: _GcClock | None = None


def gc_clock() -> _GcClock:
    """This worker's collector clock, installed on first use (a worker runs many lanes' tasks).

    On first use the worker's objects so far (the ~90,000 of the imported modules) are also
    frozen out of the cyclic collector's view (``gc.freeze``, after a collection, so no garbage
    is kept). pyspark's daemon runs a full collection after every task; walking those objects
    costs CPU per lane and epoch that the next epoch's JVM work is waiting for, and almost
    nothing once they are frozen (docs/perf-notes.md has the figures).
    """
    global _gc_clock
    if _gc_clock is None:
        gc.collect()
        gc.freeze()
        _gc_clock = _GcClock()
        gc.callbacks.append(_gc_clock)
    return _gc_clock


def process(kernel: Kernel, batch: pa.Table, state: pa.Table, watermark_ms: int, advance_ms: int | None) -> KernelResult:
    """The kernel on the epoch's rows at the watermark in force; then, if the plan advances the
    step's watermark (:attr:`~eddyline.runtime.epoch.records.EpochPlan.advance`), once more
    without rows at the new one, the two results told as one: the same as the next epoch
    running without rows for this step, one epoch sooner."""
    first = kernel.process(batch, state, watermark_ms)
    if advance_ms is None or advance_ms <= watermark_ms:
        return first
    then = kernel.process(batch.schema.empty_table(), first.state, advance_ms)
    upserts, deletes = merged_changes((first.upserts, first.deletes), (then.upserts, then.deletes),
                                      kernel.state_schema, kernel.primary_key)
    return KernelResult(
        pa.concat_tables([first.output, then.output]),
        then.state,
        upserts,
        deletes,
        sorted({*first.changed_key_groups, *then.changed_key_groups}),
        _summed(first.metrics, then.metrics),
        _summed(first.kg_cost, then.kg_cost),
    )


def _summed(a: dict, b: dict) -> dict:
    """Two counters of the same things, added up key by key (keys of either kept, zeros too)."""
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def state_file_id(lane: int, part: int) -> int:
    """The id naming a lane's state file: one file per slice when the lane works in slices."""
    return lane if part == 0 else (part << 16) | lane


def memory_bytes() -> dict[str, int]:
    """This process's resident memory (Linux ``/proc``; zeros elsewhere): all of it, and the
    anonymous part, i.e. without file pages such as memory-mapped state files."""
    out = {"rss": 0, "anon": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss"] = int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    out["anon"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def chain_rows(chain: list) -> int:
    """Rows a chain materialises to, at most (its snapshot plus every delta row)."""
    return sum(int(seg[4]) for seg in chain)


def slices(groups: list[int], rows: dict[int, int], bytes_per_row: float, budget: int | None) -> list[list[int]]:
    """Cut a lane's key groups into slices whose estimated state fits ``budget``. A single group
    larger than the budget still gets a slice of its own (it is reported as over budget)."""
    if budget is None or bytes_per_row <= 0:
        return [groups] if groups else []
    out: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for kg in groups:
        need = rows.get(kg, 0) * bytes_per_row
        if current and size + need > budget:
            out.append(current)
            current, size = [], 0.0
        current.append(kg)
        size += need
    if current:
        out.append(current)
    return out


def warm_other_lanes(task: LaneTask, store: KeyGroupStore, lane: int, wait_s: float = 5.0) -> int:
    """Load into this worker's state cache what the step's other lanes wrote in this epoch.

    The cache lives in the Python worker process, and Spark gives a lane's task whichever idle
    worker it has, so the workers trade lanes from time to time; the lane's next task then
    loads its whole state from the checkpoint. Warmed with the other lanes' new versions (read
    from their manifests as they appear, at most ``wait_s`` seconds), the worker has every
    lane's state at hand. Only what fits in the cache's free room is loaded, so a worker never
    evicts its own lane's state for it. Returns the state rows loaded."""
    owners = np.asarray(task.routing)
    others = set(np.unique(owners).tolist()) - {lane}
    fs, _ = filesystem(task.checkpoint)
    # on an object store every look is a request: look less often there
    every = 0.25 if is_s3(fs) else 0.01
    loaded = 0
    deadline = time.monotonic() + wait_s
    while others and time.monotonic() < deadline:
        for other in sorted(others):
            try:
                manifest = read_json(fs, manifest_path(task.checkpoint, task.epoch, task.step, other, task.generation))
            except OSError:  # not written yet
                continue
            others.discard(other)
            if store.cache.used + int(manifest["state_bytes"]) > store.cache.budget:
                continue
            index = with_chains(
                {kg: chain for kg, chain in task.index.items() if kg < owners.size and owners[kg] == other},
                manifest["chains"],
            )
            loaded += store.load(index, list(index)).num_rows
        if others:
            time.sleep(every)
    return loaded


WARM_THREAD = "eddyline-warm-cache"


def _warm_quietly(task: LaneTask, store: KeyGroupStore, lane: int) -> None:
    # only a speed-up: the cache checks every group's chain tip before using what it holds
    with contextlib.suppress(Exception):
        warm_other_lanes(task, store, lane)


def _deferral(arrived: np.ndarray, before: np.ndarray, after: np.ndarray) -> dict[str, Any]:
    """The manifest's account of a deferring kernel's work, per key group: ``kg_work`` (rows
    worked on: arrived + held before - held after), ``kg_held`` (input held back for later), and
    the lane's totals of rows held before and of those worked on (a held row is older than any
    arriving one, so the watermark frees it first: the work of a group goes first to its held
    rows)."""
    a, b, c = np.pad(arrived, (0, before.size - arrived.size)), before, after
    work = np.maximum(a + b - c, 0)
    return {
        "kg_work": {str(k): int(work[k]) for k in np.flatnonzero(work)},
        "kg_held": {str(k): int(c[k]) for k in np.flatnonzero(c)},
        "held_before": int(b.sum()),
        "held_worked": int(np.minimum(b, work).sum()),
    }


def heavy_hitters(
    partials: pa.Table, kgs: np.ndarray, counts: np.ndarray, key_columns: tuple[str, ...], top: int = 2
) -> list[dict[str, object]]:
    """The most frequent key in each of the lane's busiest key groups (``kgs``: each row's)."""
    names = [c for c in key_columns if c in partials.column_names]
    if not names or not kgs.size:
        return []
    import pyarrow.compute as pc

    out: list[dict[str, object]] = []
    for kg in np.argsort(counts, kind="stable")[::-1][:top]:
        if counts[kg] == 0:
            break
        mine = pa.array(kgs == kg)
        cols = [partials.column(c).filter(mine) for c in names]
        key = pc.coalesce(*cols) if len(cols) > 1 else cols[0]
        vc = pc.value_counts(key)
        n = vc.field("counts").to_numpy()
        i = int(np.argmax(n))
        out.append({"kg": int(kg), "key": str(vc.field("values")[i].as_py()), "rows": int(n[i]),
                    "share": round(float(n[i]) / partials.num_rows, 4)})
    return out


def keep_warm(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A keep-alive task: it takes an idle Python worker from Spark's pool, which restarts the
    worker's idle clock, and names the process (with its lanes' state cache) it kept."""
    for _ in batches:
        pass
    yield pa.record_batch({"pid": pa.array([os.getpid()], pa.int64())})


def run_lane(task: LaneTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In the Spark task of one lane: ``task`` (without its epoch's part, see
    :meth:`LaneTask.for_epoch`) over the rows that arrive."""
    yield from _run_lane(task.for_epoch(), batches)


@dataclass
class _Tally:
    """What a lane's slices add up to, for its manifest."""

    held_before: np.ndarray  # rows a deferring kernel holds per key group, before and after
    held_after: np.ndarray
    ms: dict[str, float] = field(default_factory=lambda: {"load": 0.0, "kernel": 0.0, "write": 0.0})
    kernel_cpu: float = 0.0
    chains: dict[str, list | None] = field(default_factory=dict)
    state_rows: int = 0
    state_bytes: int = 0
    output_rows: int = 0
    bytes_written: int = 0
    snapshots: int = 0
    deltas: int = 0
    metrics: dict[str, int] = field(default_factory=dict)
    kg_state: dict[str, int] = field(default_factory=dict)
    kg_cost: dict[int, int] = field(default_factory=dict)  # the kernel's own count of its work, if it keeps one

    def add(self, result: KernelResult, written: WriteResult) -> None:
        self.chains.update({str(k): v for k, v in written.chains.items()})
        if result.state.num_rows:
            counts = np.bincount(result.state.column(KG).to_numpy(zero_copy_only=False))
            self.kg_state.update({str(k): int(counts[k]) for k in np.flatnonzero(counts)})
        self.state_rows += result.state.num_rows
        self.state_bytes += result.state.nbytes
        self.output_rows += result.output.num_rows
        self.bytes_written += written.bytes_written
        self.snapshots += written.snapshots
        self.deltas += written.deltas
        for k, v in result.metrics.items():
            self.metrics[k] = self.metrics.get(k, 0) + int(v)
        for g, c in result.kg_cost.items():
            self.kg_cost[g] = self.kg_cost.get(g, 0) + c

    def manifest(self) -> dict[str, Any]:
        return {
            "chains": self.chains,
            "state_rows": self.state_rows,
            "state_bytes": self.state_bytes,
            "output_rows": self.output_rows,
            "metrics": self.metrics,
            "bytes_written": self.bytes_written,
            "snapshots": self.snapshots,
            "deltas": self.deltas,
            "kg_state_rows": self.kg_state,
            **({"kg_cost": {str(g): c for g, c in self.kg_cost.items()}} if self.kg_cost else {}),
        }


class _Watch:
    """A lane task's clocks from its start: wall time, its thread's CPU time, the cyclic
    collector's time, and the process's memory."""

    def __init__(self) -> None:
        self.gc = gc_clock()
        self.gc0 = (self.gc.seconds, self.gc.collections, self.gc.full)
        self.t0 = time.perf_counter()
        self.cpu0 = time.thread_time()
        # a warm-up of the cache left over from this worker's previous task shares the interpreter
        self.warming = any(t.name == WARM_THREAD and t.is_alive() for t in threading.enumerate())
        self.mem0 = memory_bytes()

    def times(self, t_in: float, tally: _Tally) -> dict[str, Any]:
        """The manifest's times: the receive (up to ``t_in``) and the slices' phases."""
        return {
            "ms": {"receive": round((t_in - self.t0) * 1000, 2), **{k: round(v * 1000, 2) for k, v in tally.ms.items()}},
            # the task thread's own CPU time: below the wall times above when it waited for a core
            # or for the interpreter lock
            "cpu_ms": {"lane": round((time.thread_time() - self.cpu0) * 1000, 2), "kernel": round(tally.kernel_cpu * 1000, 2)},
            "warming_at_start": self.warming,
            # time inside the phases above that went to the cyclic collector (not added to them)
            "gc": {"ms": round((self.gc.seconds - self.gc0[0]) * 1000, 2), "collections": self.gc.collections - self.gc0[1],
                   "full": self.gc.full - self.gc0[2]},
        }


def _received(task: LaneTask, batches: Iterator[pa.RecordBatch]) -> tuple[int, pa.Table]:
    """The lane this task is (named by its heartbeat row) and its rows, cast to the kernel's
    input schema. Refuses rows of key groups the routing table gives to another lane."""
    received = list(batches)
    kernel = task.kernel
    arrived = pa.Table.from_batches(received) if received else kernel.input_schema.empty_table()
    del received
    # The lane's heartbeat row (_kg = -1 - lane) names the lane; it is not data (and its nulls
    # must go before the cast to the kernel's schema, whose fields may be non-nullable).
    kg_col = arrived.column(KG).to_numpy(zero_copy_only=False)
    beats = np.unique(kg_col[kg_col < 0])
    if beats.size != 1:
        raise RuntimeError(
            f"{MARK} step '{task.step}': a lane received {beats.size} heartbeats; the shuffle does not match "
            "the routing table"
        )
    lane = int(-1 - beats[0])
    schema = kernel.input_schema
    if PROBE in arrived.column_names and PROBE not in schema.names:
        schema = schema.append(pa.field(PROBE, pa.bool_()))
    partials = arrived.filter(pa.array(kg_col >= 0)).select(schema.names).cast(schema)
    del arrived
    owners = np.asarray(task.routing)
    if partials.num_rows:
        kgs = partials.column(KG).to_numpy()
        strays = np.unique(kgs[owners[kgs] != lane])
        if strays.size:
            raise RuntimeError(
                f"{MARK} step '{task.step}' lane {lane}: received key groups {strays[:5].tolist()} routed "
                "elsewhere; the shuffle does not match the routing table"
            )
    return lane, partials


def _run_lane(task: LaneTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    objectstore.adopt(task.store)
    requests = objectstore.REQUESTS.copy()
    watch = _Watch()
    lane, partials = _received(task, batches)
    kernel = task.kernel
    t_in = time.perf_counter()
    mem_in = memory_bytes()
    owners = np.asarray(task.routing)
    kgs = partials.column(KG).to_numpy() if partials.num_rows else np.zeros(0, dtype=np.int32)
    store = KeyGroupStore(task.checkpoint, task.step, kernel.state_schema, kernel.primary_key,
                          snapshot_every=task.snapshot_every, gate=task.gate)
    cache = process_cache()
    # With a budget, resident state (the cache) and the slice being worked on share it.
    cache.resize(DEFAULT_CACHE_BYTES if task.state_budget is None else task.state_budget // 2)
    hits0, misses0 = cache.hits, cache.misses
    in_counts = np.bincount(kgs, minlength=1) if kgs.size else np.zeros(1, dtype=np.int64)
    groups, work = _work(task, lane, owners, in_counts)
    # kernels that hold input back (deferred): rows held per key group before and after, so
    # the rows worked on per group = arrived + held before - held after
    tally = _Tally(np.zeros(owners.size, dtype=np.int64), np.zeros(owners.size, dtype=np.int64))
    defers = getattr(kernel, "deferred", None) is not None
    peak = dict(mem_in)
    if len(work) > 1:
        # slices are ranges of key groups: sort the rows by key group to cut them out. Kernels
        # do not depend on arrival order, so one slice skips the sort.
        order = np.argsort(kgs, kind="stable")
        partials = partials.take(order)
        kgs = kgs[order]
    hot_keys = heavy_hitters(partials, kgs, in_counts, task.key_columns)
    for part, group in enumerate(work):
        t_a = time.perf_counter()
        if len(work) == 1:
            chunk = partials
        else:
            lo, hi = np.searchsorted(kgs, group[0], "left"), np.searchsorted(kgs, group[-1], "right")
            chunk = partials.slice(lo, hi - lo)
        state = store.load(task.index, [kg for kg in group if kg in task.index])
        t_b, c_b = time.perf_counter(), time.thread_time()
        result = process(kernel, chunk, state, task.watermark_ms, task.advance_ms)
        t_c = time.perf_counter()
        tally.kernel_cpu += time.thread_time() - c_b
        if defers:  # key groups of every part lie in the routing table (checked on arrival)
            tally.held_before += deferred_counts(kernel, state, owners.size)
            tally.held_after += deferred_counts(kernel, result.state, owners.size)
        written = store.write(
            task.epoch,
            state_file_id(lane, part),
            task.index,
            result.state,
            result.upserts,
            result.deletes,
            result.changed_key_groups,
        )
        t_d = time.perf_counter()
        tally.ms["load"] += t_b - t_a
        tally.ms["kernel"] += t_c - t_b
        tally.ms["write"] += t_d - t_c
        tally.add(result, written)
        output = result.output
        del state, result, chunk
        if len(work) > 1:
            pa.default_memory_pool().release_unused()
        now = memory_bytes()
        peak = {k: max(peak[k], now[k]) for k in peak}
        yield from output.to_batches()
        del output
    resident = cache.resident_bytes(store.root, store.step, [int(k) for k in tally.kg_state])
    manifest = {
        "lane": lane,
        "input_rows": partials.num_rows,
        **tally.manifest(),
        "cache_hits": cache.hits - hits0,
        "cache_misses": cache.misses - misses0,
        "cache_bytes": cache.used,
        "key_groups": len(groups),
        "kg_rows": {str(k): int(in_counts[k]) for k in np.flatnonzero(in_counts)},
        "hot_keys": hot_keys,
        **(_deferral(in_counts, tally.held_before, tally.held_after) if defers else {}),
        "slices": len(work),
        "spilled_bytes": max(0, tally.state_bytes - resident),
        "memory": {"start": watch.mem0, "received": mem_in, "peak": peak},
        **watch.times(t_in, tally),
        "pid": os.getpid(),
    }
    if is_s3(store.fs):  # the task's requests to the object store, its manifest's PUT included
        made = objectstore.requests_since(requests)
        manifest["store_requests"] = made | {"PUT": made.get("PUT", 0) + 1}
    _finish(task, store, lane, manifest)


def _work(task: LaneTask, lane: int, owners: np.ndarray, in_counts: np.ndarray) -> tuple[list[int], list[list[int]]]:
    """The key groups the lane works on (those it holds state of and those rows arrived for)
    and their slices, each small enough for the state budget."""
    mine = [kg for kg in task.index if kg < owners.size and owners[kg] == lane]
    groups = sorted(set(mine) | set(np.flatnonzero(in_counts).tolist()))
    budget = None if task.state_budget is None else task.state_budget // 2
    return groups, slices(groups, {kg: chain_rows(task.index[kg]) for kg in mine}, task.bytes_per_row, budget)


def _finish(task: LaneTask, store: KeyGroupStore, lane: int, manifest: dict[str, Any]) -> None:
    """The lane's manifest written (the driver folds it into the epoch's state index), its
    state's cache warmed for the next epoch in the background."""
    fs, _ = filesystem(task.checkpoint)
    path = manifest_path(task.checkpoint, task.epoch, task.step, lane, task.generation)
    makedirs(fs, path.rsplit("/", 1)[0])
    task.gate.put(path, json.dumps(manifest).encode())
    if task.state_budget is None:
        threading.Thread(target=_warm_quietly, args=(task, store, lane), name=WARM_THREAD, daemon=True).start()
    if lane == 0:
        task.faults.reached(FaultPoint.IN_TASK, task.epoch)
