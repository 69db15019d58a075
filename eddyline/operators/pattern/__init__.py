"""Sequence patterns (complex event processing) over a keyed event-time stream, as a pure kernel.

The package, one module per role:

* :mod:`~eddyline.operators.pattern.dsl`: the pattern language (:class:`Pattern`,
  :class:`Element`, predicates, quantifiers, contiguity, measures, :func:`tick_pattern`);
* :mod:`~eddyline.operators.pattern.nfa`: the automaton that matches one key's ordered rows
  (every start, every extension; ``within_ms``; measure folding);
* :mod:`~eddyline.operators.pattern.layout`: the state, seed and output tables and the
  conversions between their rows and the automaton's runs;
* :mod:`~eddyline.operators.pattern.kernel`: :class:`PatternKernel`, one epoch per lane
  (buffering behind the watermark, lateness, eviction);
* :mod:`~eddyline.operators.pattern.split`: AnduIN's pipeline split ``P+ = P v (P P+)``
  (:func:`pipeline_split`, :func:`stage2_batch`).

Every name is re-exported here, so ``eddyline.operators.pattern:tick_pattern`` and
``from eddyline.operators.pattern import PatternKernel, Split, SEED`` keep working.
"""

from eddyline.operators.pattern.dsl import (
    MEASURE_FUNCS,
    ONE,
    PLUS,
    SKIP_TILL_NEXT_MATCH,
    STRICT,
    Always,
    Bound,
    Contiguity,
    Element,
    Falling,
    Measure,
    Pattern,
    Predicate,
    Quantifier,
    RisingAbove,
    RisingBelow,
    Row,
    Split,
    tick_pattern,
)
from eddyline.operators.pattern.kernel import PatternKernel
from eddyline.operators.pattern.layout import (
    BUFFERED,
    ELEM,
    END_MS,
    END_RANK,
    ID,
    KIND,
    LAST_MS,
    MATCH_END,
    MATCH_START,
    META,
    NEXT_ID,
    NOTHING_MATCHED,
    ROW,
    RUN,
    SEED,
    START_MS,
)
from eddyline.operators.pattern.split import pipeline_split, stage2_batch

__all__ = [
    "BUFFERED",
    "ELEM",
    "END_MS",
    "END_RANK",
    "ID",
    "KIND",
    "LAST_MS",
    "MATCH_END",
    "MATCH_START",
    "MEASURE_FUNCS",
    "META",
    "NEXT_ID",
    "NOTHING_MATCHED",
    "ONE",
    "PLUS",
    "ROW",
    "RUN",
    "SEED",
    "SKIP_TILL_NEXT_MATCH",
    "START_MS",
    "STRICT",
    "Always",
    "Bound",
    "Contiguity",
    "Element",
    "Falling",
    "Measure",
    "Pattern",
    "PatternKernel",
    "Predicate",
    "Quantifier",
    "RisingAbove",
    "RisingBelow",
    "Row",
    "Split",
    "pipeline_split",
    "stage2_batch",
    "tick_pattern",
]
