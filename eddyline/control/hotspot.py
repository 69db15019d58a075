"""The hot-spot detector behind graph rewriting (``control.rewrite``): which stateful step is the
network's bottleneck in a way that lanes cannot fix.

A step is a hot spot in an epoch when all three hold:

* it is on the **critical path**: its slowest lane took longer than any other stateful step's
  (the steps of an epoch run one after another where they feed each other, so the slowest lane
  of the busiest step bounds the epoch);
* it is **saturated**: that lane was busy for at least ``saturation`` of the epoch's wall time;
* **lanes cannot fix it**: one key group carries more than ``hot_share`` (>= 1) times a fair
  lane's load with as many lanes as the step may get. Moving key groups (balancing) or adding
  lanes (rescaling) then cannot bring the slowest lane below that key group's load.

It must hold in each of the last ``patience`` epochs. A planned rewrite (``schedule``) is a hot
spot too, with the reason ``schedule``. Pure: reads the load history, decides nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eddyline.api.network import NetworkSpec
from eddyline.control.stats import LoadHistory, StepLoad


@dataclass(frozen=True)
class HotSpot:
    step: str
    why: dict[str, Any]


def hot_spots(
    spec: NetworkSpec, history: LoadHistory, next_epoch: int, max_lanes: int
) -> list[HotSpot]:
    """The hot spots a rewrite at ``next_epoch`` would address, planned ones first."""
    cfg = spec.control.rewrite
    if cfg is None:
        return []
    out = [HotSpot(s, {"reason": "schedule"}) for s in cfg.schedule.get(next_epoch, ())]
    if not cfg.auto:
        return out
    steps = [s.name for s in spec.stateful_steps() if s.name in history.steps()]
    by_epoch: dict[int, dict[str, StepLoad]] = {}
    for name in steps:
        for load in history.epochs(name):
            by_epoch.setdefault(load.epoch, {})[name] = load
    recent = sorted(by_epoch)[-cfg.patience :]
    if len(recent) < cfg.patience or recent[-1] - recent[0] != cfg.patience - 1:
        return out  # not enough consecutive epochs seen yet
    for name in steps:
        if any(h.step == name for h in out):
            continue
        seen = [_judge(name, by_epoch[e], cfg.saturation, cfg.hot_share, max_lanes) for e in recent]
        if all(w is not None for w in seen):
            out.append(HotSpot(name, {"reason": "hot spot", "epochs": seen}))
    return out


def _judge(
    name: str, loads: dict[str, StepLoad], saturation: float, hot_share: float, max_lanes: int
) -> dict[str, Any] | None:
    """Why ``name`` was a hot spot in this epoch (None: it was not)."""
    mine = loads.get(name)
    if mine is None or mine.makespan_ms <= 0 or mine.wall_s <= 0:
        return None
    if any(other.makespan_ms > mine.makespan_ms for n, other in loads.items() if n != name):
        return None  # another step is slower: not on the critical path
    epoch_ms = mine.wall_s * 1000
    if mine.makespan_ms < saturation * epoch_ms:
        return None
    total = sum(mine.kg_load.values())
    if total <= 0:
        return None
    hot, hot_load = max(mine.kg_load.items(), key=lambda kv: (kv[1], -kv[0]))
    fair = total / max(mine.lanes, max_lanes)
    if hot_load <= hot_share * fair:
        return None  # balancing or more lanes can still spread the load
    return {
        "epoch": mine.epoch,
        "makespanMs": round(mine.makespan_ms, 1),
        "epochMs": round(epoch_ms, 1),
        "hotKeyGroup": int(hot),
        "hotShareOfFairLane": round(hot_load / fair, 2),
    }
