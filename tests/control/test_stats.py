"""Load statistics from lane manifests (no Spark): how a step's measured time is shared out over
its key groups, or its rows counted instead (``control.load: rows``)."""

from __future__ import annotations

import pytest

from eddyline.control.stats import LoadHistory, StepLoad, step_load

K = 8


def test_step_load_shares_the_steps_time_out_by_rows_and_state() -> None:
    manifests = [
        {"lane": 0, "ms": {"receive": 10, "kernel": 30, "load": 5, "write": 15}, "input_rows": 40, "state_rows": 10,
         "state_bytes": 100, "kg_rows": {"0": 30, "1": 10}, "kg_state_rows": {"0": 5, "2": 5}},
        {"lane": 1, "ms": {"receive": 1, "kernel": 1, "load": 1, "write": 1}, "input_rows": 0, "state_rows": 4,
         "state_bytes": 40, "kg_rows": {}, "kg_state_rows": {"3": 4}},
    ]
    s = step_load(7, 2, manifests, wall_s=2.0)
    assert s.lane_busy_ms == [60.0, 4.0]
    # the step's time per input row (42 ms / 40 rows) and per state row (22 ms / 14 rows), over
    # both lanes: a load follows the group's rows, the clocks only set the scale
    per_row, per_state = 42 / 40, 22 / 14
    assert s.kg_load == pytest.approx({0: 30 * per_row + 5 * per_state, 1: 10 * per_row, 2: 5 * per_state, 3: 4 * per_state})
    assert sum(s.kg_load.values()) == pytest.approx(sum(s.lane_busy_ms))  # nothing lost, nothing invented
    assert s.lane_shares() == [1.0, round(4 / 60, 3)]
    h = LoadHistory(K)
    h.add("x", s)
    assert h.rates("x") == pytest.approx((40 / 2.0, 40 / 0.064))


def test_the_kernels_time_follows_its_own_count_of_work_where_it_keeps_one() -> None:
    """Two key groups with the same rows: by rows they cost the same; with the kernel's count of
    its work per group (the pattern's rows x open runs) the kernel's time is shared 3 : 1, while
    receiving still follows the rows."""
    base = {"lane": 0, "ms": {"receive": 20, "kernel": 40, "load": 0, "write": 0}, "input_rows": 20,
            "state_rows": 0, "state_bytes": 0, "kg_rows": {"0": 10, "1": 10}, "kg_state_rows": {}}
    by_rows = step_load(3, 1, [base], wall_s=1.0)
    assert by_rows.kg_load == pytest.approx({0: 30.0, 1: 30.0})
    by_work = step_load(3, 1, [{**base, "kg_cost": {"0": 300, "1": 100}}], wall_s=1.0)
    assert by_work.kg_load == pytest.approx({0: 10 + 30.0, 1: 10 + 10.0})
    assert sum(by_work.kg_load.values()) == pytest.approx(60.0)


def test_loads_in_rows_count_the_rows_worked_on_whatever_the_clocks_say() -> None:
    base = {"lane": 0, "ms": {"receive": 20, "kernel": 40, "load": 0, "write": 0}, "input_rows": 20,
            "state_rows": 5, "state_bytes": 50, "kg_rows": {"0": 15, "1": 5}, "kg_state_rows": {"0": 5}}
    slow = {**base, "ms": {"receive": 200, "kernel": 400, "load": 9, "write": 9}}
    a, b = step_load(3, 1, [base], wall_s=1.0, measure="rows"), step_load(3, 1, [slow], wall_s=1.0, measure="rows")
    assert a.kg_load == b.kg_load == {0: 15.0, 1: 5.0}
    assert a.lane_busy_ms != b.lane_busy_ms  # the lanes' times are still reported as measured
    # a kernel that holds rows back: its load is the rows it worked on
    deferring = step_load(3, 1, [{**base, "kg_work": {"0": 2, "1": 8}, "kg_held": {}}], wall_s=1.0, measure="rows")
    assert deferring.kg_load == {0: 2.0, 1: 8.0}


def test_a_step_load_round_trips_exactly() -> None:
    manifests = [{"lane": 0, "ms": {"receive": 1.25, "kernel": 3.5, "load": 0.1, "write": 0.2}, "input_rows": 3,
                  "state_rows": 2, "state_bytes": 20, "kg_rows": {"5": 2, "6": 1}, "kg_state_rows": {"5": 2},
                  "hot_keys": [{"kg": 5, "key": "a", "rows": 2}]}]
    load = step_load(9, 1, manifests, wall_s=0.3)
    assert StepLoad.from_state(load.state()) == load
    h = LoadHistory(K, depth=2)
    for epoch in (1, 2, 3):
        h.add("s", StepLoad(**{**load.state(), "epoch": epoch, "kg_load": load.kg_load, "kg_rows": load.kg_rows,
                               "kg_state_rows": load.kg_state_rows, "kg_held": load.kg_held}))
    again = LoadHistory(K, depth=2)
    again.restore(h.state())
    assert [x.epoch for x in again.epochs("s")] == [2, 3]
    assert (again.series("s") == h.series("s")).all()
