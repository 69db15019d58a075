"""The admission checks of replay, undo and apply over a checkpoint's history, without Spark."""

from dataclasses import dataclass, field
from typing import Any

from eddyline.api.validate import spec_from_raw
from eddyline.runtime.admission import Running, alone, refusal, taken_back, went_on_from

SPEC = spec_from_raw({
    "name": "q",
    "sources": [{"name": "in", "files": {"path": "/tmp/in", "format": "json", "schema": "k long"}}],
    "sinks": [{"name": "out", "input": "in", "files": {"path": "/tmp/out", "format": "json"}}],
})


@dataclass
class Plan:
    base: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    applied: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class History:
    plans: dict[int, Plan]
    commits: set[int]
    meta: dict[str, Any] = field(default_factory=dict)

    def has_plan(self, epoch: int) -> bool:
        return epoch in self.plans

    def has_commit(self, epoch: int) -> bool:
        return epoch in self.commits

    def read_plan(self, epoch: int) -> Plan:
        return self.plans[epoch]

    def metadata(self) -> dict[str, Any]:
        return self.meta


class Rewinds:
    rewinds = True

    def rewind_problem(self, *args: Any) -> str | None:
        return None


class Prints:
    rewinds = False


def running(**kw: Any) -> Running:
    return Running(**{"base_spec": SPEC, "spec": SPEC, "hot": False, "catch_up": {}, "sinks": {"out": Rewinds()},
                      "checkpoint_id": "ck", "retain_epochs": 3, "analyze": lambda new: None} | kw)


def history(last: int, **bases: int) -> History:
    return History({e: Plan(base=bases.get(f"e{e}")) for e in range(1, last + 1)}, set(range(1, last + 1)))


def test_what_a_command_does_alone() -> None:
    assert alone({"undo": 3, "network": {}}) == "undo"
    assert alone({"replay": 3, "network": {}}) == "replay"
    assert alone({"network": {}}) == "apply"
    assert alone({"set": {"a.b": 1}}) is None


def test_a_replay_goes_on_from_the_commit_before_or_the_base() -> None:
    h = history(6, e5=2)  # epoch 5 replayed from epoch 3: it went on from commit 2
    assert went_on_from(h, 4) == 3 and went_on_from(h, 5) == 2
    assert taken_back(h, 3, 6) == (5, 2)
    assert taken_back(h, 2, 6) is None and taken_back(h, 5, 6) is None


def test_refusals_name_what_and_why() -> None:
    h = history(5)
    assert refusal({"replay": 2}, 5, running(), h) is None
    assert refusal({"replay": 9}, 5, running(), h) == "replay: expected an epoch from 1 to 5, the last committed, got 9"
    assert refusal({"replay": 2}, 5, running(hot=True), h) == (
        "replay: a hot pair or a network with max_delay cannot do this live yet")
    assert refusal({"undo": 2}, 5, running(sinks={"console": Prints()}), h).startswith(
        "undo: sink(s) console cannot take published epochs back")
    assert refusal({"undo": 4}, 5, running(), h) == "undo: epoch 4 did not replay earlier epochs; there is nothing to undo"
    h.commits.discard(1)
    assert refusal({"replay": 2}, 5, running(), h) == (
        "replay: epoch 1 is no longer kept (the checkpoint keeps the last 3 epochs; raise the network's history "
        "to go further back)")


def test_a_replay_of_an_epoch_taken_back_is_refused() -> None:
    h = history(6, e5=2)
    assert refusal({"replay": 3}, 6, running(), h) == (
        "replay: epoch 3 was taken back by epoch 5, which went on from epoch 2; replay from epoch 5 or from an epoch up to 2")


def test_an_undo_in_the_wrong_order_is_refused() -> None:
    h = history(6, e3=1, e5=1)
    h.plans[3].applied, h.plans[5].applied = [{"replay": 2}], [{"replay": 2}]
    assert refusal({"undo": 3}, 6, running(), h) == (
        "undo: the replay at epoch 5 came later and is still in force; undo it first "
        "(replays are undone in the reverse order they were made)")
    assert refusal({"undo": 5}, 6, running(), h) is None


def test_catch_ups_and_merges_bound_a_rewind() -> None:
    h = history(6)
    assert refusal({"replay": 2}, 6, running(catch_up={"in_copy": ("in", ("b", "a"))}), h) == (
        "replay: step(s) a, b still catch up on copies of running sources; replay once they read the sources themselves")
    h.meta = {"caught_up": [{"epoch": 4}]}
    assert refusal({"undo": 3}, 6, running(), h) == (
        "undo: added steps went over from a copy to its source at epoch 4; undo can go back to epoch 5 at the earliest")
