"""The controller's whole state as data: saved with every epoch plan (as it stood once the plan
was made) and every commit (once the epoch was observed), and restored when a driver starts, so
a restarted driver takes the decisions an uninterrupted one would have taken."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ControllerState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = 1
    #: the distribution manager's: load history per step, the balancers' cool-downs and streaks,
    #: the scalers' last changes, placed steps, box lanes, decisions still to be measured
    manager: dict[str, Any]
    #: the overload controller's: its cost history, semantic thresholds, model check (if on)
    overload: dict[str, Any] | None = None
