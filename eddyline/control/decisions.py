"""What the control plane decided, as data: a :class:`Decision` of one :class:`DecisionKind`,
with why (the statistics), what it expected and, a few epochs later, what was measured.

The kinds are typed; in JSON (plans, progress records) a kind is its plain string value, as
before: ``placement``, ``rescale``, ``balance``, ``spread``, ``chaos``, ``overload``, ``rewrite``,
``catch_up``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class DecisionKind(StrEnum):
    PLACEMENT = "placement"
    RESCALE = "rescale"
    BALANCE = "balance"
    SPREAD = "spread"
    CHAOS = "chaos"
    OVERLOAD = "overload"  # made by the overload controller, logged beside the routing decisions
    REWRITE = "rewrite"  # a rule rewrote the network (eddyline.kinds.rewrite)
    CATCH_UP = "catch_up"  # an epoch sized by the backlog (eddyline.control.catchup)


@dataclass
class Decision:
    epoch: int  # the first epoch that runs with it
    step: str
    kind: DecisionKind
    action: dict[str, Any]
    why: dict[str, Any]
    expected: dict[str, Any]
    measured: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": str(self.kind)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        return cls(**{**data, "kind": DecisionKind(data["kind"])})
