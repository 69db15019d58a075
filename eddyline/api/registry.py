"""Kinds of sources, steps and sinks, registered by the layers that implement them.

A node of a network has exactly one *kind key* saying what it is (``dedup: {...}``,
``files: {...}``). This module keeps, per kind, what the spec layer needs to know: the YAML key,
the parameters' type, and the facts every other layer asks about a step (its inputs, key and
event-time columns, whether it keeps state, ...). The kinds themselves live where their code
does: step kinds in :mod:`eddyline.kinds` (each module holds its parameters, its Spark compile
function and its kernel factory), source and sink kinds in :mod:`eddyline.io`. Importing the
``eddyline`` package registers the built-in ones; the spec layer never imports them, so it stays
below everything that runs.

Adding a kind is one module that subclasses :class:`StepKind` (or :class:`SourceKind`,
:class:`SinkKind`) and decorates it with ``@STEPS.register`` (``SOURCES``, ``SINKS``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import (
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)

from eddyline.api.units import Model, Name

if TYPE_CHECKING:
    from eddyline.api.sinks import SinkSpec
    from eddyline.api.sources import SourceSpec
    from eddyline.api.steps import StepSpec
    from eddyline.api.units import Files


class Kind:
    """What every kind says about itself."""

    #: the YAML key naming the kind, e.g. ``window_aggregate``
    key: ClassVar[str]
    #: the type of its parameters: a spec model, or a plain type (``filter`` takes a string)
    params: ClassVar[Any]
    #: named in error messages as one a user may write (not one a rewrite rule writes for them)
    offered: ClassVar[bool] = True

    @cached_property
    def adapter(self) -> TypeAdapter[Any]:
        return TypeAdapter(self.params)

    def summary(self, params: Any) -> str:
        """Its parameters in one line, for ``explain`` and messages."""
        dump = getattr(params, "model_dump", None)
        return str(dump(exclude_defaults=True, by_alias=True) if dump else params)


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


class SinkKind(Kind):
    #: parameters a running network may change between two epochs (control lines): where the
    #: sink writes; the sink is opened anew on the new target at that boundary
    live_params: ClassVar[tuple[str, ...]] = ()

    def check(self, sink: SinkSpec) -> list[str]:
        return []

    def describe(self, params: Any) -> str:
        return self.key


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


K = TypeVar("K", bound=Kind)


class Registry(Generic[K]):
    """The kinds of one sort (``source``, ``step`` or ``sink``), by YAML key."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._kinds: dict[str, K] = {}

    def register(self, cls: type[K]) -> type[K]:
        """Class decorator: register one instance of ``cls`` under ``cls.key``."""
        if cls.key in self._kinds:
            raise ValueError(f"{self.what} kind {cls.key!r} is registered twice")
        self._kinds[cls.key] = cls()
        return cls

    def get(self, key: str) -> K:
        try:
            return self._kinds[key]
        except KeyError:
            raise KeyError(f"unknown {self.what} kind {key!r}; expected one of {', '.join(self.keys())}") from None

    def keys(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def __contains__(self, key: object) -> bool:
        return key in self._kinds

    def for_params(self, params: object) -> K | None:
        """The kind whose parameters model ``params`` is an instance of (the Python builder)."""
        return next((k for k in self._kinds.values() if isinstance(k.params, type) and isinstance(params, k.params)), None)

    def find(self, test: Callable[[K], bool]) -> list[K]:
        return [k for k in self._kinds.values() if test(k)]


SOURCES: Registry[SourceKind] = Registry("source")
STEPS: Registry[StepKind] = Registry("step")
SINKS: Registry[SinkKind] = Registry("sink")


def _kind_node_parse(registry: Registry[Any], data: Any, fields: frozenset[str] = frozenset()) -> Any:
    """``{"name": ..., "dedup": {...}}`` → ``{"name": ..., "kind": "dedup", "params": Dedup(...)}``,
    with errors located under the kind key (``dedup.ttl``), as the user wrote it. ``fields``:
    the node's other fields (``name``, ``input`` ...), which are not kinds."""
    if not isinstance(data, dict) or ("kind" in data and "params" in data):
        return data
    present = [k for k in data if k in registry]
    if len(present) != 1:
        offered = [kind.key for kind in registry.find(lambda kind: kind.offered)]
        if present:
            raise ValueError(f"a {registry.what} has exactly one kind; this one has {' and '.join(present)}")
        unknown = [str(k) for k in data if str(k) not in fields]
        guesses = [(k, difflib.get_close_matches(k, offered, n=1, cutoff=0.6)) for k in unknown]
        named = [f"unknown field '{k}' — did you mean '{g[0]}'?" for k, g in guesses if g]
        if named:
            raise ValueError("; ".join(named))
        what = f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(repr(k) for k in unknown)}; " if unknown else ""
        raise ValueError(f"{what}expected one {registry.what} kind: {', '.join(offered)}")
    key = present[0]
    kind = registry.get(key)
    try:
        params = kind.adapter.validate_python(data[key])
    except ValidationError as e:
        raise ValidationError.from_exception_data(
            e.title,
            [
                {"type": x["type"], "loc": (key, *x["loc"]), "input": x["input"], **({"ctx": x["ctx"]} if "ctx" in x else {})}  # type: ignore[typeddict-item]
                for x in e.errors()
            ],
        ) from None
    return {**{k: v for k, v in data.items() if k != key}, "kind": key, "params": params}


class KindNode(Model):
    """A source, step or sink: a ``name``, exactly one kind key with its parameters, and the
    fields common to its sort. Parsed, the kind key becomes ``kind`` and its value ``params``;
    dumped, it is the kind key again."""

    registry: ClassVar[Registry[Any]]
    name: Name
    kind: str
    params: Any

    @model_validator(mode="before")
    @classmethod
    def _kind_key(cls, data: Any) -> Any:
        fields = frozenset(name for n, f in cls.model_fields.items() for name in (n, f.alias) if name)
        return _kind_node_parse(cls.registry, data, fields)

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        kind = out.pop("kind")
        out.pop("params")
        out[kind] = self.info.adapter.dump_python(self.params, mode="json", by_alias=True, exclude_defaults=True)
        return out

    @property
    def info(self) -> Any:
        """The registered kind (what the kind says about itself)."""
        return self.registry.get(self.kind)
