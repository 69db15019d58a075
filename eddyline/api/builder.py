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

Names are checked as they are added: a second node called ``bids`` is refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import ValidationError

from eddyline.api.spec import (
    Console,
    Files,
    Generator,
    Memory,
    NetworkSpec,
    Nexmark,
    StepSpec,
    Window,
)
from eddyline.api.validate import format_errors, spec_from_raw
from eddyline.errors import SpecError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eddyline.io.sinks import Sink
    from eddyline.runtime.engine import RunSummary


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

    def filter(self, condition: str, *, name: str | None = None) -> Stream:
        return self.network._add_step(name, "filter", {"input": self.name, "filter": condition})

    def select(self, *expressions: str, name: str | None = None) -> Stream:
        return self.network._add_step(name, "select", {"input": self.name, "select": list(expressions)})

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
        return self.network._add_step(name, "window_aggregate", {"input": self.name, "window_aggregate": params})

    def to(self, sink: Files | Console | Memory, *, name: str | None = None) -> None:
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
        self._last_sinks: dict[str, Sink] = {}

    # ----------------------------------------------------------------- building
    def _claim(self, name: str | None, kind: str, what: str) -> str:
        self._counter += 1
        name = name or f"{kind}_{self._counter}"
        if name in self._names:
            raise SpecError(f"{what} '{name}': name: already used in network '{self._top['name']}'")
        self._names.add(name)
        return name

    def source(
        self, name: str, kind: Generator | Nexmark | Files, *, max_rows_per_epoch: int | None = None
    ) -> Stream:
        key = {Generator: "generator", Nexmark: "nexmark", Files: "files"}.get(type(kind))
        if key is None:
            raise SpecError(f"source '{name}': expected Generator, Nexmark or Files, got {type(kind).__name__}")
        self._claim(name, key, "source")
        self._sources.append({"name": name, key: kind, "max_rows_per_epoch": max_rows_per_epoch})
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

    def _add_sink(self, name: str | None, input_name: str, sink: Files | Console | Memory) -> None:
        key = {Files: "files", Console: "console", Memory: "memory"}.get(type(sink))
        if key is None:
            raise SpecError(f"sink on '{input_name}': expected Files, Console or Memory, got {type(sink).__name__}")
        name = self._claim(name, key, "sink")
        self._sinks.append({"name": name, "input": input_name, key: sink})

    @property
    def spec(self) -> NetworkSpec:
        raw = {
            **{k: v for k, v in self._top.items() if v is not None},
            "sources": self._sources,
            "steps": self._steps,
            "sinks": self._sinks,
        }
        return spec_from_raw(raw)

    # ----------------------------------------------------------------- running
    def run(
        self,
        checkpoint: str,
        *,
        epochs: int | None = None,
        duration: float | None = None,
        until_idle: bool = False,
        lanes: int | None = None,
        progress: bool = False,
        progress_json: str | None = None,
        spark: SparkSession | None = None,
    ) -> RunSummary:
        """Run in this process's SparkSession (``local[*]`` unless one is active)."""
        from eddyline.api.validate import validate
        from eddyline.io.sinks import make_sink
        from eddyline.observe.progress import ProgressReporter
        from eddyline.runtime.engine import Engine
        from eddyline.runtime.session import get_spark

        spec = self.spec
        session = spark or get_spark()
        validate(spec, session)
        self._last_sinks = {s.name: make_sink(s) for s in spec.sinks}
        with ProgressReporter(live=progress, json_path=progress_json) as reporter:
            engine = Engine(spec, session, checkpoint, lanes=lanes, reporter=reporter, sinks=self._last_sinks)
            return engine.run(epochs=epochs, duration_s=duration, until_idle=until_idle)

    def collected(self, sink: str) -> pa.Table | None:
        """Rows a ``Memory`` sink received in the last :meth:`run` (epoch order)."""
        from eddyline.io.sinks import MemorySink

        s = self._last_sinks.get(sink)
        if not isinstance(s, MemorySink):
            raise KeyError(f"no memory sink named {sink!r} ran in this network")
        return s.table()
