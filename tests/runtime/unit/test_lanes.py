"""A lane's worker, outside Spark: warming its cache from the state other lanes just wrote."""

from __future__ import annotations

from pathlib import Path

from tests.state.test_store import PK, as_dict, store, table


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
