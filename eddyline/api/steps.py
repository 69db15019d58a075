"""A step: one operator of the network. Its kinds (``filter``, ``window_aggregate``, ``join``,
...) are registered in :data:`STEPS` by :mod:`eddyline.kinds`; what a
step is asked about (inputs, keys, event time, state) its kind answers."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import model_validator

from eddyline.api.registry import Kind, KindNode, Registry
from eddyline.api.units import Files, Name


class StepKind(Kind):
    """The facts of a step kind that planning, control and validation ask about."""

    #: keeps state per key group and runs as a kernel per lane behind a shuffle
    stateful: ClassVar[bool] = False
    #: names its inputs in its parameters (``union``, ``join``) instead of ``input``
    names_inputs: ClassVar[bool] = False
    #: its lanes receive the input rows as they are, so counting the input's rows per key group
    #: before the epoch tells the lanes' work (the balancer's look-ahead); not so for a window
    #: (rows are pre-aggregated in the JVM) or a join (two inputs)
    rows_reach_lanes: ClassVar[bool] = False
    #: behind a shed point, its rows carry a weight column (``columns.WEIGHT``) so that it can
    #: scale its results and report their error (a window's counts and sums)
    weighs_shed_rows: ClassVar[bool] = False
    #: observes its own input's event times (otherwise the runtime does, sharing a source's
    #: observation where the step reads the source's rows as they are)
    observes_own_time: ClassVar[bool] = False
    #: stores only the columns of its inputs that are read after it (``NetworkSpec.columns_read``),
    #: so a change that reads more of its output needs its state to start again
    stores_read_columns: ClassVar[bool] = False
    #: parameters a running network may change between two epochs (control lines,
    #: :mod:`eddyline.api.live`); the kind's own key for a kind whose parameters are one value
    live_params: ClassVar[tuple[str, ...]] = ()

    def inputs(self, step: StepSpec) -> tuple[str, ...]:
        assert step.input is not None
        return (step.input,)

    def input_fields(self, step: StepSpec) -> list[tuple[str, str]]:
        """(field path, input name) per input, for messages about inputs."""
        return [("input", name) for name in self.inputs(step)]

    def check(self, step: StepSpec) -> list[str]:
        """Problems pydantic cannot see (e.g. SQL syntax), as ``field: message``; no Spark."""
        return []

    def key_columns(self, params: Any) -> tuple[str, ...]:
        """The key columns of a single-input keyed step; () for none (a global window)."""
        return ()

    def time_columns(self, step: StepSpec) -> tuple[str | None, ...]:
        """Per input, the event-time column the step's watermark follows (None: none)."""
        return (getattr(step.params, "time", None),) * len(self.inputs(step))

    def watermark_delay(self, params: Any) -> int:
        return int(getattr(params, "watermark_delay", 0) or 0)

    def watermark_follows(self, step: StepSpec) -> str | None:
        """A step whose watermark must equal another step's in the same epoch (a split
        pattern's second stage follows its first)."""
        return None

    def shed_inputs(self, step: StepSpec) -> tuple[int, ...]:
        """The inputs (by position) where overload control may shed rows."""
        return tuple(range(len(self.inputs(step))))

    def reads(self, step: StepSpec, wanted: frozenset[str] | None) -> tuple[frozenset[str] | None, ...]:
        """Per input, the columns the step reads (lower case; None: all) when its readers want
        ``wanted`` of its output (None: all). Only used to leave columns nobody reads out of
        what a decoding source hands to Spark, so a kind that does not say reads everything."""
        return (None,) * len(self.inputs(step))

    def output_columns(self, step: StepSpec, inputs: tuple[tuple[str, ...] | None, ...]) -> tuple[str, ...] | None:
        """The names of the step's output columns given its inputs' (in the order of
        :meth:`inputs`; None: not known), for the SQL front end, whose queries may read a step
        written in YAML by name; None: not known."""
        return None

    def revisions(self, params: Any) -> str | None:
        """Whether the step takes an input that carries revisions (a ``_diff`` weight column,
        see docs/revisions.md): None when it does (a stateless step carries each row's weight
        through; a kernel retracts what it emitted and emits only deltas), else why not."""
        if self.stateful:
            return "its kernel does not take rows back"
        return None

    def single_key_group(self, params: Any) -> bool:
        """Whether every row falls in key group 0 (a global window: parallelism 1), so the
        step is placed as a whole box instead of key group by key group."""
        return False

    def spreadable(self, params: Any) -> bool:
        """Whether a hot key group can be split over several lanes (SPREADFIRE: the kernel
        stores a new row in one fragment and probes the others with it)."""
        return False

    def passes_keys(self, params: Any, keys: tuple[str, ...]) -> bool:
        """Whether rows leave this (stateless) step with ``keys`` unchanged, so a count of keys
        upstream still tells where rows go downstream."""
        return False

    def pinned_table(self, params: Any) -> Files | None:
        """A table the step reads whole (a lookup), whose version each epoch's plan pins so a
        replay reads the same one."""
        return None

    def late_target(self, params: Any) -> Files | None:
        """Where rows too late for the step are written, if it keeps them."""
        return None

    def describe(self, step: StepSpec, key_groups: int) -> list[str]:
        """What the step becomes in one epoch, for ``explain``: a headline, then details."""
        lines = [f"{self.key}  {self.summary(step.params)}"]
        if self.stateful:
            lines += [
                f"  1. JVM: rows keyed by key group; _kg = pmod(xxhash64(keys), {key_groups})",
                "  2. shuffle: repartition(lanes, routing value of _kg), one heartbeat row per lane",
                f"  3. Python per lane (mapInArrow): the {self.key} kernel against its key groups' state",
            ]
        return lines


STEPS: Registry[StepKind] = Registry("step")


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
