"""The ``generator`` source: synthetic keyed rows computed inside Spark.

Every column is a pure function of ``(seed, offset)``. Randomness comes from hashing
``(seed, offset, salt)`` with ``xxhash64`` instead of ``rand()``, whose output depends on how rows
are split into partitions; so an offset range produces the same rows however it is cut into epochs
or partitions, which is what lets a replayed epoch reproduce its input exactly.

All per-row work is Spark SQL column expressions (no Python UDFs), so generation runs in the JVM's
generated code. Python computes only per-phase constants, and mirrors the event-time formula in
:func:`generator_event_time_ms` with the very same IEEE double operations, so the two agree exactly.

The hashing helpers here are shared with :mod:`eddyline.io.nexmark`.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pydantic import Field
from pyspark.sql import Column
from pyspark.sql import functions as F

from eddyline.api.sources import SOURCES
from eddyline.api.units import Duration, Model
from eddyline.io.sources import SourceKind, SyntheticSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from eddyline.api.sources import SourceSpec

#: What an unpaced source reports as available: effectively unbounded, yet far from overflowing
#: a long when the runtime adds an epoch's admission limit to it.
UNPACED_AVAILABLE = 2**62

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS_PER_SECOND = 1_000_000

#: ``rank * multiplier`` must fit a long (Spark runs in ANSI mode, where overflow is an error);
#: both factors are below ``keys``, so ``keys`` is capped at 2**31.
MAX_KEYS = 2**31

#: Fractional part of the golden ratio: multiplying ranks by about ``keys * 0.618`` sends
#: consecutive ranks (the hot ones) to keys far apart, hence to different key groups.
_GOLDEN_FRACTION = 0.6180339887498949

# Salts: one per independent random quantity, so the hashes of one offset do not correlate.
_SALT_KEY = 1
_SALT_VALUE = 2

#: ``value`` is uniform in [0, VALUE_BOUND).
VALUE_BOUND = 1000


# --------------------------------------------------------------------------- parameters


class Phase(Model):
    """One phase of a generator: for ``duration`` of event time, these settings hold."""

    duration: Duration = Field(gt=0)
    rate: float | None = Field(default=None, gt=0)
    skew: float | None = Field(default=None, ge=0)
    keys: int | None = Field(default=None, gt=0)
    #: Moves the hot set: popularity rank r is key (r * m + hot_shift) mod keys, m a fixed
    #: multiplier coprime with keys; so key ``hot_shift`` is the hottest (see eddyline.io.generator).
    hot_shift: int = 0


class Generator(Model):
    """Synthetic keyed rows computed inside Spark; deterministic from (seed, offset).

    Columns: ``offset`` (long), ``key`` (long in [0, keys)), ``value`` (long in [0, 1000)),
    ``event_time`` (timestamp). Offset ``i`` has event time ``start_time + i / rate`` (piecewise
    over ``phases``), and becomes available at the same wall-clock distance from the run's start.
    """

    rate: float = Field(default=10_000, gt=0)
    keys: int = Field(default=1_000, gt=0)
    skew: float = Field(default=0.0, ge=0)
    seed: int = 0
    start_time: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    phases: tuple[Phase, ...] = ()
    #: Pretend all rows are available at once (benchmarks): offsets are not paced by wall time.
    unpaced: bool = False


# --------------------------------------------------------------------------- shared helpers


def epoch_micros(moment: datetime) -> int:
    """Exact microseconds since the Unix epoch; a naive datetime is taken to be UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def salt_constant(seed: int, salt: int) -> int:
    """A signed 64-bit constant that stands for ``(seed, salt)`` in the row hash."""
    digest = hashlib.blake2b(f"{seed}/{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def hash_bits(seed: int, column: Column, salt: int) -> Column:
    """64 pseudo-random bits (a signed long) determined by ``(seed, column, salt)`` only.

    Seed and salt are folded into one constant in Python, so each row pays for two rounds of
    xxhash64 instead of three.
    """
    return F.xxhash64(column, F.lit(salt_constant(seed, salt)))


def uniform_below(bits: Column, bound: int | Column) -> Column:
    """A long uniform in ``[0, bound)`` (modulo bias is below bound / 2**64, i.e. negligible)."""
    return F.pmod(bits, bound if isinstance(bound, Column) else F.lit(bound))


def bit_field(bits: Column, shift: int, width: int) -> Column:
    """``width`` bits of ``bits`` starting at bit ``shift``, as a non-negative long.

    Disjoint fields of one hash are independent draws, so a row needs fewer hashes; a uniform
    draw below ``bound`` from a field has a bias of at most ``bound / 2**width``.
    """
    return F.shiftrightunsigned(bits, shift).bitwiseAND(F.lit((1 << width) - 1))


def unit_interval(bits: Column) -> Column:
    """A double uniform in ``[0, 1)``: the top 53 bits of ``bits`` scaled by 2**-53."""
    return F.shiftrightunsigned(bits, 11).cast("double") * F.lit(2.0**-53)


def unit_interval_np(bits: np.ndarray) -> np.ndarray:
    """:func:`unit_interval` in numpy, the same doubles (for reads without Spark)."""
    return (bits.view(np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def offsets_until(time_us_of: Callable[[int], int], now_us: int) -> int:
    """How many offsets ``o >= 0`` have ``time_us_of(o) <= now_us``.

    ``time_us_of`` must be non-decreasing; an exponential then a binary search keeps this to
    about 2 * log2(answer) evaluations, cheap enough to call every epoch.
    """
    if time_us_of(0) > now_us:
        return 0
    high = 1
    while time_us_of(high) <= now_us:
        high *= 2
    return bisect.bisect_right(range(high), now_us, key=time_us_of)


# --------------------------------------------------------------------------- phases


@dataclass(frozen=True)
class Segment:
    """One phase resolved to constants, covering offsets from ``first`` to the next segment's."""

    #: First offset whose event time falls in this phase.
    first: int
    #: Event time at which the phase begins, in µs since the epoch (exact: a sum of durations).
    start_us: int
    #: Event time from ``start_us`` to offset ``first`` (under one row gap: phases need not hold
    #: a whole number of rows).
    lead_us: float
    #: Event time between consecutive offsets: 1e6 / rate.
    gap_us: float
    keys: int
    skew: float
    hot_shift: int


def segments(params: Generator) -> tuple[Segment, ...]:
    """The phases as segments; without phases, one segment of the top-level settings.

    Phase boundaries are tracked as exact fractions (in offsets), so rounding never accumulates
    from one phase to the next; only the position inside a phase is computed in doubles.
    """
    boundary = Fraction(0)  # the (possibly fractional) offset at which the phase starts
    start_us = epoch_micros(params.start_time)
    result = []
    for phase in params.phases or (None,):
        rate = params.rate if phase is None or phase.rate is None else phase.rate
        keys = params.keys if phase is None or phase.keys is None else phase.keys
        if keys > MAX_KEYS:
            raise ValueError(f"keys: at most {MAX_KEYS} keys are supported, got {keys}")
        first = math.ceil(boundary)
        result.append(
            Segment(
                first=first,
                start_us=start_us,
                lead_us=float((first - boundary) * _MICROS_PER_SECOND / Fraction(rate)),
                gap_us=_MICROS_PER_SECOND / rate,
                keys=keys,
                skew=params.skew if phase is None or phase.skew is None else phase.skew,
                hot_shift=0 if phase is None else phase.hot_shift,
            )
        )
        if phase is not None:
            boundary += Fraction(phase.duration) * Fraction(rate) / 1000
            start_us += phase.duration * 1000
    return tuple(result)


def _segment_index(segs: tuple[Segment, ...], offset: int) -> int:
    # The last segment starting at or before the offset; a phase too short to hold a row shares
    # its ``first`` with the next one and is skipped, exactly like the CASE in the Spark column.
    return bisect.bisect_right([s.first for s in segs], offset) - 1


def _event_time_us(seg: Segment, offset: int) -> int:
    # Keep in step with the Spark column in ``_event_time_us_col``: same operations, same order.
    return seg.start_us + math.floor(float(offset - seg.first) * seg.gap_us + seg.lead_us)


def _event_time_us_col(seg: Segment, offset: Column) -> Column:
    position = (offset - F.lit(seg.first)).cast("double") * F.lit(seg.gap_us) + F.lit(seg.lead_us)
    return F.lit(seg.start_us) + F.floor(position)


def generator_event_time_ms(params: Generator, offset: int) -> int:
    """Event time of ``offset`` in ms since the epoch; equals the Spark column truncated to ms."""
    segs = segments(params)
    return _event_time_us(segs[_segment_index(segs, offset)], offset) // 1000


def generator_available(params: Generator, elapsed_s: float) -> int:
    """How many offsets exist ``elapsed_s`` wall-clock seconds after the run started.

    Event time runs at wall-clock speed, so these are the offsets whose event time is at most
    ``start_time + elapsed_s``; phases with other rates make offsets appear faster or slower.
    """
    if params.unpaced:
        return UNPACED_AVAILABLE
    segs = segments(params)
    now_us = segs[0].start_us + round(elapsed_s * _MICROS_PER_SECOND)
    return offsets_until(lambda o: _event_time_us(segs[_segment_index(segs, o)], o), now_us)


# --------------------------------------------------------------------------- keys


def spread_multiplier(keys: int) -> int:
    """The multiplier of the rank → key bijection: near ``keys * 0.618`` and coprime to ``keys``.

    ``rank ↦ (rank * m + hot_shift) mod keys`` is a bijection of ``[0, keys)`` exactly when
    ``gcd(m, keys) == 1``, for any ``keys`` (not only powers of two).
    """
    m = max(1, round(keys * _GOLDEN_FRACTION))
    while math.gcd(m, keys) != 1:
        m += 1
    return m


def _zipf_rank(u: Column, keys: int, skew: float) -> Column:
    """A rank in ``[0, keys)`` with ``P(rank = r)`` roughly proportional to ``(r + 1) ** -skew``.

    Inverts the CDF of the continuous density ``x ** -skew`` on ``[0.5, keys + 0.5)`` and rounds:
    rank ``r`` owns the unit interval centred on ``r + 1`` (the midpoint rule), which follows the
    discrete Zipf law much more closely than integrating from 1. ``skew == 0`` is uniform.
    """
    low, high = 0.5, keys + 0.5
    exponent = 1.0 - skew
    if abs(exponent) < 1e-6:
        # skew == 1: the CDF is logarithmic, x = low * (high / low) ** u.
        x = F.lit(low) * F.exp(u * F.lit(math.log(high / low)))
    else:
        a, b = low**exponent, high**exponent
        x = F.pow(F.lit(a) + u * F.lit(b - a), F.lit(1.0 / exponent))
    rank = F.floor(x - F.lit(0.5))
    # Rounding at u → 1 can land exactly on the upper bound.
    return F.least(F.greatest(rank, F.lit(0)), F.lit(keys - 1))


def _key_col(seg: Segment, u: Column) -> Column:
    rank = _zipf_rank(u, seg.keys, seg.skew)
    return F.pmod(
        rank * F.lit(spread_multiplier(seg.keys)) + F.lit(seg.hot_shift % seg.keys),
        F.lit(seg.keys),
    )


# --------------------------------------------------------------------------- frame


def _by_segment(segs: list[Segment], offset: Column, build: Callable[[Segment], Column]) -> Column:
    """``build(segment)`` for the segment holding each row's offset, as one CASE over offsets."""
    result = build(segs[-1])
    for seg, following in zip(reversed(segs[:-1]), reversed(segs[1:]), strict=True):
        result = F.when(offset < F.lit(following.first), build(seg)).otherwise(result)
    return result


@functools.lru_cache(maxsize=64)
def _columns(spark: SparkSession, params: Generator, first: int, last: int) -> tuple[Column, ...]:
    """The output columns for ranges within segments ``first .. last``.

    Cached per session and settings because building them costs many JVM calls per epoch;
    ``spark`` is only part of the key, since the columns are objects in its JVM. Only the phases
    a range touches take part in the CASE expressions.
    """
    segs = list(segments(params)[first : last + 1])
    offset = F.col("id")
    u = unit_interval(hash_bits(params.seed, offset, _SALT_KEY))
    event_us = _by_segment(segs, offset, lambda s: _event_time_us_col(s, offset))
    return (
        offset.alias("offset"),
        _by_segment(segs, offset, lambda s: _key_col(s, u)).alias("key"),
        uniform_below(hash_bits(params.seed, offset, _SALT_VALUE), VALUE_BOUND).alias("value"),
        F.timestamp_micros(event_us).alias("event_time"),
    )


def generator_frame(
    spark: SparkSession, params: Generator, start: int, end: int, partitions: int
) -> DataFrame:
    """Rows for offsets ``[start, end)``: ``offset``, ``key``, ``value`` (longs), ``event_time``.

    ``key`` is Zipf-distributed over ``[0, keys)`` with exponent ``skew``; rank ``r`` becomes key
    ``(r * spread_multiplier(keys) + hot_shift) mod keys``, so the hottest key is ``hot_shift``
    and the next hottest ones are scattered rather than adjacent. ``value`` is uniform in
    ``[0, 1000)``.
    """
    segs = segments(params)
    first = _segment_index(segs, start)
    last = _segment_index(segs, max(start, end - 1))
    return spark.range(start, end, 1, partitions).select(*_columns(spark, params, first, last))


def generator_columns(spark: SparkSession, params: Generator, offsets: DataFrame) -> DataFrame:
    """The generator's rows for a frame whose ``id`` column holds offsets (any range)."""
    return offsets.select(*_columns(spark, params, 0, len(segments(params)) - 1))


def generator_arrow(params: Generator, start: int, end: int) -> pa.Table:
    """The rows of offsets ``[start, end)`` computed here, in numpy: the same values as
    :func:`generator_frame`'s Spark columns, operation for operation (the row hash is Spark's
    ``xxhash64``, :mod:`eddyline.hashing`; the doubles go through the same steps in the same
    order)."""
    from eddyline.hashing import spark_xxhash64

    segs = segments(params)
    offset = np.arange(start, end, dtype=np.int64)
    which = np.searchsorted(np.array([s.first for s in segs], dtype=np.int64), offset, side="right") - 1
    bits = spark_xxhash64(offset, salt_constant(params.seed, _SALT_KEY))
    u = unit_interval_np(bits)
    key = np.zeros(offset.size, dtype=np.int64)
    event_us = np.zeros(offset.size, dtype=np.int64)
    for i, seg in enumerate(segs):
        mine = which == i
        if not mine.any():
            continue
        low, high, exponent = 0.5, seg.keys + 0.5, 1.0 - seg.skew
        if abs(exponent) < 1e-6:
            x = low * np.exp(u[mine] * math.log(high / low))
        else:
            a, b = low**exponent, high**exponent
            x = np.power(a + u[mine] * (b - a), 1.0 / exponent)
        rank = np.clip(np.floor(x - 0.5).astype(np.int64), 0, seg.keys - 1)
        key[mine] = np.mod(rank * spread_multiplier(seg.keys) + seg.hot_shift % seg.keys, seg.keys)
        position = (offset[mine] - seg.first).astype(np.float64) * seg.gap_us + seg.lead_us
        event_us[mine] = seg.start_us + np.floor(position).astype(np.int64)
    value = np.mod(spark_xxhash64(offset, salt_constant(params.seed, _SALT_VALUE)), VALUE_BOUND)
    return pa.table({"offset": offset, "key": key, "value": value,
                     "event_time": pa.array(event_us, pa.timestamp("us", tz="UTC"))})


def offsets(params: Generator, start: int, end: int) -> tuple[int, int]:
    """The row ids of offsets ``[start, end)``: the offsets themselves."""
    return start, end


@SOURCES.register
class GeneratorKind(SourceKind):
    key = "generator"
    params = Generator

    def make(self, spec: SourceSpec) -> SyntheticSource:
        return SyntheticSource(spec, generator_available, generator_columns, offsets, unpaced=spec.params.unpaced,
                               arrow=generator_arrow)
