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
