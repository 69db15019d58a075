"""Command intake's order and the cleanup's choice of what to keep, without Spark."""

from dataclasses import dataclass, field

from eddyline.runtime.intake import Step, applied_entry, next_step
from eddyline.runtime.upkeep import cleanup_plan


def test_the_order_commands_are_taken_in() -> None:
    assert next_step({"pause": True}, taken=False, paused=False) is Step.PAUSE
    assert next_step({"resume": True}, taken=True, paused=True) is Step.STOP  # those before it first
    assert next_step({"set": {"a.b": 1}}, taken=False, paused=True) is Step.WAIT
    assert next_step({"route": {"step": "s"}}, taken=True, paused=False) is Step.ROUTE
    assert next_step({"set": {"a.b": 1}}, taken=True, paused=False) is Step.SET
    assert next_step({"replay": 2}, taken=False, paused=False) is Step.ALONE
    assert next_step({"network": {}}, taken=True, paused=False) is Step.STOP


def test_the_plan_logs_a_network_by_its_hash_and_a_rewrite_by_its_rule() -> None:
    command = {"id": "c", "network": {"big": 1}, "reset": [], "rewrite": {"rule": "r1", "step": "s"}, "_path": "p"}
    assert applied_entry(command, "n1") == {"id": "c", "reset": [], "network": "n1", "rewrite": "r1"}


@dataclass
class Commit:
    epoch: int
    committed_at: float = 0.0
    tentative: bool = False
    stable: int | None = None
    steps: dict[str, object] = field(default_factory=dict)


def test_a_cleanup_keeps_the_retained_epochs_and_a_tentative_stretch_s_anchor() -> None:
    every = [Commit(e, steps={"agg": object()}) for e in range(1, 11)]
    plan = cleanup_plan(9, every, retain=3, within_ms=None, running=["agg"], stored=lambda: ["agg", "gone"])
    assert plan is not None and plan.keep_from == 7 and [c.epoch for c in plan.kept] == [7, 8, 9, 10]
    assert plan.dropped == ["gone"]
    every[8] = Commit(9, tentative=True, stable=5)
    plan = cleanup_plan(9, every, retain=3, within_ms=None, running=["agg"], stored=lambda: [])
    assert plan is not None and plan.keep_from == 5


def test_a_cleanup_also_keeps_what_was_committed_lately() -> None:
    every = [Commit(e, committed_at=float(e)) for e in range(1, 11)]
    plan = cleanup_plan(10, every, retain=2, within_ms=4000, running=[], stored=lambda: [])
    assert plan is not None and plan.keep_from == 6
    assert cleanup_plan(10, [], retain=2, within_ms=None, running=[], stored=lambda: []) is None


def test_a_fenced_driver_waits_for_a_stuck_cleanup_only_as_long_as_it_is_told() -> None:
    """A cleanup whose requests the store does not answer holds a normal finish (which raises
    what it met) but not a fenced driver's, which gives it ``wait_s`` and goes."""
    import threading
    import time

    import pytest

    from eddyline.errors import CheckpointError
    from eddyline.runtime.upkeep import Cleanups

    answered = threading.Event()

    def stuck(epoch: int) -> None:
        if not answered.wait(10):
            raise OSError("the store did not answer")

    cleanups = Cleanups()
    cleanups.start(stuck, 7)
    t0 = time.monotonic()
    cleanups.finish(raise_error=False, wait_s=0.2)
    assert time.monotonic() - t0 < 1.0
    cleanups.start(stuck, 8)
    threading.Timer(0.3, answered.set).start()
    t0 = time.monotonic()
    cleanups.finish()  # waits for it
    assert time.monotonic() - t0 >= 0.25
    cleanups.start(lambda epoch: (_ for _ in ()).throw(OSError("refused")), 9)
    with pytest.raises(CheckpointError, match="after epoch 9 failed: refused"):
        cleanups.finish()


def test_a_cleanup_under_way_ends_before_the_gates_change_generation(tmp_path) -> None:
    """A follower taking the lease over opens the checkpoint's gate under a new generation, which
    revokes the old one in this same process: a cleanup then moving a file through the old gate
    would fail as if another driver had fenced this one (seen in a hot pair's takeover: "cleaning
    up the checkpoint after epoch 40 failed: Not a directory"). The cleanup ends first."""
    import os
    import threading
    import types

    from eddyline.runtime.checkpoint import Checkpoint
    from eddyline.runtime.networks import Networks
    from eddyline.runtime.upkeep import Cleanups

    ckpt = Checkpoint(str(tmp_path))
    ckpt.fence(1)
    old = tmp_path / "epochs" / "0000000023"
    old.mkdir(parents=True)
    parked, go_on = threading.Event(), threading.Event()

    def clean(epoch: int) -> None:  # a cleanup's move, cut between its two steps
        path = ckpt.gate._park(str(old))
        parked.set()
        go_on.wait(5)
        os.unlink(path) if os.path.isfile(path) else os.rmdir(path)

    engine = types.SimpleNamespace(cleanups=Cleanups(), generation=2, lease=object(), pair=None, ckpt=ckpt,
                                   outputs=types.SimpleNamespace(sinks={}, targets=list))
    engine.cleanups.start(clean, 40)
    assert parked.wait(5)
    threading.Timer(0.2, go_on.set).start()
    Networks._open_gates(engine)  # raises the cleanup's error if the gate changed under it
    assert ckpt.gate.generation == 2 and not old.exists()
