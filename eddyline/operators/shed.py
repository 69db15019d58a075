"""Deterministic random load shedding (pure numpy, no Spark), and the same decision in Spark SQL.

:func:`keep_mask_random` keeps or drops each row by a hash of ``(seed, row id)``, so the decision
is a pure function of those two values: a replayed epoch, a retried task and a Spark query all
drop the same rows, and the kept fraction is ``keep`` on average (each row is an independent
Bernoulli trial as far as the hash is random). The runtime sheds in Spark with
:func:`random_keep_sql`; the controller measures what a keep fraction costs in quality with the
numpy mask.

The hash is Spark's ``xxhash64``, reimplemented in vectorised numpy so that Python kernels and
Spark SQL (see :func:`random_keep_sql`) make the same decisions. The decision for a row id ``i``
mirrors the Spark SQL expression

    (xxhash64(CAST(<seed> AS BIGINT), CAST(<id> AS BIGINT)) & 9007199254740991) < T

with ``T = ceil(keep * 2**53)``. Spark's ``xxhash64(a, b)`` hashes ``a`` with seed 42 and then
``b`` with the previous hash as the seed; a BIGINT ``v`` is hashed as XXH64 of its eight
little-endian bytes (Spark's ``XXH64.hashLong``); a NULL argument leaves the hash unchanged. The
low 53 bits of the (signed) result, read as an integer ``m``, are uniform on ``[0, 2**53)``, and
``m < T`` is exactly ``m / 2**53 < keep``: the comparison is done on integers so that neither
side depends on floating-point or Spark's decimal-literal arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

from eddyline.hashing import SPARK_XXHASH64_SEED, IdsLike, spark_xxhash64, xxh64_long

__all__ = [
    "SPARK_XXHASH64_SEED",
    "keep_mask_random",
    "keep_threshold",
    "random_keep_sql",
    "spark_xxhash64",
    "xxh64_long",
]

_LOW53 = (1 << 53) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

def keep_threshold(keep: float) -> int:
    """The integer ``T = ceil(keep * 2**53)`` that the low 53 hash bits are compared with.

    For an integer ``m``, ``m / 2**53 < keep`` holds exactly when ``m < T`` (``keep * 2**53`` is
    exact in binary floating point), so keep fractions 0 and 1 drop and keep every row.
    """
    keep = _check_keep(keep)
    return math.ceil(keep * float(1 << 53))


def _check_keep(keep: float) -> float:
    value = float(keep)
    if not (0.0 <= value <= 1.0):  # also rejects NaN
        raise ValueError(f"keep must be in [0, 1], got {keep!r}")
    return value


def _check_seed(seed: int) -> int:
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    if not _INT64_MIN <= int(seed) <= _INT64_MAX:
        raise ValueError(f"seed {seed} does not fit in a signed 64-bit integer (Spark BIGINT)")
    return int(seed)


def keep_mask_random(row_ids: IdsLike, keep: float, seed: int) -> np.ndarray:
    """Which rows to keep, as a pure function of ``(seed, row id)``.

    Row ``i`` is kept when the low 53 bits of ``spark_xxhash64(seed, row_ids[i])`` are below
    :func:`keep_threshold` of ``keep`` — the same decision as the Spark SQL of
    :func:`random_keep_sql`. Row ids are integers (offsets or any stable 64-bit id); null ids
    hash like Spark's NULL (all of them get the decision of the seed alone). The kept fraction is
    ``keep`` in expectation.
    """
    seed = _check_seed(seed)
    threshold = keep_threshold(keep)
    low = spark_xxhash64(seed, row_ids).view(np.uint64) & np.uint64(_LOW53)
    return low < np.uint64(threshold)


def random_keep_sql(id_expr: str, keep: float, seed: int) -> str:
    """A Spark SQL boolean expression making the same decisions as :func:`keep_mask_random`.

    ``id_expr`` is any Spark SQL expression of integral type (it is cast to BIGINT, so an INT
    column hashes as its BIGINT value, like :func:`keep_mask_random` does). The expression is
    ``(xxhash64(CAST(seed AS BIGINT), CAST((id) AS BIGINT)) & 9007199254740991) < T``.
    """
    seed = _check_seed(seed)
    threshold = keep_threshold(keep)
    return (
        f"((xxhash64(CAST({seed} AS BIGINT), CAST(({id_expr}) AS BIGINT)) & {_LOW53}) "
        f"< {threshold})"
    )
