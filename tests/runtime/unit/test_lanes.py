"""A lane's worker, outside Spark: warming its cache from the state other lanes just wrote."""

from __future__ import annotations

from pathlib import Path

from tests.state.storerows import PK, as_dict, store, table


def test_a_worker_warms_its_cache_with_the_other_lanes_new_state(tmp_path: Path) -> None:
    """Lane 1 writes its state and manifest; the worker that ran lane 0 warms its cache from
    them, so when it gets lane 1's task next epoch, loading lane 1's groups misses nothing."""
    import json

    from eddyline.runtime.checkpoint import manifest_path
    from eddyline.runtime.lanes import LaneTask, warm_other_lanes

    lane1 = store(tmp_path)  # the worker that ran lane 1
    state = table({(2, k): k for k in range(5)} | {(3, 1): 9})
    written = lane1.write(7, 1, {}, state, state, table({}).select(list(PK)), [2, 3])
    path = Path(manifest_path(str(tmp_path), 7, "agg", 1))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"chains": {str(k): v for k, v in written.chains.items()}, "state_bytes": state.nbytes}))
    task = LaneTask(step="agg", epoch=7, checkpoint=str(tmp_path), kernel=None, routing=(0, 0, 1, 1),  # type: ignore[arg-type]
                    index={}, watermark_ms=0)

    worker0 = store(tmp_path)  # a fresh cache: the worker that ran lane 0
    assert warm_other_lanes(task, worker0, lane=0, wait_s=1.0) == state.num_rows
    index = dict(written.chains)
    misses = worker0.cache.misses
    assert as_dict(worker0.load(index, [2, 3])) == as_dict(state)
    assert worker0.cache.misses == misses  # all from the cache

    full = store(tmp_path, cache_bytes=state.nbytes // 2)  # no room: nothing is loaded
    assert warm_other_lanes(task, full, lane=0, wait_s=1.0) == 0
    late = LaneTask(step="agg", epoch=8, checkpoint=str(tmp_path), kernel=None, routing=(0, 0, 1, 1),  # type: ignore[arg-type]
                    index={}, watermark_ms=0)
    assert warm_other_lanes(late, store(tmp_path), lane=0, wait_s=0.05) == 0  # lane 1 never wrote epoch 8


def test_a_lane_that_advances_its_watermark_after_the_rows_writes_one_exact_change() -> None:
    """A step fed by another stateful step takes in the epoch's rows at the watermark in force,
    then advances (``EpochPlan.advance``): the lane's two kernel calls are one result whose
    upserts and deletes rebuild its state, with the outputs of both calls in order."""
    import numpy as np
    import pyarrow as pa

    from eddyline.operators.window import WindowConfig, WindowKernel, partial_aggregate
    from eddyline.runtime.lanes import process
    from tests.operators.harness import Driver, exact_delta
    from tests.operators.windowrows import make_rows

    cfg = WindowConfig(("auction",), 4_000, 2_000, (("n", "count", None), ("total", "sum", "price")),
                       allowed_lateness_ms=3_000)
    rows = make_rows(600, seed=3, keys=4, span_ms=40_000)
    kernel = WindowKernel(cfg, cfg.partial_schema(rows.schema))
    separate = Driver(kernel)
    state = kernel.state_schema.empty_table()
    in_force, merged = 0, 0
    rng = np.random.default_rng(5)
    for lo in range(0, 600, 50):
        batch = rows.slice(lo, 50)
        batch = batch.take(pa.array(rng.permutation(batch.num_rows)))  # rows a little out of order
        advance = int(batch.column("ts").to_numpy().astype("int64").max() // 1000) - 2_500
        partials, _ = partial_aggregate(cfg, batch, "ts", in_force)
        first = separate.step(partials, in_force)
        then = separate.step(partials.schema.empty_table(), advance)
        result = process(kernel, partials, state, in_force, advance)
        exact_delta(kernel, state, result)
        assert result.output.equals(pa.concat_tables([first.output, then.output]))
        assert result.state.equals(then.state)
        merged += bool(first.upserts.num_rows + first.deletes.num_rows and then.upserts.num_rows + then.deletes.num_rows)
        state, in_force = result.state, max(in_force, advance)
    assert merged >= 3  # the case where both calls changed the state was exercised
    assert separate.metrics["windows_fired"] > 10
