"""The one epoch driver of the kernel tests: it runs a kernel through epochs like the runtime does.

A :class:`Driver` is one lane: it starts from the kernel's empty state, calls ``process`` once per
epoch with the state the previous epoch left, runs the test's contract check on every result, and
keeps the results, the final state and the summed metrics. :func:`run_epochs` drives one lane over
``(batch, watermark)`` epochs and, by default, an empty end-of-stream epoch after them. A test that
drives several lanes, or a pipeline of kernels, steps one :class:`Driver` per lane or stage over
:func:`with_end_of_stream`.

The checks stay with the tests (each kernel family states its own contract); a check is called
as ``check(kernel, previous_state, result)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np
import pyarrow as pa

from eddyline.columns import OP
from eddyline.eventtime import END_OF_STREAM
from eddyline.operators.base import Kernel, KernelResult
from eddyline.state.store import apply_delta

Check = Callable[[Kernel, pa.Table, KernelResult], None]
#: turns an epoch's batch into the kernel's input (e.g. rows into window partials)
Prepare = Callable[[pa.Table, int], pa.Table]
B = TypeVar("B")


def with_end_of_stream(
    epochs: Iterable[tuple[B, int]], empty: B | None = None
) -> list[tuple[B, int]]:
    """``epochs`` then one end-of-stream epoch with ``empty`` as its batch (default: an empty
    slice of the first batch)."""
    epochs = list(epochs)
    if empty is None:
        first = epochs[0][0]
        assert isinstance(first, pa.Table), "pass the end-of-stream batch for non-table epochs"
        empty = first.slice(0, 0)  # type: ignore[assignment]
    return [*epochs, (empty, END_OF_STREAM)]  # type: ignore[list-item]


class Driver:
    """One kernel instance (a lane) driven epoch by epoch: carries the state, checks every
    result, and collects the results and the summed metrics."""

    def __init__(self, kernel: Kernel, *, check: Check | None = None) -> None:
        self.kernel = kernel
        self.check = check
        self.state: pa.Table = kernel.state_schema.empty_table()
        self.results: list[KernelResult] = []
        self.metrics: Counter[str] = Counter()

    def step(self, batch: pa.Table, watermark_ms: int) -> KernelResult:
        """One epoch: ``process`` with the carried state, check, carry the new state."""
        res = self.kernel.process(batch, self.state, watermark_ms)
        if self.check is not None:
            self.check(self.kernel, self.state, res)
        self.state = res.state
        self.results.append(res)
        self.metrics.update(res.metrics)
        return res

    @property
    def outputs(self) -> list[pa.Table]:
        """Each epoch's output, in order."""
        return [r.output for r in self.results]

    @property
    def output(self) -> pa.Table:
        """Every epoch's output, concatenated."""
        return pa.concat_tables(self.outputs)


def run_epochs(
    kernel: Kernel,
    epochs: Iterable[tuple[pa.Table, int]],
    *,
    check: Check | None = None,
    end: bool = True,
    shuffle: int | None = None,
    prepare: Prepare | None = None,
    drained: bool = False,
) -> Driver:
    """Drive ``kernel`` over ``(batch, watermark)`` epochs, then (``end``) an empty end-of-stream
    epoch. ``shuffle`` seeds a permutation of each non-empty batch; ``prepare`` turns each
    (shuffled) batch into the kernel's input; ``drained`` asserts that the final state is empty.
    Returns the :class:`Driver` (``output``, ``outputs``, ``results``, ``state``, ``metrics``)."""
    driver = Driver(kernel, check=check)
    rng = np.random.default_rng(shuffle)
    for batch, wm in with_end_of_stream(epochs) if end else epochs:
        if shuffle is not None and batch.num_rows:
            batch = batch.take(pa.array(rng.permutation(batch.num_rows)))
        driver.step(batch if prepare is None else prepare(batch, wm), wm)
    if drained:
        assert driver.state.num_rows == 0, "end of stream must leave no state"
    return driver


def consolidate(changelog: pa.Table) -> Counter[tuple]:
    """A changelog's revisions summed per row (every column but ``_diff``, in order; a table
    without ``_diff`` weighs +1 per row), rows whose weights cancel left out: the relation the
    changelog describes, as a multiset."""
    from eddyline.columns import DIFF

    names = [c for c in changelog.column_names if c != DIFF]
    weights = changelog.column(DIFF).to_pylist() if DIFF in changelog.column_names else [1] * changelog.num_rows
    total: Counter[tuple] = Counter()
    for row, w in zip(zip(*(changelog.column(c).to_pylist() for c in names), strict=True), weights, strict=True):
        total[row] += w
    return Counter({row: w for row, w in total.items() if w != 0})


def exact_delta(kernel: Kernel, old: pa.Table, res: KernelResult) -> None:
    """A check: the store rebuilds the result's state from ``old`` and its upserts and deletes."""
    pk = list(kernel.primary_key)
    dels = pa.Table.from_arrays(
        [res.deletes.column(f.name) if f.name in pk else pa.nulls(res.deletes.num_rows, f.type) for f in old.schema],
        schema=old.schema,
    )
    delta = pa.concat_tables([res.upserts, dels]).append_column(
        OP, pa.array([0] * res.upserts.num_rows + [1] * res.deletes.num_rows, pa.int8())
    )
    rebuilt = apply_delta(old, delta, pk)
    assert sorted(map(repr, rebuilt.to_pylist())) == sorted(map(repr, res.state.to_pylist()))
