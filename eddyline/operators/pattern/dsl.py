"""The pattern language: what a sequence pattern is, before any kernel matches it.

A :class:`Pattern` is a list of :class:`Element` s, each a named predicate with a quantifier:
``one`` (exactly one row) or ``plus`` (Kleene ``+``: one or more rows). The tick pattern of
AnduIN (Sattler & Beier, "Towards Elastic Stream Processing: Patterns and Infrastructure") is
``A B+ C D+``: A any row; each B lower than the row before it; C higher than the last B but lower
than A; each D higher than the row before it and higher than A (:func:`tick_pattern`).

* **Contiguity.** ``strict`` (default): the key's very next row must extend a run, or the run dies.
  ``skip_till_next_match``: a row that satisfies none of a run's transitions is skipped and the run
  waits; a row that satisfies one is taken (the run does not also skip it).
* **Predicates** are picklable callables ``(cur, prev, bound) -> bool`` over Python dicts: ``cur``
  the candidate row, ``prev`` the row the run bound last (``None`` when starting; under strict
  contiguity this is the key's previous row), ``bound`` the first row bound to each element bound so
  far under its name and the last under ``"<name>.last"``. Plain callables keep arbitrary
  correlations (B against the previous B, C against A) correct; they are evaluated per row and run.
  The ready-made ones (:class:`Always`, :class:`Falling`, :class:`RisingBelow`,
  :class:`RisingAbove`) are small dataclasses naming columns and anchors, so they could later be
  compiled into vectorised pre-filters; today they are called like any other.
* **Measures** per match: ``name -> (element, column or None, first | last | count | min | max)``;
  ``count`` with ``None`` counts the element's rows, with a column its non-null values; min/max
  skip nulls.
* **Split**: which half of AnduIN's two-stage pipeline a kernel runs
  (see :mod:`eddyline.operators.pattern.split`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Row = dict[str, Any]
Bound = Mapping[str, Row]
Quantifier = Literal["one", "plus"]
Contiguity = Literal["strict", "skip_till_next_match"]
#: (element name, column or None, aggregate)
Measure = tuple[str, str | None, str]

ONE: Quantifier = "one"
PLUS: Quantifier = "plus"
STRICT: Contiguity = "strict"
SKIP_TILL_NEXT_MATCH: Contiguity = "skip_till_next_match"
MEASURE_FUNCS = ("first", "last", "count", "min", "max")


# --------------------------------------------------------------------------------- predicates
class Predicate(Protocol):
    """``(cur, prev, bound) -> bool``; see the module docstring. Must be picklable and must not
    mutate its arguments (runs share the dicts)."""

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool: ...


@dataclass(frozen=True)
class Always:
    """Every row (the tick pattern's A)."""

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool:
        return True


@dataclass(frozen=True)
class Falling:
    """``cur[col] < prev[col]``: lower than the row bound before it (B+). False on nulls."""

    col: str

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool:
        v, p = cur[self.col], None if prev is None else prev[self.col]
        return v is not None and p is not None and v < p


@dataclass(frozen=True)
class _Anchored:
    """A comparison of ``col`` in the row, the row before it and the row bound to ``anchor``;
    False when any of the three is null (or there is no row before)."""

    col: str
    anchor: str

    def __call__(self, cur: Row, prev: Row | None, bound: Bound) -> bool:
        v, p, a = (
            cur[self.col],
            None if prev is None else prev[self.col],
            bound[self.anchor][self.col],
        )
        return v is not None and p is not None and a is not None and self.holds(v, p, a)

    def holds(self, v: Any, p: Any, a: Any) -> bool:
        """The comparison of the current value ``v``, the previous ``p`` and the anchor's ``a``."""
        raise NotImplementedError


@dataclass(frozen=True)
class RisingBelow(_Anchored):
    """``prev[col] < cur[col] < bound[anchor][col]`` (C: up from the last B, still under A)."""

    def holds(self, v: Any, p: Any, a: Any) -> bool:
        return p < v < a


@dataclass(frozen=True)
class RisingAbove(_Anchored):
    """``cur[col] > prev[col]`` and ``cur[col] > bound[anchor][col]`` (D+: rising, above A)."""

    def holds(self, v: Any, p: Any, a: Any) -> bool:
        return v > p and v > a


# ------------------------------------------------------------------------------------ pattern
@dataclass(frozen=True)
class Element:
    name: str
    predicate: Predicate
    quantifier: Quantifier = ONE

    def __post_init__(self) -> None:
        if not self.name or "." in self.name:
            raise ValueError(f"element name {self.name!r} must be non-empty and without '.'")
        if self.quantifier not in (ONE, PLUS):
            raise ValueError(
                f"element {self.name}: quantifier must be 'one' or 'plus', got {self.quantifier!r}"
            )


@dataclass(frozen=True)
class Pattern:
    elements: tuple[Element, ...]
    contiguity: Contiguity = STRICT

    def __post_init__(self) -> None:
        object.__setattr__(self, "elements", tuple(self.elements))
        names = [e.name for e in self.elements]
        if not names:
            raise ValueError("a pattern needs at least one element")
        if len(set(names)) != len(names):
            raise ValueError(f"element names must be unique, got {names}")
        if self.contiguity not in (STRICT, SKIP_TILL_NEXT_MATCH):
            raise ValueError(
                f"contiguity must be 'strict' or 'skip_till_next_match', got {self.contiguity!r}"
            )


def tick_pattern(value_col: str, contiguity: Contiguity = STRICT) -> Pattern:
    """AnduIN's tick-shaped pattern ``A B+ C D+`` over ``value_col`` (see the module docstring)."""
    return Pattern(
        (
            Element("A", Always()),
            Element("B", Falling(value_col), PLUS),
            Element("C", RisingBelow(value_col, "A")),
            Element("D", RisingAbove(value_col, "A"), PLUS),
        ),
        contiguity,
    )


@dataclass(frozen=True)
class Split:
    """The half of a two-stage pipeline a kernel runs (see
    :func:`~eddyline.operators.pattern.split.pipeline_split`): stage 1 emits runs that just bound
    element ``at`` for the first time, stage 2 continues them."""

    stage: Literal[1, 2]
    at: int
