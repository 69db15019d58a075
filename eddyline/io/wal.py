"""A write-ahead log of messages in segment files: what upstream backup keeps, in the checkpoint,
of an input that cannot replay (the ``nats_core`` source, :mod:`eddyline.io.corenats`). Plain
files and the standard library; no Spark.

Layout of one log's directory::

    LOCK                              held (flock) by the one process that appends
    00000000000000000001.wal          segments, named by the number of their first record
    00000000000000004711.wal          ... the last one is the one appended to

Records are numbered 1, 2, 3, ... across segments, and a number never changes: it is the
offset the source logs in its plans. A segment is a sequence of blocks; one :meth:`append`
writes one block and fsyncs it before the records count, so a batch of messages costs one
fsync (group commit). A block is, little-endian::

    b"EWL1" | records: u32 | body bytes: u32 | CRC-32 of the body: u32 | body
    body = one u32 length per record, then the records' bytes one after another

The **durable end** (:attr:`WriteAheadLog.end`) is the number of the last record whose block was
fsync'd: only records up to it may be planned and read. A process that dies mid-append leaves a
torn block at the end of the last segment (short, or with a CRC that does not match); reopening
the log truncates it away, and with it only records that never counted. Readers (Spark tasks,
:func:`read_range`) never look past the end they were given, so they never meet a block being
written.

The log is **bounded**: it holds at most ``max_bytes`` on disk. When a batch does not fit, the
records that do not fit are dropped (a publisher of core NATS cannot be pushed back) and counted
in :attr:`WriteAheadLog.dropped`. A new segment is started once the last one reaches
``segment_bytes``; :meth:`WriteAheadLog.truncate_before` deletes the segments whose records are
all consumed (committed), which is what makes room again. The last segment is never deleted, so
the numbering continues after a restart even when everything was consumed.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from eddyline.errors import EddylineError

MAGIC = b"EWL1"
_HEADER = struct.Struct("<4sIII")
HEADER_BYTES = _HEADER.size  # 16
SUFFIX = ".wal"


class WalError(EddylineError):
    """The log cannot be opened, written or read as asked (locked, damaged, records missing)."""


class WalLocked(WalError):
    """Another process holds the log's lock."""


def segment_name(first: int) -> str:
    return f"{first:020d}{SUFFIX}"


def segments(directory: str) -> list[tuple[int, str]]:
    """The log's segments as (number of the first record, path), in order."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = sorted(int(n[: -len(SUFFIX)]) for n in names if n.endswith(SUFFIX) and n[: -len(SUFFIX)].isdigit())
    return [(first, os.path.join(directory, segment_name(first))) for first in found]


def _blocks(f: BinaryIO, read_body: bool) -> Iterator[tuple[int, int, int, bytes | None]]:
    """(byte offset, records, block bytes, body) of each complete block of an open segment, in
    order, up to the first torn one (short, or not a block). With ``read_body`` the body is read
    and a block whose CRC does not match ends the blocks too; without, the body is None."""
    size = os.fstat(f.fileno()).st_size
    pos = 0
    while pos + HEADER_BYTES <= size:
        f.seek(pos)
        magic, count, body_len, crc = _HEADER.unpack(f.read(HEADER_BYTES))
        if magic != MAGIC or pos + HEADER_BYTES + body_len > size or body_len < 4 * count:
            return
        body = None
        if read_body:
            body = f.read(body_len)
            if zlib.crc32(body) != crc:
                return
        yield pos, count, HEADER_BYTES + body_len, body
        pos += HEADER_BYTES + body_len


def _valid_length(path: str) -> tuple[int, int]:
    """(records, bytes) of the intact blocks at the start of a segment."""
    records = length = 0
    with open(path, "rb") as f:
        for pos, count, nbytes, _ in _blocks(f, read_body=True):
            records, length = records + count, pos + nbytes
    return records, length


def scan(directory: str) -> tuple[int, int]:
    """(first record held, durable end) of a log, read-only (a torn last block is not counted):
    ``first > end`` when it holds no record. (1, 0) when there is no log."""
    segs = segments(directory)
    if not segs:
        return 1, 0
    last_first, last_path = segs[-1]
    records, _ = _valid_length(last_path)
    return segs[0][0], last_first + records - 1


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """The appending side of a log; one process at a time (it holds the directory's lock).

    ``after``: records up to this number are consumed already (the source's committed offset).
    A new log numbers its first record ``after + 1``; an existing one must hold every record
    after it, else it was removed or replaced and :class:`WalError` says so. ``lock_wait_s``:
    how long to wait for another process's lock before :class:`WalLocked`.

    :meth:`append` (a receiving thread) and :meth:`truncate_before` (the driver, after a
    commit) may be called from different threads."""

    def __init__(
        self, directory: str, *, max_bytes: int, segment_bytes: int, after: int = 0, lock_wait_s: float = 0.0
    ):
        if segment_bytes <= 0 or max_bytes < segment_bytes:
            raise WalError(f"{directory}: expected 0 < segment_bytes <= max_bytes, got {segment_bytes}, {max_bytes}")
        self.directory, self.max_bytes, self.segment_bytes = directory, max_bytes, segment_bytes
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = _take_lock(directory, lock_wait_s)
        try:
            self._open(after)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.dropped = 0  # records dropped because the log was full (since this process opened it)
        self.full_since: float | None = None  # time.time() when the last append dropped records
        self._mutex = threading.Lock()

    def _open(self, after: int) -> None:
        segs = segments(self.directory)
        if not segs:
            path = os.path.join(self.directory, segment_name(after + 1))
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            _fsync_dir(self.directory)
            segs = [(after + 1, path)]
        last_first, last_path = segs[-1]
        records, length = _valid_length(last_path)
        if length < os.path.getsize(last_path):  # a torn block: it never counted
            with open(last_path, "r+b") as f:
                f.truncate(length)
                os.fsync(f.fileno())
        self._firsts = [first for first, _ in segs]
        self._sizes = [os.path.getsize(path) for _, path in segs]
        self.end = last_first + records - 1
        if self.end < after:
            raise WalError(
                f"{self.directory}: the log ends at record {self.end} but {after} were committed: "
                "its segments were removed or replaced"
            )
        if self._firsts[0] > after + 1:
            raise WalError(
                f"{self.directory}: records {after + 1}-{self._firsts[0] - 1} are not in the log any more, "
                f"yet only {after} were committed"
            )
        self._fd = os.open(last_path, os.O_WRONLY | os.O_APPEND)

    # ------------------------------------------------------------------ facts
    @property
    def first(self) -> int:
        """The number of the first record still held (its segment's first)."""
        return self._firsts[0]

    @property
    def bytes(self) -> int:
        """Bytes on disk, all segments."""
        return sum(self._sizes)

    def segment_count(self) -> int:
        return len(self._firsts)

    # ------------------------------------------------------------------ writing
    def append(self, payloads: Sequence[bytes]) -> int:
        """Append ``payloads`` as one block and fsync it; they count (:attr:`end` moves) once it is
        on disk. Only as many as fit within ``max_bytes`` are appended, in order; the others are
        dropped and counted in :attr:`dropped`. Returns how many were appended."""
        with self._mutex:
            if self._sizes[-1] >= self.segment_bytes:
                self._roll()
            room = self.max_bytes - self.bytes - HEADER_BYTES
            take, body_len = 0, 0
            for p in payloads:
                if body_len + 4 + len(p) > room:
                    break
                body_len += 4 + len(p)
                take += 1
            dropped = len(payloads) - take
            if dropped:
                self.dropped += dropped
                self.full_since = self.full_since or time.time()
            else:
                self.full_since = None
            if not take:
                return 0
            kept = payloads[:take] if dropped else payloads
            body = struct.pack(f"<{take}I", *map(len, kept)) + b"".join(kept)
            block = _HEADER.pack(MAGIC, take, len(body), zlib.crc32(body)) + body
            view = memoryview(block)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
            self._sizes[-1] += len(block)
            self.end += take
            return take

    def _roll(self) -> None:
        """Start a new segment after the last record (made durable before it is used)."""
        first = self.end + 1
        path = os.path.join(self.directory, segment_name(first))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        _fsync_dir(self.directory)
        os.close(self._fd)
        self._fd = fd
        self._firsts.append(first)
        self._sizes.append(0)

    def truncate_before(self, consumed: int) -> int:
        """Delete the segments whose records are all numbered ``consumed`` or less (never the
        last segment). Returns how many were deleted."""
        with self._mutex:
            n = 0
            while len(self._firsts) > 1 and self._firsts[1] - 1 <= consumed:
                os.remove(os.path.join(self.directory, segment_name(self._firsts[0])))
                del self._firsts[0], self._sizes[0]
                n += 1
            return n

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)  # releases the lock

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _take_lock(directory: str, wait_s: float) -> int:
    path = os.path.join(directory, "LOCK")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise WalLocked(f"{directory}: the log is held by another process (pid {holder})") from None
            time.sleep(0.1)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


# ---------------------------------------------------------------------- reading
def read_range(directory: str, first: int, stop: int, chunk: int = 10_000) -> Iterator[tuple[list[int], list[bytes]]]:
    """Records numbered [``first``, ``stop``) as chunks of (numbers, payloads) of about ``chunk``
    records, in order. Every one of them must be in the log: a record that is missing (its
    segment deleted, or past the log's end) or a damaged block raises :class:`WalError`. Reads
    no block past the one holding record ``stop - 1``, so it can run while the log is appended."""
    if stop <= first:
        return
    segs = segments(directory)
    firsts = [f for f, _ in segs]
    i = bisect.bisect_right(firsts, first) - 1
    if i < 0:
        raise WalError(f"{directory}: record {first} is not in the log any more (it begins at {firsts[0] if firsts else '-'})")
    numbers: list[int] = []
    payloads: list[bytes] = []
    number = first
    for seg_first, path in segs[i:]:
        if number >= stop:
            break
        if seg_first > number:
            raise WalError(f"{directory}: records {number}-{seg_first - 1} are missing")
        at = seg_first  # the number of the next block's first record
        with open(path, "rb") as f:
            for pos, count, nbytes, _ in _blocks(f, read_body=False):
                if at + count <= number:  # wholly before what is asked: skipped unread
                    at += count
                    continue
                f.seek(pos)
                block = f.read(nbytes)
                magic, count, body_len, crc = _HEADER.unpack_from(block)
                body = memoryview(block)[HEADER_BYTES:]
                if zlib.crc32(body) != crc:
                    raise WalError(f"{path}: the block at byte {pos} is damaged (CRC mismatch)")
                lengths = struct.unpack_from(f"<{count}I", body)
                p = 4 * count
                for n, length in enumerate(lengths, at):
                    if number <= n < stop:
                        numbers.append(n)
                        payloads.append(bytes(body[p : p + length]))
                    p += length
                number = max(number, min(at + count, stop))
                at += count
                if len(numbers) >= chunk:
                    yield numbers, payloads
                    numbers, payloads = [], []
                if number >= stop:
                    break
    if numbers:
        yield numbers, payloads
    if number < stop:
        raise WalError(f"{directory}: records {number}-{stop - 1} are not in the log (it ends before them)")
