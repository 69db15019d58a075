"""Spark SQL's ``xxhash64`` in vectorised numpy (no Spark): of BIGINT arguments, and of Arrow
columns of the scalar types (:func:`spark_xxhash64_of_columns`: a row's content, which resident
lanes shed by).

Key groups (``pmod(xxhash64(keys), K)``) and random shedding are computed in Spark SQL; the
driver and the kernels compute the same values here, so both sides agree on every row.
Spark's ``xxhash64(a, b)`` hashes ``a`` with seed 42 and then ``b`` with the previous hash as the
seed; a BIGINT ``v`` is hashed as XXH64 of its eight little-endian bytes (Spark's
``XXH64.hashLong``); a NULL argument leaves the hash unchanged.
"""

from __future__ import annotations

import decimal

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
    return _avalanche(h)


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


def _avalanche(h: np.ndarray) -> np.ndarray:
    """XXH64's final mix of an accumulator (uint64)."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(33))
        h = h * _PRIME64_2
        h = h ^ (h >> np.uint64(29))
        h = h * _PRIME64_3
        return h ^ (h >> np.uint64(32))


def xxh64_int(values: np.ndarray, seed: int | np.ndarray) -> np.ndarray:
    """XXH64 of each 32-bit integer's four little-endian bytes, with the given seed(s): Spark's
    ``XXH64.hashInt`` (accumulator ``seed + PRIME64_5 + 4``, one 4-byte step, the avalanche).
    ``values`` are integers taken as their low 32 bits; returns uint64."""
    v = np.atleast_1d(np.asarray(values)).astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    s = _seed_array(seed)
    with np.errstate(over="ignore"):
        h = s + _PRIME64_5 + np.uint64(4)
        h = h ^ (v * _PRIME64_1)
        h = _rotl(h, 23) * _PRIME64_2 + _PRIME64_3
    return _avalanche(h)


def _xxh64_bytes(values: list[bytes | None], seeds: np.ndarray) -> np.ndarray:
    """Spark's ``XXH64.hashUnsafeBytes`` of each value with its row's seed: the standard XXH64
    (the ``xxhash`` package), one call a value (a None hashes as no bytes; its row keeps its seed)."""
    import xxhash

    out = np.empty(len(values), dtype=np.uint64)
    broadcast = seeds.size == 1
    for i, value in enumerate(values):
        out[i] = xxhash.xxh64_intdigest(value if value is not None else b"", int(seeds[0] if broadcast else seeds[i]))
    return out


def _java_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: the fewest big-endian two's-complement bytes."""
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def _valid(column: pa.Array) -> np.ndarray | None:
    return None if column.null_count == 0 else column.is_valid().to_numpy(zero_copy_only=False)


def _ints(column: pa.Array, dtype: type) -> np.ndarray:
    return np.asarray(pc.fill_null(column, 0).to_numpy(zero_copy_only=False), dtype)


#: Arrow types :func:`spark_xxhash64_of_columns` hashes as Spark hashes their Spark SQL types
def hashable(t: pa.DataType) -> bool:
    """Whether :func:`spark_xxhash64_of_columns` takes a column of Arrow type ``t``."""
    return (pa.types.is_null(t) or pa.types.is_boolean(t) or pa.types.is_signed_integer(t)
            or pa.types.is_floating(t) and not pa.types.is_float16(t) or pa.types.is_date32(t)
            or pa.types.is_timestamp(t) or pa.types.is_decimal128(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _column_hash(column: pa.Array, h: np.ndarray) -> np.ndarray:
    """One column's values hashed with seeds ``h`` as Spark's ``XxHash64`` hashes its type:
    BOOLEAN as the int 1 or 0; TINYINT, SMALLINT, INT and DATE (its days) with ``hashInt``;
    BIGINT and TIMESTAMP (its microseconds) with ``hashLong``; FLOAT and DOUBLE by their bits
    (``floatToIntBits`` / ``doubleToLongBits``: one NaN; -0.0 as 0.0); a DECIMAL of up to 18
    digits by its unscaled long, a wider one by its unscaled value's Java bytes; STRING (UTF-8)
    and BINARY by their bytes."""
    t = column.type
    if pa.types.is_null(t):
        return np.broadcast_to(h, (len(column),))
    if pa.types.is_timestamp(t):  # Spark keeps a TIMESTAMP as its microseconds
        column = column.cast(pa.timestamp("us", tz=t.tz), safe=False).cast(pa.int64())
        t = column.type
    if pa.types.is_int64(t):
        return xxh64_long(_ints(column, np.int64), h)
    if pa.types.is_boolean(t) or pa.types.is_signed_integer(t):
        return xxh64_int(_ints(column.cast(pa.int32()), np.int32), h)
    if pa.types.is_date32(t):
        return xxh64_int(_ints(column.cast(pa.int32()), np.int32), h)
    if pa.types.is_float32(t):
        f = np.asarray(pc.fill_null(column, 0.0).to_numpy(zero_copy_only=False), np.float32)
        f = np.where(f == 0.0, np.float32(0.0), f)  # -0.0 as 0.0
        bits = f.view(np.int32).copy()
        bits[np.isnan(f)] = 0x7FC00000
        return xxh64_int(bits, h)
    if pa.types.is_float64(t):
        d = np.asarray(pc.fill_null(column, 0.0).to_numpy(zero_copy_only=False), np.float64)
        d = np.where(d == 0.0, 0.0, d)
        bits = d.view(np.int64).copy()
        bits[np.isnan(d)] = 0x7FF8000000000000
        return xxh64_long(bits, h)
    if pa.types.is_decimal128(t):
        exact = decimal.Context(prec=80)  # (the default's 28 digits would round 38)
        unscaled = [None if v is None else int(v.scaleb(t.scale, exact)) for v in column.to_pylist()]
        if t.precision <= 18:
            return xxh64_long(np.array([u or 0 for u in unscaled], np.int64), h)
        return _xxh64_bytes([None if u is None else _java_bytes(u) for u in unscaled], h)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _xxh64_bytes([None if v is None else v.encode() for v in column.to_pylist()], h)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _xxh64_bytes(column.to_pylist(), h)
    raise TypeError(f"Spark's xxhash64 of {t} is not reproduced here")


def spark_xxhash64_of_columns(*columns: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Spark SQL ``xxhash64(c1, c2, ...)`` of Arrow columns (each hashed with the previous hash as
    its seed, a NULL leaving it unchanged), as int64: the types :func:`hashable` takes, each as
    :func:`_column_hash` says. Others (lists, structs, maps, unsigned integers) raise
    ``TypeError``."""
    if not columns:
        raise ValueError("spark_xxhash64_of_columns needs at least one column")
    h = np.array([SPARK_XXHASH64_SEED], dtype=np.uint64)
    for column in columns:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not hashable(column.type):
            raise TypeError(f"Spark's xxhash64 of {column.type} is not reproduced here")
        hashed = _column_hash(column, h)
        valid = _valid(column)
        h = hashed if valid is None else np.where(valid, hashed, np.broadcast_to(h, hashed.shape))
    return h.view(np.int64)


def row_hash_sum(table: pa.Table) -> int:
    """The sum of Spark's ``xxhash64`` of every row of ``table`` over all its columns, as an exact
    integer: the hash of a hot pair's digest (:class:`~eddyline.ha.selector.Digest`), which a
    per-epoch job sums in Spark (``sum(CAST(xxhash64(*) AS DECIMAL(38,0)))``), so drivers of a pair
    in either mode compare equal. 0 for no rows; ``TypeError`` for a column :func:`hashable` refuses."""
    if table.num_rows == 0 or table.num_columns == 0:
        return 0
    hashes = spark_xxhash64_of_columns(*table.columns)
    return int(hashes.astype(object).sum())
