"""The controller's whole state as data: saved with every epoch plan (as it stood once the plan
was made) and every commit (once the epoch was observed), and restored when a driver starts, so
a restarted driver takes the decisions an uninterrupted one would have taken.

One typed, frozen :class:`ControllerState`; in JSON it is ``model_dump(mode="json")`` and back
``model_validate``. Numbers keep their type through the round trip (an ``int`` stays an
``int``, a ``float`` the very same ``float``), so a restored controller computes bit for bit
what the running one would have. The models hold copies: a snapshot does not change when the
controller goes on, and restoring one gives the controller objects of its own.

Only hysteresis and statistics are kept, never configuration: a restored balancer or scaler
takes its settings from the spec (which the checkpoint's fingerprint pins).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from eddyline.control.decisions import DecisionKind

#: A measured quantity, kept as it was measured: an int stays an int, a float stays a float.
Number = int | float


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


# ---------------------------------------------------------------------- the manager's
class LoadRecord(_Data):
    """One :class:`~eddyline.control.stats.StepLoad` (a step's statistics of one epoch)."""

    epoch: int
    lanes: int
    kg_load: dict[int, Number]
    kg_rows: dict[int, Number]
    kg_state_rows: dict[int, Number]
    lane_busy_ms: list[Number]
    input_rows: Number
    state_rows: Number
    state_bytes: Number
    spilled_bytes: Number
    wall_s: Number
    hot_keys: list[dict[str, Any]] = []
    kg_work: dict[int, Number] | None = None
    kg_held: dict[int, Number] = {}
    held_before: Number = 0
    held_worked: Number = 0


class DecisionRecord(_Data):
    """One :class:`~eddyline.control.decisions.Decision`."""

    epoch: int
    step: str
    kind: DecisionKind
    action: dict[str, Any]
    why: dict[str, Any]
    expected: dict[str, Any]
    measured: dict[str, Any] | None = None


class BalancerState(_Data):
    """A balancer's hysteresis (:class:`~eddyline.control.policies.Balancer`)."""

    #: the epoch it last evaluated (it evaluates every ``period`` epochs)
    last_eval: int | None = None
    #: evaluations in a row that saw the lanes out of balance (it acts after ``patience``)
    streak: int = 0
    #: its cool-downs: [key group, evaluations it stays put] for the key groups it moved
    frozen: list[tuple[int, int]] = []


class ScalerState(_Data):
    """A scaler's hysteresis (:class:`~eddyline.control.policies.Scaler`)."""

    #: the epoch of its last change of the lane count (none within ``cooldown`` epochs after)
    last_change: int | None = None


class ManagerState(_Data):
    """The distribution manager's (:class:`~eddyline.control.manager.DistributionManager`)."""

    #: per step, the statistics of its last epochs (at most ``control.history``), oldest first;
    #: None in a snapshot taken without the statistics (see :meth:`Controller.snapshot`)
    history: dict[str, list[LoadRecord]] | None = {}
    balancers: dict[str, BalancerState] = {}
    scalers: dict[str, ScalerState] = {}
    #: steps whose initial placement was made (or is not to be made)
    placed: list[str] = []
    #: the lane of each parallelism-1 step, once placed
    box_lanes: dict[str, int] = {}
    #: the decisions still to be measured and the recent ones (what the progress shows)
    decisions: list[DecisionRecord] = []


# ---------------------------------------------------------------------- the overload controller's
class CostRecord(_Data):
    """One :class:`~eddyline.control.overload.EpochCost` (what one epoch measured)."""

    epoch: int
    duration_ms: Number
    read_rows: dict[str, Number]
    offered: dict[str, list[Number]]
    kept: dict[str, list[Number]]
    makespan_ms: dict[str, Number]
    busy_ms: dict[str, Number]
    lanes: dict[str, int]
    out_rows: dict[str, Number]
    sink_rows: dict[str, Number]
    wall_s: Number


class OverloadState(_Data):
    """The overload controller's (:class:`~eddyline.control.overload.OverloadController`)."""

    #: the epochs its cost model is fitted to, oldest first
    history: list[CostRecord] = []
    #: semantic shedding: per step, the utility quantiles seen last epoch
    thresholds: dict[str, list[Number]] = {}
    #: the declared cost model missed twice and gave way to the fitted one
    declared_off: bool = False
    #: the last comparison of the model with an epoch (shown in the overload decision)
    model_check: dict[str, Any] | None = None


# ---------------------------------------------------------------------- epochs sized by the backlog
class TakenRecord(_Data):
    """One :class:`~eddyline.control.catchup.Taken` (what one epoch read)."""

    epoch: int
    duration_ms: Number
    rows: dict[str, Number]
    offsets: dict[str, Number]
    bytes: dict[str, Number] = {}
    cold: bool = False


class CatchUpState(_Data):
    """The backlog sizer's (:class:`~eddyline.control.catchup.CatchUpSizer`): the epochs its
    model is fitted to, oldest first."""

    history: list[TakenRecord] = []


# ---------------------------------------------------------------------- the whole
class ControllerState(_Data):
    """Everything the control plane needs to continue after a restart as if there was none."""

    version: int = 1
    manager: ManagerState = ManagerState()
    #: when the network has ``control.overload``
    overload: OverloadState | None = None
    #: when the network has ``control.catch_up``
    catch_up: CatchUpState | None = None


def fields_plain(obj: Any) -> dict[str, Any]:
    """A dataclass's fields, as :func:`plain` makes them."""
    return plain({f.name: getattr(obj, f.name) for f in fields(obj)})


_ATOMS = frozenset({int, float, str, bool, type(None)})


def plain(x: Any) -> Any:
    """``x`` as plain JSON-able Python: numpy scalars and arrays become Python numbers and lists,
    tuples lists, containers copies (of the same values: a numpy float is the same float)."""
    kind = type(x)
    if kind in _ATOMS:
        return x
    if kind is dict or isinstance(x, Mapping):
        return {
            k if type(k) in _ATOMS else plain(k): v if type(v) in _ATOMS else plain(v)
            for k, v in x.items()
        }
    if kind is list or kind is tuple:
        return [v if type(v) in _ATOMS else plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return plain(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    return x
