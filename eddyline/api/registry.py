"""Kinds of sources, steps and sinks: the machinery the three sorts share.

A node of a network has exactly one *kind key* saying what it is (``dedup: {...}``,
``files: {...}``). This module holds a :class:`Registry` of kinds by YAML key and
:class:`KindNode`, which parses a node by its kind key. What each sort of kind answers lives
beside that sort's spec: :class:`~eddyline.api.steps.StepKind` (inputs, key and event-time
columns, state, output columns ...) and ``STEPS`` in :mod:`eddyline.api.steps`, likewise
:mod:`eddyline.api.sources` and :mod:`eddyline.api.sinks`. The kinds themselves live where their
code does: step kinds in :mod:`eddyline.kinds` (each module holds its parameters, its Spark compile
function and its kernel factory), source and sink kinds in :mod:`eddyline.io`. Importing the
``eddyline`` package registers the built-in ones; the spec layer never imports them, so it stays
below everything that runs.

Adding a kind is one module that subclasses ``StepKind`` (or ``SourceKind``, ``SinkKind``) and
decorates it with ``@STEPS.register`` (``SOURCES``, ``SINKS``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from functools import cached_property
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import (
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)

from eddyline.api.units import Model, Name


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
