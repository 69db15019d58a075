"""Who may run a network: a lease in the checkpoint, with generations that fence a former holder.

::

    <checkpoint>/lease/<generation>.json    holder and start, created exclusively: one winner
    <checkpoint>/lease/<generation>.beat    the holder's heartbeat (the lease's expiry), replaced

The holder renews its lease every ``timeout / 3`` from a background thread and at every epoch.
A lease whose expiry has passed is free: a standby takes it by creating the next generation's
file, which only one process can create. Every plan and commit carries the generation that
wrote it, and a holder checks before each step that could change what others see (logging a
plan, publishing, committing) that no newer generation exists; one that finds a newer one, for
instance after being frozen past its expiry, stops with :class:`Fenced` and writes nothing more.

The lease lives in the checkpoint: on a local or mounted path a generation file is created
exclusively with a hard link; on an object store (``s3://…``) with a conditional write
(``If-None-Match: *``, :mod:`eddyline.objectstore`), which the store decides: of many standbys
creating the same generation, on any hosts, exactly one wins. There the store refuses an older
generation's commits and files-sink publishes (:class:`~eddyline.storage.Guarded`, the sinks'
gates) but not all of its other writes, so a holder whose renewals have not reached the store for
three quarters of its timeout also stops on its own (:meth:`Lease._check_renewed`), and a standby
waits through a store that does not answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pyarrow.fs as pafs

from eddyline import objectstore
from eddyline.errors import CheckpointError, Fenced
from eddyline.objectstore import ObjectStore, is_object_store
from eddyline.storage import create_exclusive

_LOCAL = pafs.LocalFileSystem()


__all__ = ["Fenced", "Holding", "Lease", "holder_name"]


@dataclass(frozen=True)
class Holding:
    generation: int
    holder: str
    acquired_at: float
    expires_at: float
    #: what the holder said about itself when it took the lease (a hot pair: its checkpoint)
    info: dict | None = None


def holder_name() -> str:
    """This process, as the lease names it: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    def __init__(self, checkpoint: str, *, timeout_s: float = 5.0, holder: str | None = None,
                 clock: Callable[[], float] = time.time, info: dict | None = None):
        """``info``: written with the holder when it takes the lease, for the others to read
        (:attr:`Holding.info`)."""
        self.files: _Folder
        #: on a local or mounted path the gates (:class:`~eddyline.storage.Gate`) refuse an
        #: older generation's writes at the store; on an object store only its commits and
        #: publishes are refused there, so a holder that cannot renew stops on its own
        #: (:meth:`_check_renewed`)
        self.self_fencing = is_object_store(checkpoint)
        if is_object_store(checkpoint):
            store, key = objectstore.at(checkpoint)
            self.files = _StoreFolder(store, f"{key}/lease" if key else "lease")
        elif "://" in checkpoint and not checkpoint.startswith("file://"):
            raise CheckpointError(
                f"checkpoint {checkpoint!r}: a lease needs a local or mounted path or an object store "
                f"({', '.join(objectstore.SCHEMES)}), whose writes can be made conditional"
            )
        else:
            self.files = _LocalFolder(os.path.join(os.path.abspath(checkpoint.removeprefix("file://")), "lease"))
        self.timeout_s, self.clock = timeout_s, clock
        self.holder = holder or holder_name()
        self.info = info
        self.generation: int | None = None  # ours, once acquired
        self.acquired_at: float | None = None
        self._thread: threading.Thread | None = None
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()
        self.fenced: Fenced | None = None  # set by the heartbeat thread
        #: when the lease we hold could have expired, by the last heartbeat the store took
        #: (measured from before it was sent)
        self.valid_until: float | None = None

    # ------------------------------------------------------------------ reading
    def _generations(self) -> list[int]:
        names = self.files.names()
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def current(self) -> Holding | None:
        """The newest generation and its expiry (a generation without a heartbeat yet expires a
        timeout after it was created)."""
        gens = self._generations()
        if not gens:
            return None
        g = gens[-1]
        info = json.loads(self.files.read(self._name(g, "json")) or b"{}")
        try:
            expires = float(json.loads(self.files.read(self._name(g, "beat")) or b"")["expires_at"])
        except (ValueError, KeyError):
            expires = float(info["acquired_at"]) + self.timeout_s
        return Holding(g, str(info["holder"]), float(info["acquired_at"]), expires, info.get("info"))

    def _name(self, generation: int, kind: str) -> str:
        return f"{generation:010d}.{kind}"

    # ------------------------------------------------------------------ taking it
    def try_acquire(self, *, force: bool = False) -> bool:
        """Take the lease if nobody holds it or its holder let it expire; with ``force`` even
        from a live holder (it is fenced: an operator started this driver to lead)."""
        now = self.clock()
        cur = self.current()
        if cur is not None and cur.expires_at > now and cur.holder != self.holder and not force:
            return False
        g = (cur.generation if cur is not None else 0) + 1
        body = json.dumps({"generation": g, "holder": self.holder, "acquired_at": now, "info": self.info}).encode()
        if not self.files.create(self._name(g, "json"), body):
            return False  # another standby was quicker
        self.generation, self.acquired_at = g, now
        self._beat()
        return True

    def _try_acquire_or_wait(self) -> bool:
        """:meth:`try_acquire`, where a store that does not answer means: not yet (a standby
        waits through an outage of the checkpoint's store and takes over once it is back)."""
        try:
            return self.try_acquire()
        except Exception:  # noqa: BLE001 (obstore's and pyarrow's errors alike)
            return False

    def describe(self) -> dict[str, object]:
        """Who leads and since when, for the progress record."""
        return {"holder": self.holder, "generation": self.generation, "leadingSince": self.acquired_at}

    def acquire(self, *, poll_s: float | None = None, should_stop: Callable[[], bool] | None = None,
                on_wait: Callable[[Holding], None] | None = None) -> bool:
        """Wait until the lease is ours (True), or ``should_stop`` says so (False)."""
        poll = poll_s if poll_s is not None else min(0.5, self.timeout_s / 4)
        while not self._try_acquire_or_wait():
            if should_stop is not None and should_stop():
                return False
            try:
                cur = self.current()
            except Exception:  # noqa: BLE001 (the store is away: wait on)
                cur = None
            if on_wait is not None and cur is not None:
                on_wait(cur)
            time.sleep(poll)
        return True

    # ------------------------------------------------------------------ holding it
    def _beat(self, expires_at: float | None = None) -> None:
        """Set our lease's expiry (default: a timeout from now)."""
        assert self.generation is not None
        sent = self.clock()
        expiry = expires_at if expires_at is not None else sent + self.timeout_s
        self.files.write(self._name(self.generation, "beat"), json.dumps({"expires_at": expiry}).encode())
        if expires_at is None:
            self.valid_until = expiry

    def check(self) -> None:
        """Raise :class:`Fenced` if a newer generation exists (or the heartbeat found one)."""
        if self.fenced is not None:
            raise self.fenced
        assert self.generation is not None, "check() before the lease was acquired"
        # generations are taken one after another (the newest + 1), so a newer one exists iff the
        # next one does: one read, not a listing, at every check (on an object store a LIST costs
        # more, and it would be in every epoch's path)
        try:
            newer = self.files.read(self._name(self.generation + 1, "json")) is not None
        except Exception:
            # the store does not answer: fenced if the lease may be lost by now; until then nobody
            # can have taken it over, and the write that follows meets the store's answer itself
            self._check_renewed()
            newer = False
        if newer:
            cur = self.current()
            who = f" by {cur.holder}" if cur is not None else ""
            newest = cur.generation if cur is not None else self.generation + 1
            self.fenced = Fenced(
                f"this driver's lease (generation {self.generation}) was taken over{who} "
                f"(generation {newest}); stopping without writing anything more"
            )
            raise self.fenced
        self._check_renewed()

    def _check_renewed(self) -> None:
        """Fence ourselves when the store has not taken a heartbeat for so long that the lease
        may be about to expire: a holder cut off from the store (or too slow to reach it) must
        stop before a standby may take over, since nothing at the store would refuse its writes
        once it reached the store again. A quarter of the timeout is kept in hand for a write
        already on its way (see ``EDDYLINE_STORE_TIMEOUT`` in :mod:`eddyline.objectstore`)."""
        if self.valid_until is None or not self.self_fencing:
            return
        left = self.valid_until - self.clock()
        if left < self.timeout_s / 4:
            self.fenced = Fenced(
                f"this driver could not renew its lease (generation {self.generation}) for "
                f"{self.timeout_s - left:.1f}s of its {self.timeout_s:g}s: the checkpoint's store did not answer, "
                f"so a standby may take it over; stopping without writing anything more"
            )
            raise self.fenced

    def renew(self) -> None:
        """Check, then push the expiry a timeout ahead."""
        self.check()
        self._beat()

    def start_heartbeat(self, on_fenced: Callable[[], None] | None = None) -> None:
        """Renew every ``timeout / 3`` in a background thread until :meth:`release`;
        ``on_fenced`` runs in that thread once it finds this holder fenced (the engine cancels
        its Spark jobs: a driver cut off from its executors as well as from the store would
        otherwise wait in a job and never reach the check between its steps)."""
        def loop() -> None:
            while not self._stop.wait(self.timeout_s / 3):
                try:
                    self.renew()
                except Fenced:
                    if on_fenced is not None:
                        on_fenced()
                    return
                except Exception:  # noqa: BLE001 (the store did not answer: the next beat tries again,
                    continue  # and check() fences this driver if none gets through in time)

        def watch() -> None:
            """On an object store: fence this holder the moment its renewals are overdue, even
            while the heartbeat waits on a request the store does not answer."""
            while self.fenced is None and not self._stop.is_set():
                left = (self.valid_until or self.clock()) - self.timeout_s / 4 - self.clock()
                if left <= 0:
                    try:
                        self._check_renewed()
                    except Fenced:
                        if on_fenced is not None:
                            on_fenced()
                        return
                self._stop.wait(min(max(left, 0.02), self.timeout_s / 8))

        self._thread = threading.Thread(target=loop, name="eddyline-lease", daemon=True)
        self._thread.start()
        if self.self_fencing:
            self._watch = threading.Thread(target=watch, name="eddyline-lease-watch", daemon=True)
            self._watch.start()

    def release(self) -> None:
        """Stop renewing and, unless fenced, expire the lease now so a standby need not wait."""
        self._stop.set()
        for thread in (self._thread, self._watch):
            if thread is not None:
                # a fenced holder does not wait for a renewal the store never answers (the thread
                # sends nothing more: check() refuses a fenced holder first)
                thread.join(timeout=None if self.fenced is None else 0.2)
        if self.generation is not None and self.fenced is None:
            with contextlib.suppress(Fenced, OSError):
                self.check()
                self._beat(expires_at=self.clock() - 1)


class _Folder(Protocol):
    """Where a lease's files are: a local folder or an object store's prefix."""

    def names(self) -> list[str]: ...
    def read(self, name: str) -> bytes | None: ...
    def create(self, name: str, data: bytes) -> bool: ...
    def write(self, name: str, data: bytes) -> None: ...


class _LocalFolder:
    def __init__(self, path: str):
        self.path = path

    def names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            return []

    def read(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.path, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def create(self, name: str, data: bytes) -> bool:
        os.makedirs(self.path, exist_ok=True)
        return create_exclusive(_LOCAL, os.path.join(self.path, name), data)

    def write(self, name: str, data: bytes) -> None:
        path = os.path.join(self.path, name)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


class _StoreFolder:
    def __init__(self, store: ObjectStore, prefix: str):
        self.store, self.prefix = store, prefix

    def names(self) -> list[str]:
        return [key.rsplit("/", 1)[-1] for key in self.store.list(self.prefix)]

    def read(self, name: str) -> bytes | None:
        got = self.store.get(f"{self.prefix}/{name}")
        return got[0] if got is not None else None

    def create(self, name: str, data: bytes) -> bool:
        return self.store.create(f"{self.prefix}/{name}", data)

    def write(self, name: str, data: bytes) -> None:
        self.store.put(f"{self.prefix}/{name}", data)
