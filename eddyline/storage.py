"""Files under a location that may be a local path or any URI pyarrow opens.

The checkpoint, the files sources and sinks and the state store all read and write through
these few functions, so that a cluster can put them on any filesystem pyarrow supports.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
from collections.abc import Callable
from urllib.parse import quote, unquote

import pyarrow.fs as pafs

from eddyline import objectfs, objectstore
from eddyline.errors import Fenced


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and path for a local path or any URI pyarrow understands."""
    if objectstore.is_object_store(root):
        return objectfs.filesystem(), root.split("://", 1)[1].rstrip("/")
    if "://" in root:
        fs, path = pafs.FileSystem.from_uri(root)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(root)


def is_s3(fs: pafs.FileSystem) -> bool:
    """Whether ``fs`` is pyarrow's S3 file system (whose paths are ``bucket/key``)."""
    return objectfs.is_object_filesystem(fs) or getattr(fs, "type_name", "") == "s3"


def write_atomic(
    fs: pafs.FileSystem, path: str, data: bytes, before_rename: Callable[[], None] | None = None
) -> None:
    """Write then rename, so readers see the old file or the whole new one. ``before_rename``
    runs in between (a fault test's hook: a crash there leaves only the temporary file). On an
    object store an object appears whole once its upload completes: no rename (a copy there)."""
    if is_s3(fs):
        if before_rename is not None:
            before_rename()
        write_bytes(fs, path, data)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    if before_rename is not None:
        before_rename()
    fs.move(tmp, path)


def create_exclusive(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    """Write ``path`` whole unless it exists (False then): of two processes creating the same file
    exactly one wins, and nobody sees it half written. A hard link fails if its name exists (a
    local or mounted file system); an object store refuses a conditional write (``If-None-Match``,
    :mod:`eddyline.objectstore`)."""
    if is_s3(fs):
        bucket, _, key = path.partition("/")
        return objectstore.bucket(bucket).create(key, data)
    if not isinstance(fs, pafs.LocalFileSystem):
        raise OSError(f"{path}: creating a file exclusively needs a local or mounted file system or an object store")
    tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(3).hex()}"
    with open(tmp, "wb") as out:
        out.write(data)
    return _link_new(tmp, path)


def _link_new(tmp: str, path: str) -> bool:
    """Give the file ``tmp`` the name ``path`` unless that exists (False then); ``tmp`` goes either way."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def read_json(fs: pafs.FileSystem, path: str) -> object:
    return json.loads(read_bytes(fs, path))


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    """A whole file (on an object store: one GET, :mod:`eddyline.objectfs`)."""
    with fs.open_input_stream(path) as f:
        return bytes(f.read())


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write a whole file (on an object store: one PUT)."""
    with fs.open_output_stream(path) as out:
        out.write(data)


def makedirs(fs: pafs.FileSystem, path: str) -> None:
    """Make the directory ``path`` and its parents, where there are directories: an object store
    has none (pyarrow would write a marker object for every level, and ask for the bucket first)."""
    if not is_s3(fs):
        fs.create_dir(path, recursive=True)


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


# ---------------------------------------------------------------------------------------------
# Writes under a lease generation

#: the directory of a store that holds its writers' gates (and a files sink's staged epochs)
GATES = "_staging"
#: what a gate holds between the two renames of a move, named for where it came from
PARKED = ".moving-"


def fenced(generation: int, newest: int, where: str) -> Fenced:
    """What a driver of ``generation`` is told when the store ``where`` refused its write because
    generation ``newest`` took the lease over."""
    return Fenced(f"lease generation {generation} was taken over by generation {newest}: {where} "
                  "refuses its writes; stopping without writing anything more")


def gate_name(generation: int) -> str:
    return f"g={generation}"


def _generation_of(prefix: str) -> int:
    """The generation of a gate's name or path (``…/g=3``); -1 if it names none."""
    name = prefix.rstrip("/").rsplit("/", 1)[-1]
    return int(name[2:]) if name.startswith("g=") and name[2:].isdigit() else -1


def staging_leftovers(root: str | os.PathLike[str]) -> list[str]:
    """Files left in a local store's gates (what a driver staged and neither published nor
    cleared): anything but the empty tombstones of revoked generations. A run that ended
    cleanly, and every store a newer generation opened since, has none."""
    gates = os.path.join(filesystem(os.fspath(root))[1], GATES)
    out = []
    for at, _, files in os.walk(gates):
        out += [os.path.join(at, f) for f in files
                if at != gates or os.path.getsize(os.path.join(at, f))]
    return sorted(out)


class Gate:
    """The way a driver of lease generation ``generation`` writes into one store (a directory on
    a local or mounted file system: a checkpoint, a files sink), such that the *store* refuses
    the writes of a generation older than the newest that opened a gate there.

    ::

        <store>/_staging/g=G/            generation G's gate: every write passes through it
        <store>/_staging/g=G/<writer>/   one driver's part of it (the two drivers of a hot pair)
        <store>/_staging/g=F             an empty file: generation F < G was revoked

    Every write others can see is a ``rename`` or ``link`` out of the gate (a new file: written
    inside, then moved into place) or through it (a directory moved elsewhere is parked in the
    gate first, as ``.moving-<where it came from>``, then moved on), so it names a path inside
    the gate. Opening generation G's gate revokes every older one: moves it aside and leaves an
    empty file under its name, which no ``mkdir`` can pass. From then on no path through an older
    gate resolves, so a driver that was frozen past its lease and wakes has every write refused
    by the file system itself, whatever it checked before.

    The order that makes it safe: a gate is created (``mkdir``) and *then* the store is listed
    for newer ones; a newer generation creates its own and *then* lists and revokes the older.
    Whichever lists second sees the other, so once :meth:`open` returned, no older gate can be
    in use, nor made again. What a revoked driver had parked (a publish or retraction cut
    between its two renames) goes back where it came from, unless something already took its
    place (:meth:`_recover`). The newest generation's gate is never removed:
    it is how the store remembers the newest generation it has seen.

    Generation 0 is a driver without a lease: it fences nobody, checks for nobody, and is revoked
    (without a tombstone) by any leased generation.
    """

    def __init__(self, root: str, generation: int = 0, writer: str = ""):
        self.root = root
        self.fs, self.base = filesystem(root)
        self.gates = f"{self.base}/{GATES}"
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self._at(generation, writer)

    def _at(self, generation: int, writer: str) -> None:
        self.generation, self.writer = generation, writer
        self.dir = f"{self.gates}/{gate_name(generation)}"
        #: this driver's part of the gate: what it stages and parks
        self.own = f"{self.dir}/{writer}" if writer else self.dir
        self.opened = False

    # ------------------------------------------------------------------ opening and revoking
    def open(self, generation: int | None = None, writer: str | None = None) -> Gate:
        """Make this generation's gate (again) and revoke every older one; raise
        :class:`~eddyline.errors.Fenced` if a newer generation opened one here. ``generation``
        / ``writer``: write under these from now on (a driver that took the lease over)."""
        generation = self.generation if generation is None else generation
        writer = self.writer if writer is None else writer
        if self.opened and (generation, writer) == (self.generation, self.writer):
            return self  # opened under these already (a later revocation shows at the next write)
        self._at(generation, writer)
        if not self._local:
            if self.generation:
                self._open_on_store()
            self.opened = True
            return self
        os.makedirs(self.gates, exist_ok=True)
        if self.generation == 0:  # no lease: nobody to fence, nothing that fences it
            os.makedirs(self.own, exist_ok=True)
            self._recover(self.own)
            self.opened = True
            return self
        try:
            os.mkdir(self.dir)
        except FileExistsError:
            if not os.path.isdir(self.dir):
                raise self._fenced(self._newest()) from None
        newest = self._newest()
        if newest > self.generation:
            self._revoke(self.generation)
            raise self._fenced(newest)
        for name in os.listdir(self.gates):
            if name.startswith("g=") and name[2:].isdigit() and int(name[2:]) < self.generation:
                self._revoke(int(name[2:]))
        self._mkdirs(self.own)
        self._recover(self.own)  # this driver's own half-done moves (an exception cut them)
        self.opened = True
        return self

    def _open_on_store(self) -> None:
        """An object store has no renames and no directories to revoke. What stands for them:
        the gate is an object (``_staging/g=G/_gate``) that tells older drivers who took over,
        and what older generations staged here is deleted. A driver woken past its lease
        (whose lease check before publishing passed) publishes by copying what it staged: the
        store refuses those copies, their sources being gone, and the driver then finds the newer
        gate (:meth:`_check`)."""
        bucket, _, gates = self.gates.partition("/")
        store = objectstore.bucket(bucket)
        store.put(f"{gates}/{gate_name(self.generation)}/_gate", b"")
        _, prefixes = store.list_one_level(gates)  # (ours among them now)
        newest = max(map(_generation_of, prefixes))
        if newest > self.generation:
            raise self._fenced(newest)
        for prefix in prefixes:
            if _generation_of(prefix) < self.generation and (keys := store.list(prefix)):
                store.delete(keys)

    def _newest(self) -> int:
        if not self._local:
            bucket, _, gates = self.gates.partition("/")
            return max(map(_generation_of, objectstore.bucket(bucket).list_one_level(gates)[1]), default=0)
        try:
            names = os.listdir(self.gates)
        except FileNotFoundError:
            return 0
        return max((int(n[2:]) for n in names if n.startswith("g=") and n[2:].isdigit()), default=0)

    def _fenced(self, newest: int) -> Fenced:
        return fenced(self.generation, newest, self.root)

    def _revoke(self, generation: int) -> None:
        """Take generation ``generation``'s gate away and leave its tombstone (none for 0)."""
        path = f"{self.gates}/{gate_name(generation)}"
        aside: list[str] = []
        while True:
            if os.path.isdir(path):
                moved = f"{self.gates}/.revoked-{gate_name(generation)}-{os.urandom(4).hex()}"
                try:
                    os.rename(path, moved)
                    aside.append(moved)
                except FileNotFoundError:
                    pass
            if generation == 0:
                break
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                os.close(fd)
                break
            except FileExistsError:
                if not os.path.isdir(path):
                    break  # revoked meanwhile by another
                # the revoked driver made it again between the two steps (a Spark task's mkdirs):
                # take that away too
        for moved in aside:
            self._recover(moved)
            shutil.rmtree(moved, ignore_errors=True)

    def _recover(self, gate: str) -> None:
        """Put back what a gate parked (its own part, or each writer's) where it came from."""
        for parked in glob.glob(f"{glob.escape(gate)}/{PARKED}*") + glob.glob(f"{glob.escape(gate)}/*/{PARKED}*"):
            origin = f"{self.base}/{unquote(os.path.basename(parked)[len(PARKED):])}"
            if not os.path.lexists(origin):
                os.makedirs(os.path.dirname(origin), exist_ok=True)
                with contextlib.suppress(OSError):
                    os.rename(parked, origin)
            if os.path.lexists(parked):  # something took its place meanwhile: it is stale
                shutil.rmtree(parked, ignore_errors=True) if os.path.isdir(parked) else os.unlink(parked)

    # ------------------------------------------------------------------ writing through it
    def _check(self, error: OSError) -> OSError | Fenced:
        """The error to raise for an ``error`` met writing through the gate: :class:`Fenced` if
        the gate was revoked (that is why the path no longer resolved), else ``error``."""
        if self._local and self.generation and not os.path.isdir(self.own):
            return self._fenced(self._newest())
        if not self._local and self.generation and isinstance(error, FileNotFoundError):
            newest = self._newest()  # what this driver staged is gone: a newer gate deleted it?
            if newest > self.generation:
                return self._fenced(newest)
        return error

    def check(self, error: OSError | None = None) -> None:
        """Raise :class:`~eddyline.errors.Fenced` if this gate was revoked (for a write that
        found nothing to move, or failed with ``error``: the revocation took it away)."""
        checked = self._check(error or FileNotFoundError(self.own))
        if isinstance(checked, Fenced):
            raise checked

    def _mkdirs(self, path: str) -> None:
        """``path`` and its parents up to (not including) the gate: a revoked gate is not made again."""
        if not self._local:
            makedirs(self.fs, path)
            return
        rel = os.path.relpath(path, self.dir)
        at = self.dir
        for part in ([] if rel == "." else rel.split(os.sep)):
            at = f"{at}/{part}"
            try:
                os.mkdir(at)
            except FileExistsError:
                continue
            except OSError as e:
                raise self._check(e) from None

    def ready(self) -> Gate:
        """The gate, opened once (a driver without a lease opens it when it first writes)."""
        return self if self.opened else self.open()

    def staging(self, *parts: str) -> str:
        """A path inside this driver's part of the gate (for what is written there first)."""
        return "/".join([self.own, *parts])

    def makedirs(self, path: str) -> None:
        """Make ``path`` inside the gate (and what leads to it from the gate)."""
        self._mkdirs(path)

    def put(self, path: str, data: bytes, *, exclusive: bool = False,
            before: Callable[[], None] | None = None) -> bool:
        """Write ``path`` whole: written inside the gate, then renamed (or, ``exclusive``, linked:
        False if ``path`` exists) into place. ``before`` runs in between (a fault test's hook)."""
        if not self._local:
            if exclusive:
                if before is not None:
                    before()
                return create_exclusive(self.fs, path, data)
            write_atomic(self.fs, path, data, before)
            return True
        tmp = f"{self.own}/{os.path.basename(path)}.{os.getpid()}-{os.urandom(3).hex()}.tmp"
        try:
            try:
                out = open(tmp, "wb")  # noqa: SIM115
            except FileNotFoundError:
                if self.generation:
                    raise
                os.makedirs(self.own, exist_ok=True)  # no lease: the gate is made where it is first used
                out = open(tmp, "wb")  # noqa: SIM115
            with out:
                out.write(data)
            if before is not None:
                before()
            if exclusive:
                return _link_new(tmp, path)
            os.rename(tmp, path)
            return True
        except (FileNotFoundError, NotADirectoryError) as e:
            raise self._check(e) from None

    def link(self, src: str, dst: str) -> None:
        """Make ``dst`` the same file as ``src`` (a hard link, replacing ``dst``), through the gate."""
        tmp = f"{self.own}/{os.path.basename(dst)}.{os.getpid()}-{os.urandom(3).hex()}.tmp"
        try:
            os.link(src, tmp)
            os.rename(tmp, dst)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise self._check(e) from None

    def _park(self, path: str) -> str | None:
        """Move ``path`` into the gate (named for where it came from); None if there is nothing
        at ``path``."""
        parked = f"{self.own}/{PARKED}{quote(os.path.relpath(path, self.base), safe='')}"
        try:
            os.rename(path, parked)
        except FileNotFoundError:
            if not os.path.isdir(self.own):
                raise self._check(FileNotFoundError(path)) from None
            return None
        except NotADirectoryError as e:
            raise self._check(e) from None
        return parked

    def move(self, src: str, dst: str) -> bool:
        """Move ``src`` (a file or directory) to ``dst``, which must not exist, through the gate;
        False if there is nothing at ``src``."""
        if not self._local:
            return _move_tree(self.fs, src, dst)
        parked = self._park(src)
        if parked is None:
            return False
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.rename(parked, dst)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise self._check(e) from None
        return True

    def publish(self, staged: str, dst: str) -> None:
        """Put the directory ``staged`` (inside the gate) in place of ``dst``, replacing what an
        earlier attempt put there."""
        if not self._local:
            if exists(self.fs, dst):
                self.fs.delete_dir(dst)
            _move_tree(self.fs, staged, dst)
            return
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        while True:
            old = self._park(dst)
            try:
                os.rename(staged, dst)
                break
            except (FileNotFoundError, NotADirectoryError) as e:
                raise self._check(e) from None
            except OSError as e:
                # the other driver of a hot pair published the same epoch between our parking
                # and our rename (both may: the selector records a publish after it): park
                # theirs too, the same output, and put ours in place
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            finally:
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.unlink(old)

    def remove(self, path: str) -> bool:
        """Delete ``path`` (a file or directory) through the gate; False if it was not there."""
        if not self._local:
            info = self.fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                return False
            self.fs.delete_dir(path) if info.type == pafs.FileType.Directory else self.fs.delete_file(path)
            return True
        parked = self._park(path)
        if parked is None:
            return False
        shutil.rmtree(parked, ignore_errors=True) if os.path.isdir(parked) else os.unlink(parked)
        return True

    def clear(self, path: str) -> None:
        """Delete ``path`` inside the gate (an earlier attempt's staging), if it is there."""
        if self._local:
            shutil.rmtree(path, ignore_errors=True)
        elif exists(self.fs, path):
            self.fs.delete_dir(path)


def publish_objects(staged: str, dst: str, names: list[str], marker: str) -> None:
    """Put the objects ``names`` and ``marker`` staged in the folder ``staged`` (``bucket/key``)
    in place in the folder ``dst`` of the same bucket without listing either: each copied on the
    server, ``marker`` first, then the staged ones deleted in one request. Every write is a copy
    from the staging, so once the staging is gone (a newer generation deleted it) none lands.
    Where ``dst`` has the marker already, an earlier attempt published there, whole or in part
    (the marker goes first): what it holds besides these goes (the one listing, on a replay only;
    an earlier attempt may have named its files otherwise, e.g. one file written by the driver
    where this one's tasks wrote one each). Not atomic: what reads ``dst`` meanwhile may see part
    of it."""
    bucket, _, src_key = staged.partition("/")
    dst_key = dst.partition("/")[2]
    store = objectstore.bucket(bucket)
    if store.head(f"{dst_key}/{marker}") is not None:
        stale = [k for k in store.list(dst_key) if k.rsplit("/", 1)[1] not in (*names, marker)]
        if stale:
            store.delete(stale)
    for name in (marker, *names):
        store.copy(f"{src_key}/{name}", f"{dst_key}/{name}")
    store.delete([f"{src_key}/{name}" for name in (marker, *names)])


def _move_tree(fs: pafs.FileSystem, src: str, dst: str) -> bool:
    """Move ``src`` (a file or a directory) to ``dst`` on an object store, which renames nothing:
    each object is copied (a server-side copy), then the originals deleted. False if ``src`` is
    not there. Not atomic: what reads ``dst`` meanwhile may see part of it."""
    info = fs.get_file_info(src)
    if info.type == pafs.FileType.NotFound:
        return False
    if info.type == pafs.FileType.File:
        fs.copy_file(src, dst)
        fs.delete_file(src)
        return True
    for f in fs.get_file_info(pafs.FileSelector(src, recursive=True)):
        if f.type == pafs.FileType.File:
            fs.copy_file(f.path, f"{dst}/{f.path[len(src) + 1:]}")
    fs.delete_dir(src)
    return True


class Guarded:
    """JSON objects on an object store that only the newest lease generation may replace: the
    object store's counterpart of a :class:`Gate` for the few objects that decide what the
    checkpoint holds (its head, the latest commit; its metadata).

    Each object carries the generation that wrote it, and every write is conditional on the
    version this driver last saw (``If-Match`` on its ETag). A driver that takes the lease over
    first rewrites each object with its generation (:meth:`fence`), which changes the version:
    from then on the store refuses every write of an older driver (HTTP 412), whatever that driver
    checked before, and the older driver, reading the object again, finds the newer generation in
    it and stops with :class:`~eddyline.errors.Fenced`. Generation 0 (no lease) fences nobody and
    checks for nobody: its writes are only conditional on the version it just read.
    """

    def __init__(self, location: str, prefix: str):
        self.location = location
        self.store, key = objectstore.at(location)
        self.prefix = f"{key}/{prefix}".strip("/") if key else prefix
        self.generation = 0
        self._etags: dict[str, str] = {}

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def read(self, name: str) -> tuple[dict | None, str | None]:
        """The object and its ETag (None, None: there is none)."""
        got = self.store.get(self._key(name))
        if got is None:
            return None, None
        doc = json.loads(got[0])
        assert isinstance(doc, dict)
        return doc, got[1]

    def _check(self, doc: dict | None) -> None:
        newest = int(doc.get("generation", 0)) if doc is not None else 0
        if self.generation and newest > self.generation:
            raise fenced(self.generation, newest, self.location)

    def fence(self, generation: int, names: dict[str, Callable[[], dict | None]]) -> None:
        """Write as ``generation`` from now on, and make each object of ``names`` say so (the
        function makes an object that is not there yet; None: leave it absent). Raises
        :class:`~eddyline.errors.Fenced` if a newer generation wrote one of them."""
        self.generation = generation
        self._etags.clear()
        if not generation:
            return
        for name, make in names.items():
            while True:
                doc, etag = self.read(name)
                self._check(doc)
                if doc is None and (doc := make()) is None:
                    break
                if doc.get("generation") == generation and etag is not None:
                    self._etags[name] = etag
                    break
                new = self.store.put_if(self._key(name), json.dumps({**doc, "generation": generation}).encode(), etag)
                if new is not None:
                    self._etags[name] = new
                    break

    def write(self, name: str, doc: dict, settled: Callable[[dict], bool] = lambda _: False) -> bool:
        """Replace the object by ``doc`` (with this generation) if it is still the version this
        driver last saw. When the store refuses, the object is read again: a newer generation's
        raises :class:`~eddyline.errors.Fenced`; one for which ``settled`` holds means another
        write of this generation made it what it should be (False); else (a write whose answer
        was lost, then retried) it is tried again on the version read."""
        data = json.dumps({**doc, "generation": self.generation}).encode()
        etag = self._etags.get(name) if self.generation else None
        if etag is None:
            current, etag = self.read(name)
            self._check(current)
        while True:
            new = self.store.put_if(self._key(name), data, etag)
            if new is not None:
                self._etags[name] = new
                return True
            current, etag = self.read(name)
            self._check(current)
            if current is not None and settled(current):
                return False
