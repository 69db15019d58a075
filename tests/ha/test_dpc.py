"""The Delay-Process-Correct decision, on a clock the test moves."""

from __future__ import annotations

from eddyline.ha.dpc import DelayProcessCorrect, Verdict


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_waits_up_to_max_delay_then_goes_on_tentatively_then_corrects_once_the_source_is_back() -> None:
    clock = Clock()
    dpc = DelayProcessCorrect(2.0, clock)
    assert dpc.verdict([], []) == Verdict.RUN
    assert dpc.verdict(["a"], []) == Verdict.WAIT
    clock.now += 1.9
    assert dpc.verdict(["a"], []) == Verdict.WAIT
    assert abs(dpc.waited_s("a") - 1.9) < 1e-9
    clock.now += 0.1
    assert dpc.verdict(["a"], []) == Verdict.TENTATIVE
    # the commit is tentative now: no more waiting while the source stays away
    assert dpc.verdict(["a"], ["a"]) == Verdict.TENTATIVE
    assert dpc.verdict([], ["a"]) == Verdict.CORRECT
    assert dpc.waited_s("a") == 0.0


def test_a_source_that_comes_back_before_max_delay_restarts_the_clock() -> None:
    clock = Clock()
    dpc = DelayProcessCorrect(2.0, clock)
    assert dpc.verdict(["a"], []) == Verdict.WAIT
    clock.now += 1.5
    assert dpc.verdict([], []) == Verdict.RUN
    assert dpc.verdict(["a"], []) == Verdict.WAIT
    clock.now += 1.5
    assert dpc.verdict(["a"], []) == Verdict.WAIT  # 1.5 s since it went away again, not 3


def test_every_source_that_is_down_must_have_waited_and_none_may_be_down_to_correct() -> None:
    clock = Clock()
    dpc = DelayProcessCorrect(2.0, clock)
    dpc.verdict(["a"], [])
    clock.now += 1.5
    assert dpc.verdict(["a", "b"], []) == Verdict.WAIT  # b has only just gone
    clock.now += 2.0
    assert dpc.verdict(["a", "b"], []) == Verdict.TENTATIVE
    assert dpc.verdict(["b"], ["a", "b"]) == Verdict.TENTATIVE  # a is back, b is not: go on
    assert dpc.verdict([], ["a", "b"]) == Verdict.CORRECT
