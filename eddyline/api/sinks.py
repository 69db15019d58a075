"""A sink: where a query's output goes, idempotent per epoch. Its kinds (``files``,
``console``, ``memory``, ...) are registered in :data:`SINKS` by
:mod:`eddyline.io`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from eddyline.api.registry import Kind, KindNode, Registry
from eddyline.api.units import Duration, Model, Name


class Qos(Model):
    """A query output's service level: its epochs should take at most ``latency``; when load
    must be shed, one of its rows is worth ``utility``."""

    latency: Duration = Field(gt=0)
    utility: float = Field(default=1.0, ge=0)


class SinkKind(Kind):
    #: parameters a running network may change between two epochs (control lines): where the
    #: sink writes; the sink is opened anew on the new target at that boundary
    live_params: ClassVar[tuple[str, ...]] = ()

    def check(self, sink: SinkSpec) -> list[str]:
        return []

    def describe(self, params: Any) -> str:
        return self.key


SINKS: Registry[SinkKind] = Registry("sink")


class SinkSpec(KindNode):
    registry: ClassVar[Registry[Any]] = SINKS
    input: Name
    qos: Qos | None = None

    @model_validator(mode="after")
    def _kind_rules(self) -> SinkSpec:
        problems = self.info.check(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def info(self) -> SinkKind:
        return SINKS.get(self.kind)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)
