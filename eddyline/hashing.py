"""Spark SQL's ``xxhash64``, in vectorised numpy (no Spark).

Key groups (``pmod(xxhash64(keys), K)``) and random shedding are computed in Spark SQL; the
driver and the kernels compute the same values here, so both sides agree on every row.
Spark's ``xxhash64(a, b)`` hashes ``a`` with seed 42 and then ``b`` with the previous hash as the
seed; a BIGINT ``v`` is hashed as XXH64 of its eight little-endian bytes (Spark's
``XXH64.hashLong``); a NULL argument leaves the hash unchanged. Key groups take BIGINT,
TIMESTAMP and STRING keys (:func:`spark_xxhash64_of_columns`); a split hot key group
(SPREADFIRE) chooses a row's home fragment by the hash of the whole row
(:func:`spark_xxhash64_of_values`, INT, DOUBLE, ... too).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The seed Spark's ``xxhash64`` starts from.
SPARK_XXHASH64_SEED = 42

_MASK64 = (1 << 64) - 1
_LOW53 = (1 << 53) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

# The five XXH64 primes of the specification.
_PRIME64_1 = np.uint64(0x9E3779B185EBCA87)
_PRIME64_2 = np.uint64(0xC2B2AE3D27D4EB4F)
_PRIME64_3 = np.uint64(0x165667B19E3779F9)
_PRIME64_4 = np.uint64(0x85EBCA77C2B2AE63)
_PRIME64_5 = np.uint64(0x27D4EB2F165667C5)

IdsLike = pa.Array | pa.ChunkedArray | np.ndarray | list[int]


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


def _seed_array(seed: int | np.ndarray) -> np.ndarray:
    if isinstance(seed, np.ndarray):
        if seed.dtype == np.uint64:
            return seed
        if seed.dtype.kind == "i":
            return seed.astype(np.int64, copy=False).view(np.uint64)
        raise TypeError(f"seeds must be integers, got dtype {seed.dtype}")
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    return np.array([int(seed) & _MASK64], dtype=np.uint64)


def _as_uint64(values: np.ndarray) -> np.ndarray:
    """The 64-bit two's-complement bit patterns of integers, as uint64."""
    if values.dtype.kind == "i":
        return values.astype(np.int64, copy=False).view(np.uint64)
    if values.dtype.kind == "u":
        return values.astype(np.uint64, copy=False)
    raise TypeError(f"values must be integers, got dtype {values.dtype}")


def xxh64_long(values: np.ndarray, seed: int | np.ndarray) -> np.ndarray:
    """XXH64 of each 64-bit integer's eight little-endian bytes, with the given seed(s).

    This is Spark's ``XXH64.hashLong(value, seed)``: the XXH64 specification for an 8-byte input
    (accumulator ``seed + PRIME64_5 + 8``, one lane round, then the avalanche). ``values`` are
    signed or unsigned integers (taken as their two's-complement bit pattern); ``seed`` is an
    integer (any sign, taken modulo 2**64) or a uint64 array broadcastable against ``values``.
    Returns uint64.
    """
    v = _as_uint64(np.atleast_1d(np.asarray(values)))
    s = _seed_array(seed)
    with np.errstate(over="ignore"):
        h = s + _PRIME64_5 + np.uint64(8)
        lane = _rotl(v * _PRIME64_2, 31) * _PRIME64_1
        h = h ^ lane
        h = _rotl(h, 27) * _PRIME64_1 + _PRIME64_4
        h = h ^ (h >> np.uint64(33))
        h = h * _PRIME64_2
        h = h ^ (h >> np.uint64(29))
        h = h * _PRIME64_3
        h = h ^ (h >> np.uint64(32))
    return h


def _longs(values: IdsLike | int) -> tuple[np.ndarray, np.ndarray | None]:
    """Values as int64 plus a validity mask (``None`` when nothing is null)."""
    if isinstance(values, int | np.integer) and not isinstance(values, bool):
        if not _INT64_MIN <= int(values) <= _INT64_MAX:
            raise ValueError(f"{values} does not fit in a signed 64-bit integer (Spark BIGINT)")
        return np.array([int(values)], dtype=np.int64), None
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if not (pa.types.is_integer(values.type) or pa.types.is_null(values.type)):
            raise TypeError(f"row ids must be integers, got Arrow type {values.type}")
        try:
            as_long = pc.cast(values, pa.int64())
        except pa.ArrowInvalid as exc:
            raise ValueError(f"row ids must fit in a signed 64-bit integer: {exc}") from None
        valid = None
        if as_long.null_count:
            valid = as_long.is_valid().to_numpy(zero_copy_only=False)
            as_long = pc.fill_null(as_long, 0)
        return as_long.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), valid
    array = np.asarray(values).reshape(-1)
    if array.dtype.kind not in "iu":
        raise TypeError(f"row ids must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and array.max() > _INT64_MAX:
        raise ValueError("row ids must fit in a signed 64-bit integer (Spark BIGINT)")
    return array.astype(np.int64), None


def spark_xxhash64(*args: IdsLike | int) -> np.ndarray:
    """Spark SQL ``xxhash64(arg1, arg2, ...)`` for BIGINT arguments, as an int64 array.

    The hash starts at seed 42; each argument is hashed with :func:`xxh64_long` using the
    previous hash as its seed, and a NULL (an invalid Arrow slot) leaves the hash unchanged, as in
    Spark. Arguments are Python ints, integer numpy arrays or integer Arrow arrays, broadcast
    against each other.
    """
    if not args:
        raise ValueError("spark_xxhash64 needs at least one argument")
    h = np.array([SPARK_XXHASH64_SEED], dtype=np.uint64)
    for arg in args:
        values, valid = _longs(arg)
        hashed = xxh64_long(values, h)
        h = hashed if valid is None else np.where(valid, hashed, h)
    return h.view(np.int64)


def _xxh64_strings(values: pa.Array, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Spark's ``XXH64.hashUnsafeBytes`` of each string's UTF-8 bytes with its row's seed: the
    standard XXH64 (the ``xxhash`` package), one call a value."""
    import xxhash

    texts = values.to_pylist()
    out = np.empty(len(texts), dtype=np.uint64)
    broadcast = seeds.size == 1
    for i, text in enumerate(texts):
        seed = int(seeds[0] if broadcast else seeds[i])
        data = b"" if text is None else text if isinstance(text, bytes) else text.encode()
        out[i] = xxhash.xxh64_intdigest(data, seed)
    valid = None if values.null_count == 0 else values.is_valid().to_numpy(zero_copy_only=False)
    return out, valid


def xxh64_int(values: np.ndarray, seed: int | np.ndarray) -> np.ndarray:
    """XXH64 of each 32-bit integer's four little-endian bytes, with the given seed(s): Spark's
    ``XXH64.hashInt(value, seed)``, how it hashes an INT, SMALLINT, TINYINT, BOOLEAN (1 or 0), DATE
    (its days) and FLOAT (its bits). ``values``: signed or unsigned integers (their low 32 bits are
    taken). Returns uint64."""
    v = np.atleast_1d(np.asarray(values)).astype(np.int64, copy=False).view(np.uint64) & np.uint64(0xFFFFFFFF)
    s = _seed_array(seed)
    with np.errstate(over="ignore"):
        h = s + _PRIME64_5 + np.uint64(4)
        h = h ^ (v * _PRIME64_1)
        h = _rotl(h, 23) * _PRIME64_2 + _PRIME64_3
        h = h ^ (h >> np.uint64(33))
        h = h * _PRIME64_2
        h = h ^ (h >> np.uint64(29))
        h = h * _PRIME64_3
        h = h ^ (h >> np.uint64(32))
    return h


def _hashed(column: pa.Array, h: np.ndarray, wide: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """One argument of Spark's ``xxhash64`` hashed with the running hash ``h`` as its seed; the
    validity mask (None: no null). ``wide``: every type :func:`spark_xxhash64_of_values` takes."""
    t = column.type
    if pa.types.is_timestamp(t):  # Spark keeps a TIMESTAMP as its microseconds
        column, t = column.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64()), pa.int64()
    if pa.types.is_int64(t):
        return xxh64_long(*_longs(column)[:1], h), _valid(column)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _xxh64_strings(column, h)
    if wide:
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return _xxh64_strings(column, h)
        if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
            return xxh64_int(_numbers(column, np.int64), h), _valid(column)
        if pa.types.is_boolean(t):
            return xxh64_int(_numbers(column.cast(pa.int8()), np.int64), h), _valid(column)
        if pa.types.is_date32(t):
            return xxh64_int(_numbers(column.cast(pa.int32()), np.int64), h), _valid(column)
        if pa.types.is_float32(t):  # -0.0 as 0.0, every NaN as Java's canonical one
            f = _numbers(column, np.float32)
            bits = np.where(f == 0, np.int32(0), f.view(np.int32))
            return xxh64_int(np.where(np.isnan(f), np.int32(0x7FC00000), bits), h), _valid(column)
        if pa.types.is_float64(t):
            d = _numbers(column, np.float64)
            bits = np.where(d == 0, np.int64(0), d.view(np.int64))
            return xxh64_long(np.where(np.isnan(d), np.int64(0x7FF8000000000000), bits), h), _valid(column)
    raise TypeError(f"Spark's xxhash64 of {t} is not reproduced here (BIGINT and STRING are)")


def _valid(column: pa.Array) -> np.ndarray | None:
    return None if column.null_count == 0 else column.is_valid().to_numpy(zero_copy_only=False)


def _numbers(column: pa.Array, dtype: type) -> np.ndarray:
    """A numeric column's values as ``dtype`` (a null as 0: the mask leaves its hash out)."""
    filled = pc.fill_null(column, pa.scalar(0, column.type)) if column.null_count else column
    return np.asarray(filled.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)


def spark_xxhash64_of_columns(*columns: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Spark SQL ``xxhash64(c1, c2, ...)`` of Arrow columns of BIGINT, TIMESTAMP or STRING values (each
    hashed with the previous hash as its seed, a NULL leaving it unchanged), as int64. Other
    types raise ``TypeError``: Spark hashes them by rules of their own (an INT as four bytes, a
    DOUBLE by its bits after normalising -0.0, ...)."""
    return _xxhash64(columns, wide=False)


def spark_xxhash64_of_values(*columns: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`spark_xxhash64_of_columns` for whole rows: BIGINT, INT, SMALLINT, TINYINT, BOOLEAN,
    DATE, TIMESTAMP, FLOAT, DOUBLE (-0.0 as 0.0, NaN as Java's one NaN), STRING and BINARY
    columns, each by Spark's rule for its type (``TypeError`` for others: DECIMAL, nested)."""
    return _xxhash64(columns, wide=True)


def hashes_as_spark(t: pa.DataType) -> bool:
    """Whether :func:`spark_xxhash64_of_values` hashes values of ``t`` as Spark does."""
    return (pa.types.is_null(t) or pa.types.is_timestamp(t) or pa.types.is_integer(t) and t.bit_width <= 64 and pa.types.is_signed_integer(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_boolean(t) or pa.types.is_date32(t)
            or pa.types.is_float32(t) or pa.types.is_float64(t))


def _xxhash64(columns: tuple[pa.Array | pa.ChunkedArray, ...], wide: bool) -> np.ndarray:
    if not columns:
        raise ValueError("spark_xxhash64_of_columns needs at least one column")
    h = np.array([SPARK_XXHASH64_SEED], dtype=np.uint64)
    for column in columns:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if wide and pa.types.is_null(column.type):  # every value null: the hash stays
            continue
        hashed, valid = _hashed(column, h, wide)
        h = hashed if valid is None else np.where(valid, hashed, np.broadcast_to(h, hashed.shape))
    return h.view(np.int64)
