"""Versioned key-group state under the checkpoint location.

Layout: one Arrow IPC file per (step, epoch, lane) at
``<root>/state/<step>/<epoch:010d>-<lane:04d>.arrow`` (on an object store, under a lease:
``…-<lane:04d>-g<generation>.arrow``, see :func:`state_file`). It holds, sorted by key group, one
*segment* per key group the lane changed in that epoch: either a **snapshot** (every row of the
group) or a **delta** (upserted rows, and deleted primary keys marked ``_op = 1``).

Which segments make up a key group's state is *metadata*, not a directory listing: a **chain**
``[snapshot, delta, delta, ...]`` per key group, kept in the epoch commit (the state index). So:

* loading key group ``g`` at any committed version = its snapshot + its deltas, from whichever
  lanes wrote them. Any lane can load any key group: relocation is a routing change;
* a retried task or a replayed epoch rewrites the same file with the same bytes;
* files of uncommitted epochs are never referenced and are removed by :meth:`cleanup`.

A process-wide cache keeps materialised key groups keyed by their chain tip, bounded by a byte
budget; what does not fit is dropped and reloaded from files (the state stays on disk).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from eddyline.columns import KG, OP
from eddyline.storage import Gate, filesystem, is_s3, makedirs, read_bytes

SNAPSHOT, DELTA = "s", "d"

#: [epoch, lane, kind, row offset, row count]
Segment = list
Chain = list
StateIndex = dict  # key group -> Chain




class StateCache:
    """LRU of materialised key groups, bounded in bytes (the lane's memory budget). Thread-safe:
    a worker may warm it in the background (see ``lanes.warm_other_lanes``) while a task runs."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.used = 0
        self._entries: OrderedDict[tuple[str, str, int], tuple[tuple, pa.Table]] = OrderedDict()
        self.hits = self.misses = self.evictions = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, int], tip: tuple) -> pa.Table | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != tip:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: tuple[str, str, int], tip: tuple, table: pa.Table) -> None:
        if self.budget <= 0:  # holds nothing (a resident lane keeps its state itself): not even a
            return            # table's size is worth working out, a slice's costs a walk of its buffers
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.used -= old[1].nbytes
            size = table.nbytes
            if size > self.budget:
                return
            self._entries[key] = (tip, table)
            self.used += size
            self._evict()

    def _evict(self) -> None:
        while self.used > self.budget and self._entries:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used -= evicted.nbytes
            self.evictions += 1

    def resize(self, budget_bytes: int) -> None:
        """Set the budget, evicting the least recently used groups beyond it."""
        with self._lock:
            self.budget = budget_bytes
            self._evict()

    def resident_bytes(self, root: str, step: str, key_groups: Iterable[int]) -> int:
        """Bytes of these key groups' state held in memory (the rest is on disk only)."""
        total = 0
        with self._lock:
            for kg in key_groups:
                entry = self._entries.get((root, step, kg))
                if entry is not None:
                    total += entry[1].nbytes
        return total


#: One cache per Python worker process; Spark reuses workers across tasks and epochs.
DEFAULT_CACHE_BYTES = int(os.environ.get("EDDYLINE_STATE_CACHE_BYTES", str(512 << 20)))
_CACHE = StateCache(DEFAULT_CACHE_BYTES)


def process_cache() -> StateCache:
    return _CACHE


@dataclass
class WriteResult:
    chains: dict[int, Chain | None]  # None: the key group has no state any more
    bytes_written: int
    snapshots: int
    deltas: int


#: a state file's id (a chain segment's second field): the lane's file in the low bits, the lease
#: generation that wrote it above them (0 on a file system)
_GENERATION_SHIFT = 32


def state_file(base: str, step: str, epoch: int, lane: int) -> str:
    """The file a lane wrote its changes of ``step`` to in ``epoch``, under checkpoint path ``base``.
    ``lane`` is the file's id: with a generation in it (:func:`generation_file_id`) the name says
    which generation wrote it."""
    generation, lane = lane >> _GENERATION_SHIFT, lane & ((1 << _GENERATION_SHIFT) - 1)
    return f"{base}/state/{step}/{epoch:010d}-{lane:04d}{f'-g{generation}' if generation else ''}.arrow"


def generation_file_id(lane: int, generation: int) -> int:
    """The id of a state file that lease generation ``generation`` writes on an object store. A
    store cannot refuse an older generation's write there as a gate on a file system does, so a
    driver frozen past its lease and woken must not write under the names the newer one writes:
    each generation writes its own files, and a commit (which the store does refuse) names the
    ones it reads, so a former holder's files are never read."""
    return lane | (generation << _GENERATION_SHIFT)


def parse_state_file(name: str) -> tuple[int, int] | None:
    """A state file's (epoch, id) from its name (None: not a state file)."""
    stem = name.removesuffix(".arrow")
    epoch_s, _, rest = stem.partition("-")
    lane_s, _, gen_s = rest.partition("-g")
    if not (name.endswith(".arrow") and epoch_s.isdigit() and lane_s.isdigit() and (gen_s.isdigit() or not gen_s)):
        return None
    return int(epoch_s), generation_file_id(int(lane_s), int(gen_s or 0))


def referenced_files(index: Mapping[int, Chain]) -> set[tuple[int, int]]:
    """The (epoch, lane) files the chains of ``index`` read."""
    return {(seg[0], seg[1]) for chain in index.values() for seg in chain}


def history_floor(
    root: str, commits: Sequence[tuple[int, Mapping[str, Mapping[int, Chain]]]], keep_from: int, cap: int
) -> int:
    """The first epoch to keep, ``keep_from`` or later, such that the state files that only the
    kept commits before the newest read take at most ``cap`` bytes. ``commits``: (epoch, the
    state index per step); the newest two commits are always kept."""
    if len(commits) < 3:
        return keep_from
    fs, base = filesystem(root)
    sizes: dict[tuple[str, int, int], int] = {}
    for step in sorted({s for _, indexes in commits for s in indexes}):
        for info in fs.get_file_info(pafs.FileSelector(f"{base}/state/{step}", allow_not_found=True)):
            if (key := parse_state_file(info.base_name)) is not None:
                sizes[(step, *key)] = info.size or 0
    ordered = sorted(commits, key=lambda c: c[0])

    def files(of: Sequence[tuple[int, Mapping[str, Mapping[int, Chain]]]]) -> set[tuple[str, int, int]]:
        return {(s, *f) for _, indexes in of for s, index in indexes.items() for f in referenced_files(index)}

    newest = files(ordered[-1:])
    for i, (epoch, _) in enumerate(ordered[:-2]):
        if epoch >= keep_from and sum(sizes.get(f, 0) for f in files(ordered[i:-1]) - newest) <= cap:
            return epoch
    return max(keep_from, ordered[-2][0])


def copy_state(root: str, source: str, target: str, index: Mapping[int, Chain]) -> int:
    """Give step ``target`` the state of step ``source`` at ``index``: copy the files its chains
    read (same names, so ``index`` reads the same from either step). Files already there are
    kept (a driver that died halfway copies the rest). Returns the files copied."""
    fs, base = filesystem(root)
    makedirs(fs, f"{base}/state/{target}")
    copied = 0
    for epoch, lane in sorted(referenced_files(index)):
        dst = state_file(base, target, epoch, lane)
        if fs.get_file_info(dst).type != pafs.FileType.NotFound:
            continue
        tmp = f"{dst}.tmp-{os.getpid()}"
        fs.copy_file(state_file(base, source, epoch, lane), tmp)
        fs.move(tmp, dst)
        copied += 1
    return copied


def state_steps(root: str) -> list[str]:
    """The steps that have state under checkpoint ``root``."""
    fs, base = filesystem(root)
    infos = fs.get_file_info(pafs.FileSelector(f"{base}/state", allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def drop_state(root: str, step: str) -> None:
    """Delete every state file of ``step``."""
    fs, base = filesystem(root)
    fs.delete_dir(f"{base}/state/{step}")


class GroupedRows(Protocol):
    """A lane's state that is not one table (:class:`eddyline.state.inplace.InPlaceState`)."""

    def group_counts(self) -> np.ndarray:
        """Rows per key group (index = key group)."""
        ...

    def group_rows(self, groups: np.ndarray) -> pa.Table:
        """The rows of ``groups``."""
        ...


class KeyGroupStore:
    """State of one stateful step. Pure Python + pyarrow; used inside Spark tasks."""

    def __init__(
        self,
        root: str,
        step: str,
        schema: pa.Schema,
        primary_key: Sequence[str],
        *,
        snapshot_every: int = 8,
        cache: StateCache | None = None,
        gate: Gate | None = None,
    ):
        """``gate``: what the files are written through (the checkpoint's, for the driver's lease
        generation: :class:`~eddyline.storage.Gate`); None: generation 0, no lease."""
        if KG not in schema.names or KG not in primary_key:
            raise ValueError(f"state of step {step!r} needs a {KG} column in its primary key")
        self.fs, self.base = filesystem(root)
        self.dir = f"{self.base}/state/{step}"
        self.step = step
        self.root = root
        self.schema = schema
        self.primary_key = list(primary_key)
        self.snapshot_every = snapshot_every
        self.cache = cache if cache is not None else _CACHE
        self.file_schema = schema.append(pa.field(OP, pa.int8()))
        self.gate = gate if gate is not None else Gate(root)

    # ------------------------------------------------------------------ reading
    def path(self, epoch: int, lane: int) -> str:
        return state_file(self.base, self.step, epoch, lane)

    def _read_file(self, epoch: int, lane: int, opened: dict[tuple[int, int], pa.Table]) -> pa.Table:
        key = (epoch, lane)
        if key not in opened:
            path = self.path(epoch, lane)
            if isinstance(self.fs, pafs.LocalFileSystem):
                source = pa.memory_map(path)
            else:  # the whole file in one request: it is read whole anyway
                source = pa.BufferReader(read_bytes(self.fs, path))
            opened[key] = pa.ipc.open_file(source).read_all()
        return opened[key]

    def load(self, index: Mapping[int, Chain], key_groups: Iterable[int]) -> pa.Table:
        """The state rows of ``key_groups`` (with ``_kg``), as of the version ``index`` names."""
        parts = []
        missing: dict[int, Chain] = {}
        for kg in key_groups:
            chain = index.get(kg)
            if not chain:
                continue
            table = self.cache.get((self.root, self.step, kg), tuple(chain[-1]))
            if table is None:
                missing[kg] = chain
            else:
                parts.append(table)
        if missing:
            loaded = self._materialise(missing)
            starts, counts = _ranges(_kgs(loaded), np.fromiter(missing, dtype=np.int64))
            for (kg, chain), lo, n in zip(missing.items(), starts.tolist(), counts.tolist(), strict=True):
                table = loaded.slice(lo, n)
                self.cache.put((self.root, self.step, kg), tuple(chain[-1]), table)
                parts.append(table)
        if not parts:
            return self.schema.empty_table()
        return pa.concat_tables(parts)

    def _materialise(self, chains: Mapping[int, Chain]) -> pa.Table:
        """Build many key groups at once, sorted by ``_kg``: all snapshots, then the deltas one
        epoch at a time. Groups never touch each other's rows (``_kg`` is in the primary key), so
        one join per delta epoch replaces one join per group and delta."""
        opened: dict[tuple[int, int], pa.Table] = {}
        snapshots: list[pa.Table] = []
        layers: dict[int, list[pa.Table]] = {}
        for chain in chains.values():
            epoch, lane, kind, offset, length = chain[0]
            if kind != SNAPSHOT:
                raise ValueError(f"step {self.step!r}: a state chain must start with a snapshot, got {chain[0]}")
            snapshots.append(self._read_file(epoch, lane, opened).slice(offset, length))
            for epoch, lane, kind, offset, length in chain[1:]:
                if kind != DELTA:
                    raise ValueError(f"step {self.step!r}: only deltas may follow a chain's snapshot, got {chain}")
                layers.setdefault(epoch, []).append(self._read_file(epoch, lane, opened).slice(offset, length))
        current = pa.concat_tables(snapshots).drop_columns([OP])
        for epoch in sorted(layers):
            current = apply_delta(current, pa.concat_tables(layers[epoch]), self.primary_key)
        return _sorted_by_kg(current.select(self.schema.names).cast(self.schema))

    # ------------------------------------------------------------------ writing
    def write(
        self,
        epoch: int,
        lane: int,
        index: Mapping[int, Chain],
        new_state: pa.Table | GroupedRows,
        upserts: pa.Table,
        deletes: pa.Table,
        changed_key_groups: Iterable[int],
    ) -> WriteResult:
        """Persist the changes of one lane in one epoch; returns the new chains of changed groups.

        ``new_state`` is the lane's full state after the epoch (a table, or the rows a resident
        lane holds in place, asked only for the groups written whole); ``upserts`` / ``deletes``
        are what changed. A group gets a snapshot when it has none yet, when its chain is long,
        or when the delta would be at least half the snapshot's size; otherwise a delta.
        """
        if is_s3(self.fs) and self.gate.generation:
            lane = generation_file_id(lane, self.gate.generation)
        # The cache keeps a group's rows as a slice of the new state sorted by group; without a
        # cache nothing needs the whole state sorted (only the rows written are), and sorting it
        # would make every epoch cost the lane's whole state.
        caching = self.cache.budget > 0
        grouped = not isinstance(new_state, pa.Table)
        if grouped and caching:
            raise ValueError(f"step {self.step!r}: a store with a cache takes the new state as a table")
        if not grouped:
            new_state = new_state.cast(self.schema)
            if caching:
                new_state = _sorted_by_kg(new_state)
        upserts = _sorted_by_kg(upserts.cast(self.schema))
        deletes = _sorted_by_kg(deletes.select(self.primary_key))
        groups = np.array(sorted(set(changed_key_groups)), dtype=np.int64)
        ups_kg, dels_kg = _kgs(upserts), _kgs(deletes)
        if grouped:
            counts = new_state.group_counts()
            full_n = np.zeros(groups.size, np.int64)
            inside = groups < counts.size
            full_n[inside] = counts[groups[inside]]
        else:
            full_kg = _kgs(new_state)
            if caching:
                full_at, full_n = _ranges(full_kg, groups)
            else:
                full_n = np.bincount(full_kg, minlength=int(groups.max(initial=-1)) + 1)[groups]
        _, ups_n = _ranges(ups_kg, groups)
        _, dels_n = _ranges(dels_kg, groups)
        chain_len = np.array([len(index.get(int(kg)) or []) for kg in groups], dtype=np.int64)
        # A delta costs a join when it is loaded cold (another worker process, a restart, a
        # relocated key group); it pays off only when it is much smaller than the snapshot.
        # Groups born in the same epoch would reach the chain limit together, every one of them
        # written whole in that one epoch (its slowest). So a group also takes its snapshot in
        # the epochs of its own phase ((epoch + kg) mod snapshot_every = 0): the snapshots of a
        # lane's groups spread evenly over the epochs, and a chain is never longer than before.
        phase = (epoch + groups) % self.snapshot_every == 0
        snapshot = (chain_len == 0) | (chain_len >= self.snapshot_every) | phase | (2 * (ups_n + dels_n) >= full_n)
        live = full_n > 0
        # One table for the lane's file, each group's rows contiguous: a snapshot's rows, or a
        # delta's upserts then deletes (the concatenation order, kept by a stable sort on _kg).
        whole = groups[live & snapshot]
        parts = [
            _with_op(new_state.group_rows(whole).cast(self.schema) if grouped
                     else new_state.filter(pa.array(np.isin(full_kg, whole))), 0, self.file_schema),
            _with_op(upserts.filter(pa.array(np.isin(ups_kg, groups[live & ~snapshot]))), 0, self.file_schema),
            _with_op(deletes.filter(pa.array(np.isin(dels_kg, groups[live & ~snapshot]))), 1, self.file_schema),
        ]
        table = _sorted_by_kg(pa.concat_tables(parts))
        offsets, rows = _ranges(_kgs(table), groups)
        chains: dict[int, Chain | None] = {}
        for i, kg in enumerate(groups.tolist()):
            if not live[i]:
                chains[kg] = None
                tip: tuple = ("empty", epoch)
            else:
                entry = [epoch, lane, SNAPSHOT if snapshot[i] else DELTA, int(offsets[i]), int(rows[i])]
                chains[kg] = [entry] if snapshot[i] else [*(index.get(kg) or []), entry]
                tip = tuple(entry)
            if caching:
                self.cache.put((self.root, self.step, kg), tip, new_state.slice(int(full_at[i]), int(full_n[i])))
        snapshots, deltas = int((live & snapshot).sum()), int((live & ~snapshot).sum())
        written = 0
        if table.num_rows:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_file(sink, self.file_schema) as writer:
                writer.write_table(table)
            data = sink.getvalue().to_pybytes()
            makedirs(self.fs, self.dir)
            self.gate.put(self.path(epoch, lane), data)
            written = len(data)
        return WriteResult(chains, written, snapshots, deltas)

    # ------------------------------------------------------------------ retention
    def cleanup(self, live_indexes: Iterable[Mapping[int, Chain]], below_epoch: int) -> int:
        """Delete files older than ``below_epoch`` that no chain in ``live_indexes`` uses."""
        live = {f for index in live_indexes for f in referenced_files(index)}
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        except FileNotFoundError:
            return 0
        removed = 0
        for info in infos:
            key = parse_state_file(info.base_name)
            if key is not None and key[0] < below_epoch and key not in live:
                self.fs.delete_file(info.path)
                removed += 1
        return removed


def with_chains(index: Mapping[int, Chain], chains: Mapping[str, Chain | None]) -> StateIndex:
    """``index`` after a lane's new ``chains`` (a manifest's, keyed by the group as a string;
    None: the group's state is now empty)."""
    out = dict(index)
    for kg, chain in chains.items():
        if chain is None:
            out.pop(int(kg), None)
        else:
            out[int(kg)] = chain
    return out


def _sorted_by_kg(table: pa.Table) -> pa.Table:
    if table.num_rows < 2:
        return table
    kg = table.column(KG).to_numpy()
    if np.all(kg[:-1] <= kg[1:]):
        return table
    return table.take(pa.array(np.argsort(kg, kind="stable")))


def _kgs(table: pa.Table) -> np.ndarray:
    return table.column(KG).to_numpy(zero_copy_only=False) if table.num_rows else np.zeros(0, dtype=np.int32)


def _ranges(sorted_kg: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``groups`` starts in a ``_kg`` column sorted ascending, and how many rows."""
    lo = np.searchsorted(sorted_kg, groups, "left")
    return lo, np.searchsorted(sorted_kg, groups, "right") - lo


def _with_op(table: pa.Table, op: int, file_schema: pa.Schema) -> pa.Table:
    cols = []
    for f in file_schema:
        if f.name == OP:
            cols.append(pa.array(np.full(table.num_rows, op, dtype=np.int8)))
        elif f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=file_schema)


def _with_null_surrogates(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, list[str]]:
    """Add, per key, a null-filled copy and an is-null flag: Arrow's hash join never matches
    nulls, but a state key may legitimately be null (e.g. a null grouping key)."""
    out, join_keys = table, []
    for k in keys:
        col = table.column(k)
        filler = pa.scalar("" if pa.types.is_string(col.type) else 0).cast(col.type)
        out = out.append_column(f"__nn_{k}", pc.fill_null(col, filler))
        out = out.append_column(f"__isnull_{k}", pc.is_null(col))
        join_keys += [f"__nn_{k}", f"__isnull_{k}"]
    return out, join_keys


def merged_changes(
    first: tuple[pa.Table, pa.Table], then: tuple[pa.Table, pa.Table], schema: pa.Schema, primary_key: Sequence[str]
) -> tuple[pa.Table, pa.Table]:
    """Two successive changes of one state, each ``(upserts, deletes)``, as one: the first's
    upserts as the second left them, plus the second's, and every deleted key. A delta's deletes
    and upserts apply together (:func:`apply_delta`), so a key deleted and then upserted again may
    be named by both, and a key upserted and then deleted is a delete."""
    (ups1, dels1), (ups2, dels2) = first, then
    if not (ups2.num_rows or dels2.num_rows):
        return first
    if not (ups1.num_rows or dels1.num_rows):
        return then
    keys = list(primary_key)
    file_schema = schema.append(pa.field(OP, pa.int8()))
    second = pa.concat_tables([_with_op(ups2, 0, file_schema), _with_op(dels2.select(keys), 1, file_schema)])
    upserts = apply_delta(ups1.select(schema.names).cast(schema), second, keys)
    key_schema = pa.schema([schema.field(k) for k in keys])
    deletes = pa.concat_tables([dels1.select(keys).cast(key_schema), dels2.select(keys).cast(key_schema)])
    return upserts, deletes


def apply_delta(current: pa.Table, delta: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """``current`` without the keys ``delta`` names, plus the delta's upserted rows."""
    if delta.num_rows == 0:
        return current
    keys = list(primary_key)
    touched = delta.select(keys)
    if any(current.column(k).null_count or touched.column(k).null_count for k in keys):
        cur, join_keys = _with_null_surrogates(current, keys)
        tch, _ = _with_null_surrogates(touched, keys)
        kept = cur.join(tch.select(join_keys), keys=join_keys, join_type="left anti")
    else:
        kept = current.join(touched, keys=keys, join_type="left anti")
    upserted = delta.filter(pc.equal(delta.column(OP), 0)).drop_columns([OP])
    return pa.concat_tables(
        [kept.select(current.column_names).cast(current.schema), upserted.select(current.column_names).cast(current.schema)]
    )
