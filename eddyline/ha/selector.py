"""The stream selector of a hot pair: each output of each epoch is published once, by whichever
driver gets there first, and the other checks that it computed the same.

Two drivers of a hot pair (:mod:`eddyline.runtime.replica`) run the same logged plans, each with
its own state, and stage the same outputs. Before a driver publishes output ``o`` of epoch ``n``
it looks for ``<group>/selector/<n>/<o>.json``; if it is there, the other driver published it:
this one compares the record's digest with its own and publishes nothing. If it is not there,
this one publishes and then creates the record (exclusively). A driver that dies between its
publish and its record leaves the output to be published again by the other: every sink's
publish is idempotent per epoch (files replace the epoch's directory, PostgreSQL keeps a row per
epoch, NATS message ids), so that costs a repeat, never a duplicate. The record is written after
the publish, never before, so that a record always means "published".

A **digest** is what a Spark job computed on the way while it staged the output: its row count
and the sum of a 64-bit hash of every row (order does not matter, a row more or less does). Two
drivers that disagree have diverged (a non-deterministic step, a different input); the second
one stops with :class:`Diverged`, naming the epoch, the output and both digests.

The group may be a local or mounted directory or an object-store location (``s3://…``): a record
is created exclusively either way (a hard link; a conditional write the store decides), and is
read with one request, so the selector lists nothing in an epoch's path (only when it forgets).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

import pyarrow.fs as pafs

from eddyline.errors import EddylineError
from eddyline.storage import create_exclusive, filesystem, makedirs, read_bytes, write_atomic

#: the file holding the epoch below which records were dropped, and who "published" those
_FLOOR = "forgotten"
FORGOTTEN = "(records dropped)"


class Diverged(EddylineError):
    """The two drivers of a hot pair staged different outputs for the same epoch."""


@dataclass(frozen=True)
class Digest:
    rows: int
    hash: str  # the sum of the rows' 64-bit hashes, as a decimal string

    def to_json(self) -> dict[str, object]:
        return {"rows": self.rows, "hash": self.hash}


@dataclass(frozen=True)
class Published:
    """Who published an output of an epoch, and its digest."""

    by: str
    digest: Digest | None


class Selector:
    def __init__(self, group: str, driver: str):
        self.fs, base = filesystem(group)
        self.dir = f"{base}/selector"
        self.driver = driver
        self.lost = 0  # outputs the other driver published first (and this one checked)

    def _path(self, epoch: int, output: str) -> str:
        return f"{self.dir}/{epoch:010d}/{output}.json"

    def published(self, epoch: int, output: str) -> Published | None:
        try:
            raw = json.loads(read_bytes(self.fs, self._path(epoch, output)))
        except FileNotFoundError:
            # an epoch whose records were dropped was published (a driver forgets only epochs
            # it committed): a driver that wakes up inside one must not publish it again
            return Published(FORGOTTEN, None) if epoch < self.forgotten() else None
        d = raw.get("digest")
        return Published(str(raw["by"]), Digest(int(d["rows"]), str(d["hash"])) if d else None)

    def record(self, epoch: int, output: str, digest: Digest | None) -> Published | None:
        """Record that this driver published (None); if the other recorded first, its record."""
        path = self._path(epoch, output)
        makedirs(self.fs, path.rsplit("/", 1)[0])
        body = json.dumps({"by": self.driver, "digest": digest.to_json() if digest else None}).encode()
        if create_exclusive(self.fs, path, body):
            return None
        return self.published(epoch, output)

    def first(self, epoch: int, output: str, mine: Digest | None) -> bool:
        """Whether this driver is to publish ``output`` of ``epoch``: nobody did yet. If someone
        did (the other driver, or this one before a crash), its digest is checked first."""
        theirs = self.published(epoch, output)
        if theirs is None:
            return True
        self.check(epoch, output, mine, theirs)
        return False

    def done(self, epoch: int, output: str, mine: Digest | None) -> None:
        """Record the publish; if the other driver recorded the same output meanwhile (both
        published it: the same rows, idempotently), check that it was the same."""
        theirs = self.record(epoch, output, mine)
        if theirs is not None:
            self.check(epoch, output, mine, theirs)

    def check(self, epoch: int, output: str, mine: Digest | None, theirs: Published) -> None:
        """Raise :class:`Diverged` if both digests are known and differ."""
        if theirs.by != self.driver:
            self.lost += 1
        if mine is not None and theirs.digest is not None and mine != theirs.digest:
            raise Diverged(
                f"epoch {epoch}, output '{output}': this driver ({self.driver}) staged {mine.rows} rows "
                f"(hash {mine.hash}), {theirs.by} published {theirs.digest.rows} rows (hash "
                f"{theirs.digest.hash}); the two drivers of the pair computed different results"
            )

    def forgotten(self) -> int:
        """Epochs below this have had their records dropped."""
        try:
            return int(read_bytes(self.fs, f"{self.dir}/{_FLOOR}").strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def forget_before(self, epoch: int) -> None:
        """Drop the records of epochs before ``epoch``. They count as published from then on:
        the other driver may be frozen inside one of them and must not publish it when it wakes
        (for a NATS sink that could be after the server's de-duplication window)."""
        if epoch > self.forgotten():  # first the floor, then the records
            makedirs(self.fs, self.dir)
            write_atomic(self.fs, f"{self.dir}/{_FLOOR}", str(epoch).encode())
        found = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        for info in found:
            if info.type == pafs.FileType.Directory and info.base_name.isdigit() and int(info.base_name) < epoch:
                with contextlib.suppress(FileNotFoundError):  # the other driver forgot it first
                    self.fs.delete_dir(info.path)
