"""The overload controller on synthetic epochs (no Spark): admission caps, shed plans, hot spots."""

from __future__ import annotations

import pytest

from eddyline.control.overload import EpochCost, OverloadController

from .overloads import epoch, spec


def test_fits_the_bound_takes_everything() -> None:
    c = OverloadController(spec({"cost_model": {"fixed_ms": 100, "step_ms_per_row": {"a": 0.01}}}))
    for e in (1, 2):
        c.observe(epoch(e, 1000))
    verdict = c.plan(3, {"src": 50_000})  # 100 + 0.01 * 50000 = 600 ms <= 0.8 * 1000
    assert verdict.caps == {} and verdict.shed == {}
    assert verdict.explain["reason"] == "fits the bound"


def test_admission_control_caps_offsets_to_the_bound() -> None:
    c = OverloadController(spec({"shedding": "off", "cost_model": {"fixed_ms": 200, "step_ms_per_row": {"a": 0.01}}}))
    for e in (1, 2):
        c.observe(epoch(e, 1000))
    verdict = c.plan(3, {"src": 200_000})
    assert verdict.shed == {}
    assert verdict.caps == {"src": 60_000}  # (800 - 200) / 0.01
    assert verdict.explain["predictedMs"] == pytest.approx(800, abs=1)


def test_lp_sheds_half_when_twice_the_capacity_arrives() -> None:
    c = OverloadController(spec({"cost_model": {"step_ms_per_row": {"a": 0.01}}}))
    for e in (1, 2):
        c.observe(epoch(e, 1000))
    verdict = c.plan(3, {"src": 160_000})  # 1600 ms of work for an 800 ms budget
    assert verdict.caps == {}  # everything is read (no backlog), half of it is shed
    assert verdict.shed["a"]["keep"] == [0.5]
    assert verdict.explain["status"] == "optimal"
    again = c.plan(3, {"src": 160_000})
    assert again.shed["a"]["seed"] == verdict.shed["a"]["seed"]  # a replay draws the same rows


def test_upstream_shedding_when_the_downstream_step_is_the_expensive_one() -> None:
    """b costs ten times a; shedding at b's input would leave a doing work nobody uses, so the
    LP sheds at a's input (upstream), and b keeps all that reaches it."""
    c = OverloadController(spec({"cost_model": {"step_ms_per_row": {"a": 0.001, "b": 0.01}}}, chain=True))
    for e in (1, 2):
        c.observe(epoch(e, 1000, chain=True))
    verdict = c.plan(3, {"src": 160_000})
    assert verdict.shed["a"]["keep"][0] < 1.0
    assert "b" not in verdict.shed
    predicted = verdict.explain["predictedMs"]
    assert predicted == pytest.approx(800, abs=1)


def test_hot_spots_compare_arrival_with_true_rate() -> None:
    c = OverloadController(spec({}))
    for e in (1, 2, 3):  # 10000 rows per wall second; lanes busy 1 s per 10000 rows, 2 lanes
        c.observe(EpochCost(e, 1000, {"src": 10_000}, {"a": [10_000]}, {"a": [10_000]}, {"a": 600},
                            {"a": 1000}, {"a": 2}, {"a": 10_000}, {"out": 10_000}, 1.0))
    (spot,) = c.hot_spots()
    assert spot["arrivalRowsPerSec"] == 10_000 and spot["trueRowsPerSec"] == 20_000 and not spot["hot"]


def test_uniform_shedding_keeps_one_fraction_everywhere() -> None:
    c = OverloadController(spec({"shedding": "uniform", "cost_model": {"step_ms_per_row": {"a": 0.001, "b": 0.01}}},
                                chain=True))
    for e in (1, 2):
        c.observe(epoch(e, 1000, chain=True))
    verdict = c.plan(3, {"src": 160_000})
    keeps = {s: v["keep"][0] for s, v in verdict.shed.items()}
    assert set(keeps) == {"a", "b"} and keeps["a"] == keeps["b"] < 1.0
    assert verdict.explain["reason"] == "shedding (uniform)"
    lp = OverloadController(spec({"cost_model": {"step_ms_per_row": {"a": 0.001, "b": 0.01}}}, chain=True))
    for e in (1, 2):
        lp.observe(epoch(e, 1000, chain=True))
    # at the same epoch budget, the LP keeps more of what the query values
    assert lp.plan(3, {"src": 160_000}).explain["expectedUtility"] > verdict.explain["expectedUtility"]


def _shed_epoch(e: int, read: int, keep: float, *, f: float = 1000.0, a: float = 0.0005, j: float = 0.001,
                c: float = 0.0005) -> EpochCost:
    """An epoch of a one-step network whose true cost is F + a·read + (j + c)·kept: ``c`` is the
    lanes' part (measured), ``j`` the step's JVM work behind the shed point (not measured)."""
    kept = int(read * keep)
    return EpochCost(e, f + a * read + (j + c) * kept, {"src": read}, {"a": [read]}, {"a": [kept]},
                     {"a": c * kept}, {"a": 2 * c * kept}, {"a": 2}, {"a": kept}, {"out": kept}, 1.0)


def test_the_jvm_work_behind_a_shed_point_is_told_apart_from_reading_once_epochs_shed() -> None:
    c = OverloadController(spec({}))
    for e, rows in enumerate((300_000, 600_000, 1_000_000, 800_000), start=1):
        c.observe(_shed_epoch(e, rows, 1.0))
    m = c.model()
    assert not m.jvm_ms_per_row and m.read_ms_per_row > 0.0012  # nothing shed yet: the step's JVM work counts as reading
    for e, (rows, keep) in enumerate(((2_000_000, 0.3), (1_800_000, 0.45)), start=5):
        c.observe(_shed_epoch(e, rows, keep))
    m = c.model()
    assert m.read_ms_per_row == pytest.approx(0.0005, rel=0.02)
    assert m.jvm_ms_per_row["a"] == pytest.approx(0.001, rel=0.02)
    assert m.step_ms_per_row["a"] == pytest.approx(0.0015, rel=0.02)
    assert m.fixed_ms == pytest.approx(1000, rel=0.02)


def test_a_declared_cost_model_that_misses_twice_gives_way_to_the_fitted_one() -> None:
    c = OverloadController(spec({"cost_model": {"fixed_ms": 100, "step_ms_per_row": {"a": 0.0001}}}))
    for e in (1, 2, 3):  # each epoch takes 800 ms; the declared model says 100 + 0.0001 * 1000 = 100.1 ms
        c.observe(epoch(e, 1000))
    assert c.model_check["misses"] == 1 and c.model_check["model"] == "declared"
    assert c.model().fixed_ms == 100
    c.observe(epoch(4, 1000))
    assert c.model_check["misses"] == 2 and "switched" in c.model_check
    assert c.model().fixed_ms == pytest.approx(800.0)  # fitted: every epoch took 800 ms for the same rows
    verdict = c.plan(5, {"src": 1000})
    assert verdict.explain["modelCheck"]["ratio"] > 1.5
    # the switch is part of the controller's state, so a restart decides the same way
    again = OverloadController(c.spec)
    again.restore(c.state())
    assert again.model() == c.model()

    # on_miss: report keeps the declared model and only says how far off it is
    kept = OverloadController(spec({"cost_model": {"fixed_ms": 100, "step_ms_per_row": {"a": 0.0001}, "on_miss": "report"}}))
    for e in (1, 2, 3, 4, 5):
        kept.observe(epoch(e, 1000))
    assert kept.model_check["misses"] == 3 and "switched" not in kept.model_check
    assert kept.model().fixed_ms == 100


def test_a_keep_fraction_rises_at_most_twofold_per_epoch_while_shedding() -> None:
    c = OverloadController(spec({"cost_model": {"step_ms_per_row": {"a": 0.01}}}))
    c.observe(epoch(1, 1000))
    # the last epoch kept a fifth of what reached the step
    c.observe(EpochCost(2, 800, {"src": 100_000}, {"a": [100_000]}, {"a": [20_000]}, {"a": 500.0},
                        {"a": 1000.0}, {"a": 2}, {"a": 20_000}, {"out": 20_000}, 1.0))
    verdict = c.plan(3, {"src": 100_000})  # the LP alone would keep 0.8 (800 ms / 0.01 ms per row)
    assert verdict.shed["a"]["keep"] == [0.4]
    assert verdict.explain["keepRiseLimited"] == {"a": [0.4]}
    assert verdict.explain["predictedMs"] == pytest.approx(400, abs=1)  # what the limited plan costs
    # a fall is never limited, and without shedding last epoch nothing is limited either
    c.observe(EpochCost(3, 800, {"src": 100_000}, {"a": [100_000]}, {"a": [100_000]}, {"a": 500.0},
                        {"a": 1000.0}, {"a": 2}, {"a": 100_000}, {"out": 100_000}, 1.0))
    free = c.plan(4, {"src": 100_000})
    assert free.shed["a"]["keep"] == [0.8] and "keepRiseLimited" not in free.explain


def test_one_shedding_epoch_separates_the_jvm_work_when_the_other_epochs_pin_f_and_a() -> None:
    c = OverloadController(spec({}))
    for e, rows in enumerate((300_000, 600_000, 1_000_000), start=1):
        c.observe(_shed_epoch(e, rows, 1.0))
    c.observe(_shed_epoch(4, 2_000_000, 0.3))
    m = c.model()
    assert m.read_ms_per_row == pytest.approx(0.0005, rel=0.02) and m.jvm_ms_per_row["a"] == pytest.approx(0.001, rel=0.02)
    # with every unshed epoch the same size, one shedding epoch is not enough
    same = OverloadController(spec({}))
    for e in (1, 2, 3):
        same.observe(_shed_epoch(e, 600_000, 1.0))
    same.observe(_shed_epoch(4, 2_000_000, 0.3))
    assert not same.model().jvm_ms_per_row


def test_a_fitted_model_never_hands_a_step_more_than_twice_the_rows_it_ever_kept() -> None:
    c = OverloadController(spec({}))
    for e, rows in enumerate((100_000, 200_000, 150_000), start=1):  # 1 ms per 1000 rows, F 100 ms
        c.observe(EpochCost(e, 100 + rows / 1000, {"src": rows}, {"a": [rows]}, {"a": [rows]}, {"a": rows / 1000},
                            {"a": 2 * rows / 1000}, {"a": 2}, {"a": rows}, {"out": rows}, 1.0))
    # budget 800 ms, F 100 ms, 1 µs per kept row: the fit alone would keep 0.7 of 1M rows, but the
    # step never kept more than 200k rows in an epoch, so it gets at most 400k
    verdict = c.plan(4, {"src": 1_000_000})
    assert verdict.shed["a"]["keep"] == [0.4]
    assert verdict.explain["keepRiseLimited"] == {"a": [0.4]}
    assert verdict.caps == {}  # everything is still read
