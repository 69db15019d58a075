"""The Python spelling of a network. It builds the same frozen :class:`NetworkSpec` as YAML.

>>> import eddyline
>>> net = eddyline.Network("hot-auctions")
>>> bids = net.source("bids", eddyline.Nexmark(stream="bid", rate=50_000))
>>> (bids.filter("price > 100")
...      .window_aggregate(key="auction", time="date_time", window=eddyline.sliding("10s", "2s"),
...                        aggregates={"bids": "count(*)", "top": "max(price)"}, watermark_delay="4s")
...      .to(eddyline.Files("out/hot", format="parquet")))
>>> [s.name for s in net.spec.steps]
['filter_2', 'window_aggregate_3']

Names are checked as they are added: a second node called ``bids`` is refused at once. Any
registered step kind can be added with :meth:`Stream.step`; the common ones have their own
methods. Running lives one layer up: ``eddyline.Network`` adds ``run`` to this class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from eddyline.api.network import NetworkSpec
from eddyline.api.sinks import SINKS
from eddyline.api.sources import SOURCES
from eddyline.api.steps import StepSpec
from eddyline.api.units import Files, Window
from eddyline.api.validate import format_errors, spec_from_raw
from eddyline.errors import SpecError


def sliding(size: str | int, slide: str | int) -> Window:
    """A sliding event-time window, e.g. ``sliding("10s", "2s")``."""
    return Window.model_validate({"size": size, "slide": slide})


def tumbling(size: str | int) -> Window:
    """A tumbling event-time window, e.g. ``tumbling("1m")``."""
    return Window.model_validate({"size": size})


@dataclass(frozen=True)
class Stream:
    """A named output inside a :class:`Network`; each method adds a step and returns its stream."""

    network: Network
    name: str

    def step(self, kind: str, params: Any, *, name: str | None = None) -> Stream:
        """Add a step of any registered kind reading this stream, e.g.
        ``s.step("dedup", {"key": "id", "time": "ts", "ttl": "1h"})``."""
        return self.network._add_step(name, kind, {"input": self.name, kind: params})

    def filter(self, condition: str, *, name: str | None = None) -> Stream:
        return self.step("filter", condition, name=name)

    def select(self, *expressions: str, name: str | None = None) -> Stream:
        return self.step("select", list(expressions), name=name)

    def union(self, *others: Stream, name: str | None = None) -> Stream:
        return self.network._add_step(name, "union", {"union": [self.name, *(o.name for o in others)]})

    def window_aggregate(
        self,
        *,
        time: str,
        window: Window,
        aggregates: dict[str, str],
        key: str | list[str] | None = None,
        watermark_delay: str | int = 0,
        allowed_lateness: str | int = 0,
        late: Files | None = None,
        name: str | None = None,
    ) -> Stream:
        params: dict[str, Any] = {
            "key": key,
            "time": time,
            "window": window,
            "aggregates": aggregates,
            "watermark_delay": watermark_delay,
            "allowed_lateness": allowed_lateness,
            "late": late,
        }
        return self.step("window_aggregate", params, name=name)

    def to(self, sink: BaseModel, *, name: str | None = None) -> None:
        """Send this stream to a sink, e.g. ``.to(eddyline.Files("out/dir"))``."""
        self.network._add_sink(name, self.name, sink)


class Network:
    """A query network under construction; ``.spec`` is the validated, frozen result."""

    def __init__(
        self,
        name: str,
        *,
        key_groups: int = 128,
        lanes: int | None = None,
        trigger: str | int = "1s",
        dead_letters: Files | None = None,
    ):
        self._top: dict[str, Any] = {
            "name": name,
            "key_groups": key_groups,
            "lanes": lanes,
            "trigger": trigger,
            "dead_letters": dead_letters,
        }
        self._sources: list[dict[str, Any]] = []
        self._steps: list[dict[str, Any]] = []
        self._sinks: list[dict[str, Any]] = []
        self._names: set[str] = set()
        self._counter = 0

    # ----------------------------------------------------------------- building
    def _claim(self, name: str | None, kind: str, what: str) -> str:
        self._counter += 1
        name = name or f"{kind}_{self._counter}"
        if name in self._names:
            raise SpecError(f"{what} '{name}': name: already used in network '{self._top['name']}'")
        self._names.add(name)
        return name

    def source(self, name: str, kind: BaseModel, *, max_rows_per_epoch: int | None = None) -> Stream:
        """Add a source, e.g. ``net.source("bids", eddyline.Nexmark(stream="bid"))``."""
        found = SOURCES.for_params(kind)
        if found is None:
            expected = ", ".join(k.params.__name__ for k in SOURCES.find(lambda k: isinstance(k.params, type)))
            raise SpecError(f"source '{name}': expected one of {expected}, got {type(kind).__name__}")
        self._claim(name, found.key, "source")
        self._sources.append({"name": name, found.key: kind, "max_rows_per_epoch": max_rows_per_epoch})
        return Stream(self, name)

    def _add_step(self, name: str | None, kind: str, body: dict[str, Any]) -> Stream:
        name = self._claim(name, kind, "step")
        raw = {"name": name, **body}
        try:
            StepSpec.model_validate(raw)
        except ValidationError as e:
            raise SpecError(format_errors(e, {"steps": [raw]})) from None
        self._steps.append(raw)
        return Stream(self, name)

    def _add_sink(self, name: str | None, input_name: str, sink: BaseModel) -> None:
        found = SINKS.for_params(sink)
        if found is None:
            expected = ", ".join(k.params.__name__ for k in SINKS.find(lambda k: isinstance(k.params, type)))
            raise SpecError(f"sink on '{input_name}': expected one of {expected}, got {type(sink).__name__}")
        name = self._claim(name, found.key, "sink")
        self._sinks.append({"name": name, "input": input_name, found.key: sink})

    @property
    def spec(self) -> NetworkSpec:
        raw = {
            **{k: v for k, v in self._top.items() if v is not None},
            "sources": self._sources,
            "steps": self._steps,
            "sinks": self._sinks,
        }
        return spec_from_raw(raw)
