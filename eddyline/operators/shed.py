"""Deterministic load shedding of Arrow tables (pure pyarrow and numpy, no Spark).

Two ways to choose which rows to drop:

* **Random** (:func:`keep_mask_random`): each row is kept or dropped by a hash of ``(seed, row
  id)``, so the decision is a pure function of those two values. A replayed epoch, a retried
  task and a Spark query all drop the same rows, and the kept fraction is ``keep`` on average
  (each row is an independent Bernoulli trial as far as the hash is random).
* **Semantic** (:func:`keep_mask_semantic`): keep the rows of highest utility, exactly
  ``round(keep * n)`` of them, ties broken by the same hash.

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
import pyarrow as pa
import pyarrow.compute as pc

from eddyline.hashing import SPARK_XXHASH64_SEED, IdsLike, spark_xxhash64, xxh64_long

__all__ = [
    "SPARK_XXHASH64_SEED",
    "keep_mask_random",
    "keep_mask_semantic",
    "keep_threshold",
    "random_keep_sql",
    "shed",
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


def keep_mask_semantic(
    utility: np.ndarray,
    keep: float,
    *,
    tie_ids: IdsLike | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Keep the ``round(keep * n)`` rows of highest utility.

    Rounding is half up, ``k = floor(keep * n + 0.5)`` (so 0.5 of 3 rows keeps 2), computed in
    floating point. NaN utilities rank below every number. Rows of equal utility are ordered by
    ``spark_xxhash64(seed, tie_id)`` read as an unsigned integer (ascending), then by position;
    ``tie_ids`` defaults to the row positions. The result is deterministic and has exactly ``k``
    ``True`` entries.
    """
    seed = _check_seed(seed)
    keep = _check_keep(keep)
    values = np.asarray(utility, dtype=np.float64).reshape(-1)
    n = values.size
    k = min(n, math.floor(keep * n + 0.5))
    ids: IdsLike = np.arange(n, dtype=np.int64) if tie_ids is None else tie_ids
    tie_hash = spark_xxhash64(seed, ids).view(np.uint64)
    if tie_hash.size != n:
        raise ValueError(f"tie_ids has {tie_hash.size} entries for {n} utilities")
    missing = np.isnan(values)
    descending = np.where(missing, 0.0, -values)
    order = np.lexsort((np.arange(n), tie_hash, descending, missing))
    mask = np.zeros(n, dtype=bool)
    mask[order[:k]] = True
    return mask


def shed(
    table: pa.Table,
    keep: float,
    *,
    seed: int,
    id_column: str,
    utility: str | None = None,
) -> tuple[pa.Table, pa.Table]:
    """Split ``table`` into ``(kept, dropped)``, both in the original row order.

    Without ``utility`` the split is :func:`keep_mask_random` over ``id_column``; with it, it is
    :func:`keep_mask_semantic` over that numeric column (nulls rank lowest) with ties broken by
    ``id_column``.
    """
    for name in (id_column, utility):
        if name is not None and name not in table.column_names:
            raise KeyError(f"column {name!r} not in table (columns: {table.column_names})")
    ids = table.column(id_column)
    if utility is None:
        mask = keep_mask_random(ids, keep, seed)
    else:
        scores = table.column(utility)
        if not (pa.types.is_integer(scores.type) or pa.types.is_floating(scores.type)):
            raise TypeError(f"utility column {utility!r} must be numeric, got {scores.type}")
        as_float = pc.cast(scores, pa.float64()).to_numpy()
        mask = keep_mask_semantic(as_float, keep, tie_ids=ids, seed=seed)
    if table.num_rows == 0:
        return table, table
    selected = pa.array(mask, type=pa.bool_())
    return table.filter(selected), table.filter(pc.invert(selected))
