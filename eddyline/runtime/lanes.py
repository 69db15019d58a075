"""What runs inside a Spark task for one lane of a stateful step.

Lane ``i`` is shuffle partition ``i`` (see :mod:`eddyline.plan.keygroups`). For its key groups the
task loads state as of the previous commit, runs the pure kernel on the epoch's partials, writes
the changed key groups' new versions, and leaves a small manifest (new chains + statistics) that
the driver folds into the epoch commit. Everything is a function of the logged plan, so a retried
task or a replayed epoch writes the same bytes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from eddyline.operators.base import KG, Kernel
from eddyline.runtime.udf import MARK
from eddyline.state.store import KeyGroupStore, filesystem, process_cache, write_atomic


@dataclass(frozen=True)
class LaneTask:
    step: str
    epoch: int
    checkpoint: str
    kernel: Kernel
    routing: tuple[int, ...]  # key group -> lane
    index: dict[int, list]  # key group -> chain, as of the previous commit
    watermark_ms: int
    snapshot_every: int = 8
    #: test hook: SIGKILL the driver after this lane wrote its state (a crash mid-epoch)
    kill_driver_pid: int | None = None


def manifest_path(checkpoint: str, epoch: int, step: str, lane: int) -> str:
    _, base = filesystem(checkpoint)
    return f"{base}/epochs/{epoch:010d}/{step}/lane-{lane:04d}.json"


def run_lane(task: LaneTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    t0 = time.perf_counter()
    received = list(batches)
    kernel = task.kernel
    arrived = pa.Table.from_batches(received) if received else kernel.input_schema.empty_table()
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
    partials = arrived.filter(pa.array(kg_col >= 0)).cast(kernel.input_schema)
    t_in = time.perf_counter()
    routing = np.asarray(task.routing)
    if partials.num_rows:
        kgs = partials.column(KG).to_numpy()
        strays = np.unique(kgs[routing[kgs] != lane])
        if strays.size:
            raise RuntimeError(
                f"{MARK} step '{task.step}' lane {lane}: received key groups {strays[:5].tolist()} routed "
                "elsewhere; the shuffle does not match the routing table"
            )
    store = KeyGroupStore(
        task.checkpoint,
        task.step,
        kernel.state_schema,
        kernel.primary_key,
        snapshot_every=task.snapshot_every,
    )
    cache = process_cache()
    hits0, misses0 = cache.hits, cache.misses
    mine = [kg for kg in task.index if task.routing[kg] == lane]
    state = store.load(task.index, mine)
    t_load = time.perf_counter()
    result = kernel.process(partials, state, task.watermark_ms)
    t_kernel = time.perf_counter()
    written = store.write(
        task.epoch,
        lane,
        task.index,
        result.state,
        result.upserts,
        result.deletes,
        result.changed_key_groups,
    )
    t_write = time.perf_counter()
    manifest = {
        "lane": lane,
        "chains": {str(k): v for k, v in written.chains.items()},
        "input_rows": partials.num_rows,
        "state_rows": result.state.num_rows,
        "state_bytes": result.state.nbytes,
        "output_rows": result.output.num_rows,
        "metrics": result.metrics,
        "bytes_written": written.bytes_written,
        "snapshots": written.snapshots,
        "deltas": written.deltas,
        "cache_hits": cache.hits - hits0,
        "cache_misses": cache.misses - misses0,
        "cache_bytes": cache.used,
        "key_groups": len(set(mine) | set(np.unique(partials.column(KG).to_numpy()).tolist())),
        "ms": {
            "receive": round((t_in - t0) * 1000, 2),
            "load": round((t_load - t_in) * 1000, 2),
            "kernel": round((t_kernel - t_load) * 1000, 2),
            "write": round((t_write - t_kernel) * 1000, 2),
        },
        "pid": os.getpid(),
    }
    fs, _ = filesystem(task.checkpoint)
    path = manifest_path(task.checkpoint, task.epoch, task.step, lane)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    write_atomic(fs, path, json.dumps(manifest).encode())
    if task.kill_driver_pid is not None and lane == 0:
        os.kill(task.kill_driver_pid, signal.SIGKILL)
    yield from result.output.to_batches()
