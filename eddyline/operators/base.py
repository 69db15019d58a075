"""The contract every stateful kernel keeps. No Spark here.

A kernel is the per-lane logic of one stateful step. The runtime calls :meth:`Kernel.process`
once per lane and epoch with

* ``batch``: the epoch's rows routed to this lane, with the ``input_schema`` (always including
  ``_kg int32``, the row's key group);
* ``state``: this lane's state as of the previous epoch, with the ``state_schema`` (always
  including ``_kg``), possibly empty;
* ``watermark_ms``: the event-time watermark the epoch plan fixed for this step
  (``NO_WATERMARK`` before any event time was seen, ``END_OF_STREAM`` when the input ended).

It returns a :class:`KernelResult`. Kernels must be **pure and deterministic**: the same inputs
give the same outputs whatever the row order of ``batch`` (a replay's shuffle may order rows
differently), so a replayed epoch writes the same state and output. Kernels must be picklable
(they travel to Spark's Python workers) and keep no state between calls.

The state is a table keyed by ``primary_key`` (which starts with ``_kg``); ``upserts`` are the
rows of the new state that changed this epoch, ``deletes`` the primary keys that left it. The
store uses them to write deltas; ``changed_key_groups`` must name every key group touched.

A kernel that holds input rows back until the watermark passes them (a pattern buffers rows
until their order is final) may also define ``deferred(state) -> numpy bool mask``: the state
rows that are input still waiting to be processed. The lanes then count, per key group, the rows
the kernel actually worked on in the epoch, so the load statistics charge the kernel's time to
the key groups and epoch that did the work, and the balancer can foresee the coming epoch's work.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.columns import KG


def key_groups_of(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column(KG).to_numpy(zero_copy_only=False), dtype=np.int32)


def changed_groups(*tables: pa.Table) -> list[int]:
    """The sorted distinct key groups of the rows in ``tables``: a kernel's upserts and deletes
    give its :attr:`~eddyline.operators.base.KernelResult.changed_key_groups`."""
    if not tables:
        return []
    return np.unique(np.concatenate([key_groups_of(t) for t in tables])).tolist()


@dataclass
class KernelResult:
    output: pa.Table
    state: pa.Table
    upserts: pa.Table
    deletes: pa.Table
    changed_key_groups: list[int] = field(default_factory=list)
    #: kernel-specific counters for progress (e.g. windows fired, matches emitted)
    metrics: dict[str, int] = field(default_factory=dict)
    #: the kernel's own count of its work per key group, where rows alone do not say it (the
    #: pattern: ready rows times the runs each is tried against); empty: the kernel's time is
    #: charged to the key groups in proportion to the rows it worked on
    kg_cost: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, output: pa.Table, state: pa.Table, upserts: pa.Table, deletes: pa.Table,
           metrics: dict[str, int] | None = None, kg_cost: dict[int, int] | None = None) -> KernelResult:
        """A result whose changed key groups are the ones its upserts and deletes touch."""
        return cls(output, state, upserts, deletes, changed_groups(upserts, deletes), metrics or {}, kg_cost or {})


@runtime_checkable
class Kernel(Protocol):
    input_schema: pa.Schema
    state_schema: pa.Schema
    primary_key: tuple[str, ...]
    output_schema: pa.Schema

    def process(self, batch: pa.Table, state: pa.Table, watermark_ms: int) -> KernelResult: ...


def deferred_counts(kernel: Kernel, state: pa.Table, key_groups: int) -> np.ndarray | None:
    """Per key group (index = key group, ``key_groups`` long), the input rows ``state`` still
    holds back for a later epoch; None when the kernel defers nothing (it has no ``deferred``)."""
    deferred = getattr(kernel, "deferred", None)
    if deferred is None:
        return None
    if not state.num_rows:
        return np.zeros(key_groups, dtype=np.int64)
    mask = np.asarray(deferred(state), dtype=bool)
    return np.bincount(
        state.column(KG).to_numpy(zero_copy_only=False)[mask], minlength=key_groups
    ).astype(np.int64)


@functools.lru_cache(maxsize=256)
def sortable(data_type: pa.DataType) -> bool:
    """Whether Arrow can sort a column of ``data_type`` (lists and maps, say, cannot). Kernels
    break ties by every sortable column so that arrival order never changes a result."""
    try:
        pc.sort_indices(pa.table({"x": pa.nulls(2, data_type)}), sort_keys=[("x", "ascending")])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True
