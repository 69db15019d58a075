"""The balancer's look-ahead: an epoch's input rows per key group, counted before it runs.

Counting a slice means reading its key columns and hashing its distinct keys, all of it on the
critical path between two epochs unless it is done ahead. A files slice is counted file by file (counts add up), and once an epoch's Spark job is
about to start, the files the next epoch is likely to read are counted in a background thread
while the job runs (the driver then waits in one py4j call), at the lowest CPU priority: on a
machine whose cores the job keeps busy, the counting takes only what they leave idle instead of
slowing the job's tasks by its share of a core. The next plan takes
those counts if its files are the ones counted, and counts whatever is missing itself. Files are
read once they are listed, so a file must be complete when it appears (as Spark's file source
also requires).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from eddyline.io.sources import Source
from eddyline.plan.keygroups import key_group_counts

#: At most this many files are counted ahead per source and key.
PREFETCH_FILES = 64

Counts = dict[str, np.ndarray | None]  # file name -> rows per key group (None: cannot tell)


def idle_priority() -> None:
    """Give the calling thread the lowest CPU priority (nice 19; on Linux a thread has its own),
    for background work that must not take cores from Spark's tasks."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class LookAhead:
    def __init__(self, key_groups: int):
        self.key_groups = key_groups
        self._pool: ThreadPoolExecutor | None = None
        # (source, key columns) -> the counts of the files after the last planned slice
        self._ahead: dict[tuple[str, tuple[str, ...]], Future[Counts]] = {}
        self._requested: list[tuple[Source, dict[str, Any], tuple[str, ...]]] = []

    def counts(self, source: Source, planned: dict[str, Any], keys: tuple[str, ...]) -> np.ndarray | None:
        """Rows per key group of the slice ``planned``, or None when the source cannot tell
        cheaply (see :meth:`Source.peek`)."""
        files = planned.get("files")
        if files is None:  # not split into files: the source peeks at the whole slice
            return self._count(source, planned, keys)
        if not files:
            return None
        ready: Counts = {}
        ahead = self._ahead.pop((source.name, keys), None)
        if ahead is not None:
            try:
                ready = ahead.result()
            except Exception:  # counted again below, where an unreadable file gives None
                ready = {}
        total = np.zeros(self.key_groups, dtype=np.int64)
        for name in files:
            got = ready[name] if name in ready else self._count(source, {"files": [name]}, keys)
            if got is None:
                return None
            total += got
        return total

    def prefetch(self, source: Source, planned: dict[str, Any], keys: tuple[str, ...]) -> None:
        """Count, in the background once :meth:`start` is called, the files that follow the
        slice ``planned``."""
        if planned.get("files") is not None:
            self._requested.append((source, planned, keys))

    def start(self) -> None:
        """Start counting what :meth:`prefetch` asked for. The engine calls this when the epoch's
        Spark job is about to start: while the driver builds the epoch's DataFrames it makes
        many short py4j calls, each of which would wait for the interpreter lock while the
        counting holds it."""
        if not self._requested:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="eddyline-lookahead", initializer=idle_priority)
        for source, planned, keys in self._requested:
            self._ahead[(source.name, keys)] = self._pool.submit(self._count_following, source, planned, keys)
        self._requested.clear()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._ahead.clear()
        self._requested.clear()

    def _count_following(self, source: Source, planned: dict[str, Any], keys: tuple[str, ...]) -> Counts:
        return {name: self._count(source, {"files": [name]}, keys)
                for name in source.following(planned)[:PREFETCH_FILES]}

    def _count(self, source: Source, planned: dict[str, Any], keys: tuple[str, ...]) -> np.ndarray | None:
        table = source.peek(planned, keys)
        return None if table is None else key_group_counts(table, keys, self.key_groups)
