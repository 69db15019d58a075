"""The network: sources → steps → sinks, with its key groups, lanes, trigger and control.

Graph questions (the order steps run in, what reaches a node, which stateful steps feed a step)
are answered here, once, for every layer above.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from eddyline.api.control import Control
from eddyline.api.sinks import SinkSpec
from eddyline.api.sources import SourceSpec
from eddyline.api.steps import StepSpec
from eddyline.api.units import ByteSize, Duration, Files, Model, Name


class NetworkSpec(Model):
    name: Name
    sources: tuple[SourceSpec, ...] = Field(min_length=1)
    steps: tuple[StepSpec, ...] = ()
    sinks: tuple[SinkSpec, ...] = Field(min_length=1)
    #: Key groups per stateful step: fixed when the checkpoint is first created.
    key_groups: int = Field(default=128, gt=0, le=32768)
    #: Parallel lanes per stateful step; default: Spark's default parallelism.
    lanes: int | None = Field(default=None, gt=0)
    #: How Spark runs the epochs: a Spark job an epoch (``job``), or the stateful step's lanes
    #: as the tasks of one long-lived stage fed epoch after epoch (``resident``; for the
    #: networks eddyline.runtime.residentmode takes); ``auto``: resident when it takes the
    #: network, else jobs, the reason noted. A checkpoint may change mode between runs.
    execution: Literal["job", "resident", "auto"] = "job"
    #: Target epoch interval: an epoch starts at most this often (immediately when behind).
    trigger: Duration = 1000
    #: Where malformed records go; default ``<checkpoint>/dead-letters``.
    dead_letters: Files | None = None
    #: The control plane: placement, balancing, rescaling, hot-key splits, state budget.
    control: Control = Control()
    #: Delay-Process-Correct: how long epochs wait for a source whose server cannot be reached
    #: before they go on without it, their outputs marked tentative and corrected once it is
    #: back. None: wait for it (up to the source's own ``wait``, then fail).
    max_delay: Duration | None = Field(default=None, gt=0)
    #: Epochs whose commits, plans and state versions the checkpoint keeps: how far back
    #: ``eddyline replay`` can go (time travel).
    history: int = Field(default=10, ge=2)
    #: Besides those, every epoch committed within this long of the newest commit (None: none).
    history_duration: Duration | None = Field(default=None, gt=0)
    #: A cap on both: the state files that only older epochs read take at most this many bytes
    #: (the oldest epochs go first; the newest two always stay). None: no cap.
    history_bytes: ByteSize | None = Field(default=None, ge=0)

    def node(self, name: str) -> SourceSpec | StepSpec | SinkSpec:
        for n in (*self.sources, *self.steps, *self.sinks):
            if n.name == name:
                return n
        raise KeyError(name)

    def step(self, name: str) -> StepSpec:
        n = self.node(name)
        if not isinstance(n, StepSpec):
            raise KeyError(name)
        return n

    def upstream(self, name: str) -> set[str]:
        """``name`` and every node whose rows reach it."""
        reach, frontier = set(), [name]
        while frontier:
            n = frontier.pop()
            if n not in reach:
                reach.add(n)
                frontier.extend(self.node(n).inputs)
        return reach

    @property
    def latency_bound(self) -> int | None:
        """The tightest declared latency of any query output (ms), if any."""
        bounds = [s.qos.latency for s in self.sinks if s.qos is not None]
        return min(bounds) if bounds else None

    def as_dict(self) -> dict[str, Any]:
        """The network as its spec dict, without defaults (what a checkpoint stores and hashes;
        the same network always gives the same dict)."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must agree on with the network that resumes it."""
        return {
            "name": self.name,
            "key_groups": self.key_groups,
            "stateful_steps": sorted(s.name for s in self.steps if s.stateful),
        }

    # ------------------------------------------------------------------ graph
    def ordered(self) -> tuple[list[StepSpec], list[StepSpec]]:
        """Steps in an order where every input comes first, and the steps left over because
        their inputs form a cycle or name nothing (empty for a validated network)."""
        done = {s.name for s in self.sources}
        order: list[StepSpec] = []
        pending = list(self.steps)
        while True:
            ready = [s for s in pending if all(i in done for i in s.inputs)]
            if not ready:
                return order, pending
            for s in ready:
                order.append(s)
                done.add(s.name)
                pending.remove(s)

    def topological(self) -> list[StepSpec]:
        """Steps in an order where every input comes first (the network is validated acyclic)."""
        order, left = self.ordered()
        if left:
            names = ", ".join(f"'{s.name}'" for s in left)
            raise ValueError(f"steps {names}: inputs form a cycle or name nothing")
        return order

    def stateful_steps(self) -> list[StepSpec]:
        """Stateful steps, inputs before their readers."""
        return [s for s in self.topological() if s.stateful]

    def stateful_upstream(self, step: StepSpec) -> tuple[list[str], bool]:
        """The nearest stateful steps feeding ``step`` (through stateless ones), and whether some
        input path reaches a source without passing a stateful step."""
        ancestors: list[str] = []
        from_sources = False
        frontier = list(step.inputs)
        seen: set[str] = set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            node = self.node(name)
            if not node.inputs:
                from_sources = True
            elif isinstance(node, StepSpec) and node.stateful:
                ancestors.append(name)
            else:
                frontier.extend(node.inputs)
        return sorted(ancestors), from_sources

    def columns_read(self) -> dict[str, frozenset[str] | None]:
        """Per source and step, the columns (lower case) of its output that its readers read, None
        when all may be: a sink writes every column it gets, a kind that does not say
        (:meth:`StepKind.reads`) reads all, and so does everything behind a shed point (shed rows
        may be written out). Walked from the sinks back, each node wanting what its readers want
        of it. A source hands on only these (:meth:`Source.frames`); a join stores and emits only
        these of its inputs' columns, besides its keys and times."""
        wanted: dict[str, frozenset[str] | None] = {}

        def want(name: str, columns: frozenset[str] | None) -> None:
            if name not in wanted:
                wanted[name] = columns
            else:
                have = wanted[name]
                wanted[name] = None if have is None or columns is None else have | columns

        for sink in self.sinks:
            want(sink.input, None)
        everything = self.control.overload is not None
        for step in reversed(self.topological()):
            if step.name not in wanted:  # read by nothing: compiled all the same
                wanted[step.name] = frozenset()
            reads = (None,) * len(step.inputs) if everything else step.info.reads(step, wanted[step.name])
            for name, columns in zip(step.inputs, reads, strict=True):
                want(name, columns)
        return {**wanted, **{s.name: wanted.get(s.name, frozenset()) for s in self.sources}}

