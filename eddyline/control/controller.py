"""The control plane of one running network: the distribution manager (routing) and, when the
network has ``control.overload``, the overload controller (admission and shedding), with their
state as one :class:`~eddyline.control.state.ControllerState`.

The engine snapshots the state into every epoch plan (once the plan is made) and every commit
(once the epoch was observed: :meth:`DistributionManager.observe` and
:meth:`OverloadController.observe` come before the commit), and restores a fresh controller
from the commit (or the plan being replayed) when a driver starts."""

from __future__ import annotations

from eddyline.api.network import NetworkSpec
from eddyline.control.catchup import CatchUpSizer
from eddyline.control.manager import DistributionManager
from eddyline.control.overload import OverloadController
from eddyline.control.state import ControllerState


class Controller:
    def __init__(self, spec: NetworkSpec, max_lanes: int):
        self.spec = spec
        self.manager = DistributionManager(spec, max_lanes=max_lanes)
        self.overload = OverloadController(spec) if spec.control.overload is not None else None
        self.catch_up = self._sizer(spec)

    @staticmethod
    def _sizer(spec: NetworkSpec) -> CatchUpSizer | None:
        cfg = spec.control.catch_up
        return None if cfg is None else CatchUpSizer(cfg, float(spec.latency_bound) if spec.latency_bound else None)

    @property
    def lanes_cap(self) -> int:
        """The most lanes a step may get."""
        scale = self.spec.control.scale
        return scale.max_lanes if scale is not None and scale.max_lanes else self.manager.max_lanes

    def reconfigure(self, spec: NetworkSpec) -> None:
        """Go on under changed policy settings (control lines), keeping every state."""
        self.spec = spec
        self.manager.reconfigure(spec)
        if self.overload is not None and spec.control.overload is not None:
            self.overload.spec, self.overload.cfg = spec, spec.control.overload
        sizer = self._sizer(spec)
        if sizer is not None and self.catch_up is not None:
            sizer.history = self.catch_up.history
        self.catch_up = sizer

    def snapshot(self, statistics: bool = True) -> ControllerState:
        """The whole state, as data (copies: it does not change as the controller goes on).

        Planning changes only the policies' hysteresis and decisions, never the statistics (the
        load history, the overload model): those change when an epoch is observed. A plan's
        snapshot therefore leaves them out (``statistics=False``); restoring it on top of the
        last commit's state gives the state as the plan was made, at a fraction of the size."""
        return ControllerState(
            manager=self.manager.state(statistics),
            overload=self.overload.state() if self.overload is not None and statistics else None,
            catch_up=self.catch_up.state() if self.catch_up is not None and statistics else None,
        )

    def restore(self, state: ControllerState) -> None:
        """Continue from ``state``, as the controller that took it would have."""
        self.manager.restore(state.manager)
        if self.overload is not None and state.overload is not None:
            self.overload.restore(state.overload)
        if self.catch_up is not None and state.catch_up is not None:
            self.catch_up.restore(state.catch_up)
