"""A step: one operator of the network. Its kinds (``filter``, ``window_aggregate``, ``join``,
...) are registered in :data:`eddyline.api.registry.STEPS` by :mod:`eddyline.kinds`; what a
step is asked about (inputs, keys, event time, state) its kind answers."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import model_validator

from eddyline.api.registry import STEPS, KindNode, Registry, StepKind
from eddyline.api.units import Name


class StepSpec(KindNode):
    registry: ClassVar[Registry[Any]] = STEPS
    input: Name | None = None

    @model_validator(mode="after")
    def _inputs(self) -> StepSpec:
        if self.info.names_inputs:
            if self.input is not None:
                raise ValueError(f"input: a {self.kind} names its inputs in '{self.kind}', not 'input'")
        elif self.input is None:
            raise ValueError("input: field required")
        return self

    @property
    def info(self) -> StepKind:
        return STEPS.get(self.kind)

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.info.inputs(self)

    def input_fields(self) -> list[tuple[str, str]]:
        """(field path, input name) pairs, for messages about inputs."""
        return self.info.input_fields(self)

    @property
    def stateful(self) -> bool:
        return self.info.stateful

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The key columns of a single-input keyed step; () for steps without one."""
        return self.info.key_columns(self.params)

    def time_columns(self) -> tuple[str | None, ...]:
        """Per input, the event-time column the step's watermark follows (None: no event time)."""
        return self.info.time_columns(self)

    @property
    def watermark_delay(self) -> int:
        return self.info.watermark_delay(self.params)
