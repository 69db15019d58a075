"""The ``nats_core`` source: a core NATS subject (plain publish/subscribe, no JetStream), made
replayable by **upstream backup**: what the driver receives is kept in a write-ahead log in the
checkpoint until the epoch that read it commits.

Core NATS keeps nothing: a message goes to whoever is subscribed when it is published, and is
gone. So while the driver runs, a thread of its own (with its own connection) subscribes to
``subject`` and appends every batch of messages it receives to a write-ahead log
(:mod:`eddyline.io.wal`) under ``<checkpoint>/wal/<source>/``, fsync'd before the messages count.
From there the source is like any other:

* its **offsets** are record numbers in the log (1, 2, 3, ...); :meth:`available` is the log's
  durable end; an epoch's slice is a range of them, logged in the plan, and Spark's tasks read it
  from the log files themselves (split into sub-ranges, so every core reads) and decode the
  records exactly as the JetStream ``nats`` source does: one JSON object or CSV line per message,
  a record that does not fit becomes a dead letter with the source, the subject (as ``file``), its
  record number (as ``line``) and the reason;
* after each commit (:meth:`committed`) the log's segments whose records are all committed are
  deleted;
* a driver that is killed and restarted opens the log again (a torn last block, written when it
  died, is cut off: it never counted), replays the logged plan from it and goes on: every message
  that reached the log is read exactly once.

What it does **not** guarantee: a message published while no driver is subscribed (before the
first start, between a crash and the restart, while the connection is lost) is never received —
that is core NATS. Neither are messages the driver had received but not yet written to the log
when it died (at most one batch, milliseconds of traffic), nor those the server drops for a
subscriber that falls behind (it disconnects it; the reconnection shows in ``retries``).

The log is **bounded** by ``max_backlog`` (bytes on disk). When it is full — the epochs fall
behind the publishers for that long — new messages are dropped, since core NATS has no way to
push back: they are counted, and the progress shows the source's ``status`` as ``WAL full`` with
``wal_dropped``, ``wal_bytes``, ``wal_records`` (received, not yet committed) and
``max_backlog`` in every epoch. ``wal_dropped`` counts since the driver started.

A lost connection is retried with back-off and shown in the status; once the server has been
unreachable for ``wait``, the run stops with an error naming the source (the log keeps what it
has; the restart replays it). The log is written by one driver at a time (it holds a lock in the
log's directory), and needs a checkpoint on a local or mounted file system that Spark's executors
can read at the same path.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import Field, field_validator, model_validator

from eddyline.api.sources import SOURCES
from eddyline.api.units import ByteSize, Duration, Model, format_duration_ms
from eddyline.errors import SourceError
from eddyline.io.jetstream import MessageRanges, NatsUrl, SubRanges
from eddyline.io.natswire import NatsUnreachable, Subscription, redact
from eddyline.io.retry import FIRST_PAUSE_S, MAX_PAUSE_S, Health
from eddyline.io.sources import SourceKind
from eddyline.io.wal import WalError, WriteAheadLog, read_range
from eddyline.storage import filesystem

if TYPE_CHECKING:
    from eddyline.api.sources import SourceSpec

#: the most a receiving thread takes from its connection for one append (one fsync)
BATCH_BYTES = 4 << 20


class CoreNatsIn(Model):
    """A core NATS subject to receive: one record per message, JSON (or CSV) with a declared
    schema, kept in a write-ahead log in the checkpoint until its epoch commits."""

    url: NatsUrl = "nats://127.0.0.1:4222"
    subject: str = Field(min_length=1)  # wildcards allowed: orders.*, orders.>
    format: Literal["json", "csv"] = "json"
    schema_: str = Field(alias="schema", min_length=1)
    max_backlog: ByteSize = Field(default=256 << 20, gt=0)  # the log's bound on disk; beyond it messages are dropped
    segment_size: ByteSize = Field(default=8 << 20, gt=0)  # the log's files; a whole committed one is deleted
    wait: Duration = Field(default=30_000, gt=0)  # how long an unreachable server is retried

    @field_validator("subject")
    @classmethod
    def _subject(cls, v: str) -> str:
        tokens = v.split(".")
        if any(c.isspace() for c in v) or "" in tokens or any(
            ("*" in t and t != "*") or (">" in t and t != ">") for t in tokens
        ) or ">" in tokens[:-1]:
            raise ValueError(f"expected a NATS subject like 'orders.>' (tokens separated by dots; * or > alone), got {v!r}")
        return v

    @model_validator(mode="after")
    def _segments_fit(self) -> CoreNatsIn:
        if self.segment_size * 2 > self.max_backlog:
            raise ValueError(
                f"segment_size: expected at most half of max_backlog ({self.max_backlog} bytes), so that deleting "
                f"committed segments makes room, got {self.segment_size} bytes"
            )
        return self


class _Receiver(threading.Thread):
    """The driver's subscriber: receives batches of messages and appends each to the log."""

    def __init__(self, source: str, params: CoreNatsIn, wal: WriteAheadLog):
        super().__init__(name=f"eddyline-wal-{source}", daemon=True)
        self.source, self.params, self.wal = source, params, wal
        self.health = Health()
        self.subscribed = threading.Event()
        self.error: Exception | None = None  # why it stopped for good (a refusal, the disk)
        self.lost_since: float | None = None  # time.monotonic() when the connection was lost
        self.received = 0
        self._halt = threading.Event()

    def run(self) -> None:
        sub: Subscription | None = None
        pause = FIRST_PAUSE_S
        try:
            while not self._halt.is_set():
                try:
                    if sub is None:
                        sub = Subscription(self.params.url, self.params.subject, name=f"eddyline-{self.source}")
                        self.subscribed.set()
                        self.lost_since, pause = None, FIRST_PAUSE_S
                        if self.health.since is not None:
                            self.health.recovered()
                    payloads = sub.receive(0.1, BATCH_BYTES)
                except NatsUnreachable as e:
                    if sub is not None:
                        sub.close()
                        sub = None
                    self.subscribed.clear()
                    self.lost_since = self.lost_since or time.monotonic()
                    self.health.failing(e)
                    self._halt.wait(pause)
                    pause = min(pause * 2, MAX_PAUSE_S)
                    continue
                if payloads:
                    self.received += len(payloads)
                    self.wal.append(payloads)
        except Exception as e:  # a refusal (NatsError: permissions, subject), the disk (OSError):
            self.error = e  # never silently, the next plan raises it
        finally:
            self.subscribed.clear()
            if sub is not None:
                sub.close()

    def stop(self) -> None:
        self._halt.set()


class CoreNatsSource(MessageRanges):
    def __init__(self, spec: SourceSpec):
        super().__init__(spec)
        self.wal: WriteAheadLog | None = None
        self.receiver: _Receiver | None = None
        self.directory: str | None = None
        self._committed = 0

    @property
    def params(self) -> CoreNatsIn:
        return self.spec.params

    # ------------------------------------------------------------------ upstream backup
    def attach(self, checkpoint: str, committed: int) -> None:
        """Open (or create) the log in ``<checkpoint>/wal/<source>/`` and start receiving; returns
        once subscribed, or raises after ``wait``. Records after ``committed`` are kept."""
        if self.receiver is not None:
            return
        p = self.params
        # decided from the URI alone: resolving a remote one may need the network
        remote = "://" in checkpoint and not checkpoint.startswith("file://")
        fs, base = filesystem(checkpoint) if not remote else (None, checkpoint)
        if remote or not isinstance(fs, pafs.LocalFileSystem):
            raise SourceError(
                f"source '{self.name}': the write-ahead log of a core NATS subject needs a checkpoint on a "
                f"local or mounted file system, got {checkpoint!r}"
            )
        self.directory = os.path.join(base, "wal", self.name)
        try:
            self.wal = WriteAheadLog(self.directory, max_bytes=p.max_backlog, segment_bytes=p.segment_size,
                                     after=committed, lock_wait_s=p.wait / 1000)
        except (WalError, OSError) as e:
            raise SourceError(f"source '{self.name}': write-ahead log: {e}") from e
        self._committed = committed
        self.wal.truncate_before(committed)  # a driver that died after its commit left these
        self.receiver = _Receiver(self.name, p, self.wal)
        self.receiver.start()
        deadline = time.monotonic() + p.wait / 1000
        while not self.receiver.subscribed.wait(0.05):
            if self.receiver.error is not None or time.monotonic() > deadline:
                error = self._failure() or SourceError(self._unreachable(p.wait / 1000))
                self.detach()
                raise error

    def committed(self, end: int, cursor: str | None = None) -> None:
        """Delete the log's segments every record of which is committed (``end`` and before)."""
        self._committed = end
        if self.wal is not None:
            try:
                self.wal.truncate_before(end)
            except OSError as e:
                raise SourceError(f"source '{self.name}': deleting committed segments of its write-ahead log: {e}") from e

    def detach(self) -> None:
        """Stop receiving and close the log (releasing its lock)."""
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver.join(timeout=10)
            self.receiver = None
        if self.wal is not None:
            self.wal.close()
            self.wal = None

    # ------------------------------------------------------------------ the source
    def available(self, elapsed_s: float) -> int:
        if self.wal is None or self.receiver is None:
            raise SourceError(f"source '{self.name}': not receiving (the engine attaches it to a checkpoint first)")
        failure = self._failure()
        if failure is not None:
            raise failure
        lost = self.receiver.lost_since
        if lost is not None and time.monotonic() - lost > self.params.wait / 1000:
            raise SourceError(self._unreachable(time.monotonic() - lost))
        return self.wal.end

    def _failure(self) -> SourceError | None:
        error = self.receiver.error if self.receiver is not None else None
        if error is None:
            return None
        return SourceError(f"source '{self.name}': receiving {self.params.subject!r}: {error}")

    def _unreachable(self, waited_s: float) -> str:
        p = self.params
        kept = (self.wal.end - self._committed) if self.wal is not None else 0
        last = self.receiver.health.status if self.receiver is not None else ""
        return (
            f"source '{self.name}': NATS server {redact(p.url)} unreachable for {waited_s:.0f}s "
            f"(wait: {format_duration_ms(p.wait)}); its write-ahead log keeps the {kept} messages not yet "
            f"committed, and a restart replays them ({last})"
        )

    def status(self) -> dict[str, Any]:
        r, wal = self.receiver, self.wal
        out: dict[str, Any] = r.health.to_json() if r is not None else {"status": "not receiving", "retries": 0}
        if wal is not None:
            if wal.full_since is not None and out["status"] == "ok":
                since = time.strftime("%H:%M:%S", time.localtime(wal.full_since))
                out["status"] = f"WAL full since {since}: dropping messages"
            out |= {
                "wal_bytes": wal.bytes,
                "wal_records": wal.end - self._committed,
                "wal_dropped": wal.dropped,
                "max_backlog": self.params.max_backlog,
            }
        return out

    @property
    def origin(self) -> str:
        return self.params.subject

    def __getstate__(self) -> dict[str, Any]:
        """A resident lane reads the log's files (``directory``, on the driver's file system, as
        Spark's tasks do); the receiver and the open log stay with the driver."""
        return {**self.__dict__, "wal": None, "receiver": None}

    def _fetcher(self, ranges: SubRanges) -> Any:
        if self.directory is None:
            raise SourceError(f"source '{self.name}': not attached to a checkpoint, so it has no log to read")
        return functools.partial(wal_ranges, self.directory, ranges, self.name)


def wal_ranges(
    directory: str, ranges: SubRanges, source: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[tuple[list[int], list[bytes]]]:
    """In a Spark task: the log's records of the sub-ranges whose numbers arrive in ``batches``,
    as chunks of (record numbers, payloads)."""
    for first, end in ranges.of_tasks(batches):
        try:
            yield from read_range(directory, first, end)
        except WalError as e:
            raise SourceError(f"source '{source}': {e}") from e


@SOURCES.register
class CoreNatsSourceKind(SourceKind):
    key = "nats_core"
    params = CoreNatsIn
    offsets = "records in the write-ahead log"
    offsets_shared = False  # each source logs what it received itself

    def make(self, spec: SourceSpec) -> CoreNatsSource:
        return CoreNatsSource(spec)
