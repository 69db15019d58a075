"""The driver's modes: the legal transitions and the mode the engine's facts add up to."""

import pytest

from eddyline.runtime.modes import TRANSITIONS, Driver, IllegalTransition, Mode, settled


def test_a_pause_wins_over_every_other_fact() -> None:
    assert settled(paused=True, replaying=True, following=True, catching_up=True) is Mode.PAUSED
    assert settled(paused=False, replaying=True, following=True, catching_up=True) is Mode.FOLLOWING
    assert settled(paused=False, replaying=True, following=False, catching_up=True) is Mode.REPLAYING
    assert settled(paused=False, replaying=False, following=False, catching_up=True) is Mode.CATCHING_UP
    assert settled(paused=False, replaying=False, following=False, catching_up=False) is Mode.LEADING


def test_a_transition_keeps_its_reason_and_staying_is_none() -> None:
    driver = Driver()
    assert driver.mode is Mode.STARTING and driver.last is None
    assert driver.to(Mode.LEADING, "started")
    assert driver.to(Mode.PAUSED, "paused by command c1")
    assert not driver.to(Mode.PAUSED, "again")
    assert driver.paused
    assert driver.last is not None and driver.last.to_json() | {"at": 0} == {
        "from": "leading", "to": "paused", "reason": "paused by command c1", "at": 0}


def test_a_fenced_driver_only_stops() -> None:
    driver = Driver()
    driver.to(Mode.FOLLOWING, "a hot pair's follower")
    driver.to(Mode.FENCED, "another driver took the lease over")
    with pytest.raises(IllegalTransition, match="no transition from fenced to leading"):
        driver.to(Mode.LEADING, "no")
    driver.to(Mode.STOPPED, "run() returned")
    driver.to(Mode.STARTING, "run() called again")


def test_every_mode_can_stop_or_is_stopped() -> None:
    assert set(TRANSITIONS) == set(Mode)
    assert all(Mode.STOPPED in after for mode, after in TRANSITIONS.items() if mode is not Mode.STOPPED)
    assert not any(Mode.STARTING in after for mode, after in TRANSITIONS.items() if mode is not Mode.STOPPED)
