"""A source: a replayable input with offsets. Its kinds (``generator``, ``nexmark``, ``files``,
...) are registered in :data:`eddyline.api.registry.SOURCES` by :mod:`eddyline.io`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from eddyline.api.registry import SOURCES, KindNode, Registry, SourceKind


class SourceSpec(KindNode):
    registry: ClassVar[Registry[Any]] = SOURCES
    #: Admission control: at most this many offsets per epoch (files sources: files).
    max_rows_per_epoch: int | None = Field(default=None, gt=0)
    #: A bounded source: only offsets [0, limit) exist (a fixed data set for tests and benchmarks).
    limit: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _kind_rules(self) -> SourceSpec:
        problems = self.info.check(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def info(self) -> SourceKind:
        return SOURCES.get(self.kind)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ()
