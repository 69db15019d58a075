"""Key groups, lanes and the routing table: tiny, pure arithmetic.

Invariants (checked by tests/plan/test_keygroups.py):

* a key's key group is ``pmod(xxhash64(key columns), K)``, computed in Spark; K is fixed when a
  checkpoint is created, so a key never changes key group;
* a routing table maps every key group in ``[0, K)`` to exactly one lane in ``[0, n)``;
* lane ``i`` is Spark shuffle partition ``i``: the runtime shuffles on a *routing value* chosen so
  that Spark's ``HashPartitioning`` (Murmur3, seed 42, ``pmod`` n) sends it to partition ``i``.
  Shuffling on the lane number itself would not do that: Murmur3 of 0..n-1 collides.

Rebalancing, relocation and rescaling only ever produce a new :class:`RoutingTable`; the runtime
never needs code changes to move a key group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

_M32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
SPARK_HASH_SEED = 42


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _M32
    k1 = _rotl(k1, 15)
    return (k1 * _C2) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1


def spark_hash_long(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash()`` of a LongType value (``Murmur3_x86_32.hashLong``), as a signed int32.

    >>> spark_hash_long(0)
    -1670924195
    """
    value &= 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(value & _M32))
    h1 = _mix_h1(h1, _mix_k1(value >> 32))
    h = _fmix(h1, 8)
    return h - (1 << 32) if h & 0x80000000 else h


def spark_partition_of(value: int, partitions: int) -> int:
    """The shuffle partition Spark's ``repartition(partitions, col)`` gives a long ``value``."""
    return spark_hash_long(value) % partitions  # Python's % is already pmod


@lru_cache(maxsize=64)
def route_values(partitions: int) -> tuple[int, ...]:
    """For each lane ``i < partitions``, the smallest long that Spark shuffles to partition ``i``."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    found: dict[int, int] = {}
    candidate = 0
    while len(found) < partitions:
        found.setdefault(spark_partition_of(candidate, partitions), candidate)
        candidate += 1
    return tuple(found[i] for i in range(partitions))


@dataclass(frozen=True)
class RoutingTable:
    """Key group → lane for one stateful step; ``version`` grows with every change.

    ``spread`` holds the key groups split by SPREADFIRE: ``spread[g]`` lists the lanes of the
    group's extra fragments. Fragment ``f`` of group ``g`` has the *virtual* key group id
    ``g + K * f`` (fragment 0 is ``g`` itself, at ``assignment[g]``), so its state is stored and
    relocated like any other key group's.
    """

    lanes: int
    assignment: tuple[int, ...]  # assignment[kg] = lane
    version: int = 0
    spread: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lanes <= 0:
            raise ValueError(f"lanes must be positive, got {self.lanes}")
        if not self.assignment:
            raise ValueError("a routing table needs at least one key group")
        # (checked on every epoch's plan: the list of culprits only when there are some)
        if min(self.assignment) < 0 or max(self.assignment) >= self.lanes:
            bad = [kg for kg, lane in enumerate(self.assignment) if not 0 <= lane < self.lanes]
            raise ValueError(f"key groups {bad[:5]} are routed outside lanes [0, {self.lanes})")
        for kg, extra in self.spread.items():
            if not 0 <= kg < len(self.assignment) or not extra or any(not 0 <= x < self.lanes for x in extra):
                raise ValueError(f"spread key group {kg}: fragments {list(extra)} must name lanes in [0, {self.lanes})")

    def __hash__(self) -> int:
        return hash((self.lanes, self.assignment, self.version, tuple(sorted(self.spread.items()))))

    @property
    def key_groups(self) -> int:
        return len(self.assignment)

    @property
    def fragments(self) -> int:
        """Fragments of the most split key group (1 when nothing is spread)."""
        return 1 + max((len(x) for x in self.spread.values()), default=0)

    @classmethod
    def uniform(cls, key_groups: int, lanes: int, version: int = 0) -> RoutingTable:
        """Contiguous ranges of key groups per lane, sizes differing by at most one (like Flink)."""
        if key_groups <= 0 or lanes <= 0:
            raise ValueError(f"need key_groups > 0 and lanes > 0, got {key_groups}, {lanes}")
        return cls(lanes, tuple(kg * lanes // key_groups for kg in range(key_groups)), version)

    def key_groups_of(self, lane: int) -> list[int]:
        return [kg for kg, owner in enumerate(self.assignment) if owner == lane]

    def lane_of(self, virtual_kg: int) -> int:
        """The lane holding a (possibly virtual) key group; fragments that no longer exist in the
        table (the group was merged back) fall back to fragment 0's lane."""
        kg, frag = virtual_kg % self.key_groups, virtual_kg // self.key_groups
        extra = self.spread.get(kg, ())
        return extra[frag - 1] if 0 < frag <= len(extra) else self.assignment[kg]

    def owners(self) -> np.ndarray:
        """Lane of every virtual key group id ``0 .. K * fragments - 1``."""
        k = self.key_groups
        out = np.tile(np.asarray(self.assignment, dtype=np.int64), self.fragments)
        for kg, extra in self.spread.items():
            for f, lane in enumerate(extra, start=1):
                out[kg + k * f] = lane
        return out

    def route_values(self) -> list[int]:
        """Per virtual key group, the value to shuffle on so the group lands in its lane's partition."""
        values = route_values(self.lanes)
        return [values[lane] for lane in self.owners()]

    def moved(self, moves: dict[int, int]) -> RoutingTable:
        """A new version with ``moves`` (key group → new lane) applied."""
        assignment = list(self.assignment)
        for kg, lane in moves.items():
            assignment[kg] = lane
        return RoutingTable(self.lanes, tuple(assignment), self.version + 1, dict(self.spread))

    def with_spread(self, spread: Mapping[int, tuple[int, ...]]) -> RoutingTable:
        return RoutingTable(self.lanes, self.assignment, self.version + 1, {int(k): tuple(v) for k, v in spread.items()})

    def rescaled(self, lanes: int, assignment: Sequence[int]) -> RoutingTable:
        """A new version on ``lanes`` lanes; spread fragments on lanes that went away fold onto
        the remaining lanes (two fragments may then share a lane, which is still correct)."""
        spread = {kg: tuple(x % lanes for x in extra) for kg, extra in self.spread.items()}
        return RoutingTable(lanes, tuple(int(x) for x in assignment), self.version + 1, spread)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"lanes": self.lanes, "version": self.version, "assignment": list(self.assignment)}
        if self.spread:
            out["spread"] = {str(k): list(v) for k, v in sorted(self.spread.items())}
        return out

    @classmethod
    def from_json(cls, data: dict[str, object]) -> RoutingTable:
        assignment = data["assignment"]
        assert isinstance(assignment, Sequence)
        spread = data.get("spread") or {}
        assert isinstance(spread, Mapping)
        return cls(
            int(data["lanes"]),  # type: ignore[arg-type]
            tuple(map(int, assignment)),
            int(data["version"]),  # type: ignore[arg-type]
            {int(k): tuple(int(x) for x in v) for k, v in spread.items()},
        )


def key_group_counts(table: Any, keys: Sequence[str], key_groups: int) -> np.ndarray | None:
    """Rows per key group of ``table``, with the key group the epoch will compute in Spark
    (``pmod(xxhash64(keys), K)``) reproduced in numpy. Only for BIGINT (int64) key columns, whose
    hash :func:`~eddyline.hashing.spark_xxhash64` mirrors exactly; None for other types."""
    import pyarrow as pa

    from eddyline.hashing import spark_xxhash64

    if not keys or any(not pa.types.is_int64(table.schema.field(k).type) for k in keys):
        return None
    if table.num_rows == 0:
        return np.zeros(key_groups, dtype=np.int64)
    # hash each distinct key once (a hash table pass), not every row
    counts = table.select(list(keys)).group_by(list(keys), use_threads=False).aggregate([([], "count_all")])
    kg = np.mod(spark_xxhash64(*[counts.column(k) for k in keys]), key_groups)  # numpy mod = pmod
    return np.bincount(kg, weights=counts.column("count_all").to_numpy(), minlength=key_groups).astype(np.int64)


def key_groups_of(table: Any, keys: Sequence[str], key_groups: int) -> np.ndarray:
    """Each row's key group, as :func:`key_group_sql` has Spark compute it, in numpy (int32): for
    BIGINT, TIMESTAMP and STRING key columns (``TypeError`` for others); 0 for every row without keys."""
    import pyarrow as pa

    from eddyline.hashing import spark_xxhash64_of_columns

    if not keys:
        return np.zeros(table.num_rows, dtype=np.int32)
    for k in keys:  # (the lanes' key columns; the hash itself takes more types, for shedding)
        t = table.schema.field(k).type
        if not (pa.types.is_int64(t) or pa.types.is_timestamp(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise TypeError(f"Spark's xxhash64 of {t} is not reproduced here (BIGINT, TIMESTAMP and STRING are)")
    return np.mod(spark_xxhash64_of_columns(*[table.column(k) for k in keys]), key_groups).astype(np.int32)


def key_group_sql(keys: tuple[str, ...], key_groups: int) -> str:
    """Spark SQL for a row's key group, ``pmod(xxhash64(keys), K)``; a step without keys (a
    global window) has one key group. :func:`key_group_counts` computes the same in numpy."""
    if not keys:
        return "CAST(0 AS INT)"
    cols = ", ".join(f"`{k}`" for k in keys)
    return f"CAST(pmod(xxhash64({cols}), {key_groups}) AS INT)"
