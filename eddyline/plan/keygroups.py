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

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

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
    """Key group → lane for one stateful step; ``version`` grows with every change."""

    lanes: int
    assignment: tuple[int, ...]  # assignment[kg] = lane
    version: int = 0

    def __post_init__(self) -> None:
        if self.lanes <= 0:
            raise ValueError(f"lanes must be positive, got {self.lanes}")
        if not self.assignment:
            raise ValueError("a routing table needs at least one key group")
        bad = [kg for kg, lane in enumerate(self.assignment) if not 0 <= lane < self.lanes]
        if bad:
            raise ValueError(f"key groups {bad[:5]} are routed outside lanes [0, {self.lanes})")

    @property
    def key_groups(self) -> int:
        return len(self.assignment)

    @classmethod
    def uniform(cls, key_groups: int, lanes: int, version: int = 0) -> RoutingTable:
        """Contiguous ranges of key groups per lane, sizes differing by at most one (like Flink)."""
        if key_groups <= 0 or lanes <= 0:
            raise ValueError(f"need key_groups > 0 and lanes > 0, got {key_groups}, {lanes}")
        return cls(lanes, tuple(kg * lanes // key_groups for kg in range(key_groups)), version)

    def key_groups_of(self, lane: int) -> list[int]:
        return [kg for kg, owner in enumerate(self.assignment) if owner == lane]

    def route_values(self) -> list[int]:
        """Per key group, the value to shuffle on so the group lands in its lane's partition."""
        values = route_values(self.lanes)
        return [values[lane] for lane in self.assignment]

    def moved(self, moves: dict[int, int]) -> RoutingTable:
        """A new version with ``moves`` (key group → new lane) applied."""
        assignment = list(self.assignment)
        for kg, lane in moves.items():
            assignment[kg] = lane
        return RoutingTable(self.lanes, tuple(assignment), self.version + 1)

    def to_json(self) -> dict[str, object]:
        return {"lanes": self.lanes, "version": self.version, "assignment": list(self.assignment)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> RoutingTable:
        assignment = data["assignment"]
        assert isinstance(assignment, Sequence)
        return cls(int(data["lanes"]), tuple(int(x) for x in assignment), int(data["version"]))  # type: ignore[arg-type]
