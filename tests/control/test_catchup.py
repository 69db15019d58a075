"""Epochs sized by the backlog, as a pure policy."""

from __future__ import annotations

import pytest

from eddyline.api.control import CatchUp
from eddyline.control.catchup import ROWS_PER_BYTE_PRIOR, CatchUpSizer, Taken, Waiting
from eddyline.control.state import ControllerState


def sizer(**cfg) -> CatchUpSizer:
    return CatchUpSizer(CatchUp(**{"target": 2_000, "max_rows": 1_000_000, "first_rows": 100_000, "growth": 4.0, **cfg}))


def test_what_fits_one_epoch_is_taken_whole():
    s = sizer()
    assert s.size(1, {"a": Waiting(60_000), "b": Waiting(40_000)}).caps == {}
    assert s.size(1, {"f": Waiting(3, sizes=(10_000, 10_000, 10_000))}).caps == {}  # ~1,900 rows by the prior


def test_a_first_epoch_behind_takes_first_rows_shared_by_what_each_source_has_waiting():
    s = sizer()
    sized = s.size(1, {"a": Waiting(300_000), "b": Waiting(100_000)})
    assert sized.caps == {"a": 75_000, "b": 25_000}
    d = sized.decision
    assert d is not None and d.kind == "catch_up" and d.action["takeRows"] == 100_000
    assert d.why["waitingRows"] == 400_000 and d.why["boundedBy"] == "growth"
    assert "400,000 rows waiting" in d.why["reason"]


def test_files_are_taken_whole_by_their_bytes_and_the_rows_per_byte_they_showed():
    s = sizer()
    sizes = tuple([1_600_000] * 10)  # 100,000 rows a file by Parquet's prior of 1/16 row a byte
    assert ROWS_PER_BYTE_PRIOR["parquet"] * 1_600_000 == 100_000
    assert s.size(1, {"f": Waiting(10, sizes)}).caps == {"f": 1}
    assert s.size(1, {"f": Waiting(10, sizes, prior=ROWS_PER_BYTE_PRIOR["text"])}).caps == {"f": 8}  # text: 12,500 a file
    # measured: 1 row per 80 bytes, so a file is 10,000 rows; grown to 400,000 rows = 40 files
    s.observe(Taken(1, 40.0, {"f": 10_000}, {"f": 1}, {"f": 800_000}))
    assert s.rows_per_offset("f", files=True) == pytest.approx(1 / 80)
    assert s.size(2, {"f": Waiting(100, tuple([800_000] * 100))}).caps == {"f": 40}
    # never fewer than one file, however large
    assert s.size(3, {"f": Waiting(2, (10**12, 1))}).caps == {"f": 1}


def test_an_epoch_within_the_target_lets_the_next_grow_and_the_model_then_bounds_it():
    s = sizer(max_rows=10_000_000)
    s.observe(Taken(1, 450.0, {"a": 100_000}, {"a": 100_000}))
    assert s.model() == (0.0, 0.0045)  # one epoch: all its time charged to its rows, 444,444 fit
    assert s.allowance() == (400_000, "growth")
    s.observe(Taken(2, 1_650.0, {"a": 400_000}, {"a": 400_000}))
    f, a = s.model()
    assert f == pytest.approx(50.0) and a == pytest.approx(0.004)
    rows, why = s.allowance()
    assert why == "target" and rows == pytest.approx(487_500, abs=1)  # (2,000 - 50) / 0.004
    d = s.size(3, {"a": Waiting(5_000_000)}).decision
    assert d is not None and d.expected["epochMs"] == pytest.approx(2_000.0, abs=1)


def test_an_overrun_epoch_charges_its_rows_its_whole_time_and_max_rows_always_bounds():
    s = sizer()
    s.observe(Taken(1, 9_000.0, {"a": 100_000}, {"a": 100_000}, cold=True))  # even a cold one
    assert s.model() == (0.0, 0.09) and s.allowance() == (22_222, "target")  # 2,000 / 0.09
    big = sizer(max_rows=150_000)
    big.observe(Taken(1, 100.0, {"a": 100_000}, {"a": 100_000}))
    assert big.allowance() == (150_000, "max_rows")


def test_a_sink_latency_bound_below_the_target_is_aimed_at_instead():
    s = CatchUpSizer(CatchUp(target=5_000), bound_ms=800.0)
    assert s.target_ms == 800.0
    s.observe(Taken(1, 200.0, {"a": 30_000}, {"a": 30_000}))
    s.observe(Taken(2, 300.0, {"a": 50_000}, {"a": 50_000}))
    rows, why = s.allowance()  # F = 50, a = 0.005: (800 - 50) / 0.005
    assert why == "target" and rows == pytest.approx(150_000, abs=1)


def test_a_cold_epoch_counts_for_growth_and_rows_but_not_for_the_model():
    s = sizer()
    s.observe(Taken(1, 50.0, {"f": 20_000}, {"f": 2}, {"f": 2_000_000}, cold=True))
    assert s.model() == (0.0, 0.0025) and s.rows_per_offset("f", files=True) == 0.01
    assert s.allowance() == (400_000, "growth")  # it met the target even cold
    s.observe(Taken(2, 400.0, {"f": 100_000}, {"f": 10}, {"f": 10_000_000}))
    assert s.model() == (0.0, 0.004)  # the warm one alone, all of its time charged to its rows
    s.observe(Taken(3, 700.0, {"f": 200_000}, {"f": 20}, {"f": 20_000_000}))
    assert s.model() == (pytest.approx(100.0), pytest.approx(0.003))


def test_a_replayed_epoch_replaces_what_it_had_recorded():
    s = sizer()
    s.observe(Taken(1, 100.0, {"a": 100}, {"a": 100}))
    s.observe(Taken(2, 100.0, {"a": 200}, {"a": 200}))
    s.observe(Taken(2, 150.0, {"a": 300}, {"a": 300}))
    assert [(t.epoch, t.duration_ms) for t in s.history] == [(1, 100.0), (2, 150.0)]


def test_its_state_goes_through_the_controllers_json_and_back():
    s = sizer()
    s.observe(Taken(1, 600.0, {"a": 100_000, "f": 20}, {"a": 100_000, "f": 2}, {"f": 160}, cold=True))
    s.observe(Taken(2, 900.0, {"a": 300_000}, {"a": 300_000}))
    state = ControllerState.model_validate_json(ControllerState(catch_up=s.state()).model_dump_json())
    t = sizer()
    assert state.catch_up is not None
    t.restore(state.catch_up)
    assert list(t.history) == list(s.history)
    assert t.allowance() == s.allowance() and t.model() == s.model()


def test_small_epochs_of_a_query_keeping_up_do_not_make_a_row_look_costly():
    """Charged its whole time, an epoch of 10 rows would put a row at 15 ms and cut a burst into
    133-row epochs; epochs under a tenth of first_rows stay out of the model."""
    s = sizer()
    for e in range(1, 6):
        s.observe(Taken(e, 150.0, {"a": 10}, {"a": 10}))
    assert s.model() is None
    assert s.allowance() == (400_000, "growth")
    sized = s.size(6, {"a": Waiting(1_000_000)})
    assert sized.caps == {"a": 400_000}
