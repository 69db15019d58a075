"""A source: a replayable input with offsets. Its kinds (``generator``, ``nexmark``, ``files``,
...) are registered in :data:`SOURCES` by :mod:`eddyline.io`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from eddyline.api.registry import Kind, KindNode, Registry


class SourceKind(Kind):
    #: what one offset counts (``explain``)
    offsets: ClassVar[str] = "row numbers"
    #: two sources with the same parameters read the same input at the same offset (not so
    #: where each keeps its own log of what it received)
    offsets_shared: ClassVar[bool] = True

    def check(self, source: SourceSpec) -> list[str]:
        """Problems pydantic cannot see in one source's parameters, as ``field: message``."""
        return []

    def columns(self, params: Any) -> tuple[str, ...] | None:
        """The names of its rows' columns when they are known without reading anything (the SQL
        front end checks a ``CREATE TABLE`` against them); None: not known."""
        return None


SOURCES: Registry[SourceKind] = Registry("source")


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
