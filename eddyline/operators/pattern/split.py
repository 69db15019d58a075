"""Parallelising a pattern, after AnduIN's Fig. 8.

* **Partitioned by key**: matching never looks across keys, so key groups may go to any lane (a
  plain :class:`~eddyline.operators.pattern.kernel.PatternKernel` per lane does it).
* **Pipeline split** ``P+ = P v (P P+)`` (:func:`pipeline_split`): stage 1 matches the pattern up to
  and including the *first* occurrence of a Kleene-plus element ``P`` and emits each such run as a
  *seed* row; stage 2 receives the events and the seeds (:func:`stage2_batch`), continues every seed
  with further ``P`` rows and the suffix, and emits the matches. Limits: stage 2 still reads every
  event of its keys (strict contiguity needs them); a seed must reach stage 2 no later than the
  epoch in which stage 2 matches the row after the seed's last row, which holds when stage 2 gets
  stage 1's output of the same epoch with the same watermark; both stages need the same watermarks,
  ``allowed_lateness_ms`` and key groups (they then drop the same late rows and order ties alike);
  there is one split point, not AnduIN's arbitrary-length chain.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from eddyline.columns import KG
from eddyline.operators.pattern.dsl import PLUS, Measure, Pattern, Split
from eddyline.operators.pattern.kernel import PatternKernel
from eddyline.operators.pattern.layout import SEED


def pipeline_split(
    input_schema: pa.Schema,
    keys: tuple[str, ...],
    time: str,
    pattern: Pattern,
    within_ms: int,
    measures: Mapping[str, Measure],
    at: int | None = None,
    *,
    allowed_lateness_ms: int = 0,
) -> tuple[PatternKernel, PatternKernel]:
    """The two kernels of AnduIN's pipeline split ``P+ = P v (P P+)`` at Kleene-plus element
    ``at`` (default: the first one).

    Stage 1 matches ``pattern`` up to and including the first row bound to ``P`` and emits each
    such run as a seed row (``_kg, keys``, the run columns of the state, ``_end_rank``;
    ``_end_rank`` tells ties on ``_end_ms`` apart). Stage 2 starts no runs of its own: it continues
    the seeds, with further ``P`` rows (the ``P+`` branch) or the suffix directly (the ``P``
    branch), and emits the same matches a single :class:`PatternKernel` would. Feed stage 2 with
    :func:`stage2_batch` of the same epoch's events and stage 1's output, under the same watermark
    (see the module docstring for why, and for the limits).
    """
    plus = [i for i, e in enumerate(pattern.elements) if e.quantifier == PLUS]
    at = plus[0] if at is None and plus else at
    if at is None or at not in plus:
        raise ValueError(f"split point must be a Kleene-plus element; plus elements are at {plus}")
    return (
        PatternKernel(
            *(input_schema, keys, time, pattern, within_ms, measures),
            allowed_lateness_ms=allowed_lateness_ms,
            split=Split(1, at),
        ),
        PatternKernel(
            *(input_schema, keys, time, pattern, within_ms, measures),
            allowed_lateness_ms=allowed_lateness_ms,
            split=Split(2, at),
        ),
    )


def stage2_batch(stage2: PatternKernel, events: pa.Table, seeds: pa.Table) -> pa.Table:
    """Stage 2's input: the events (``_seed`` null) and stage 1's seed rows (event columns null
    except ``_kg`` and keys, the seed in ``_seed``)."""
    n = seeds.num_rows
    seed_struct = pa.StructArray.from_arrays(
        [seeds.column(f.name).combine_chunks() for f in stage2.seed_type],
        fields=list(stage2.seed_type),
    )
    seed_rows = pa.Table.from_arrays(
        [
            seeds.column(f.name)
            if f.name in (KG, *stage2.keys)
            else seed_struct
            if f.name == SEED
            else pa.nulls(n, f.type)
            for f in stage2.input_schema
        ],
        schema=stage2.input_schema,
    )
    event_rows = events.select(stage2.event_schema.names).append_column(
        SEED, pa.nulls(events.num_rows, stage2.seed_type)
    )
    return pa.concat_tables([event_rows.cast(stage2.input_schema), seed_rows])
