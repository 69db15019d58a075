"""The checkpoint's layout and files: metadata, epoch plans, epoch commits, lane manifests.

::

    <checkpoint>/metadata.json              network fingerprint, key groups, start time
    <checkpoint>/plans/<epoch>.json         written (atomically) before the epoch runs
    <checkpoint>/commits/<epoch>.json       written (atomically) after outputs are published
    <checkpoint>/progress/<epoch>.json      the epoch's progress record (the last PROGRESS_KEPT),
                                            for `eddyline status` and `eddyline ui` on a stopped run
    <checkpoint>/epochs/<epoch>/<step>/…    lane manifests, written by tasks (and the epoch for
                                            them when too large to go with them, run.json)
    <checkpoint>/state/<step>/…             key-group state (see eddyline.state.store)

An epoch is committed iff its commit file exists. The commit is the single atomic step that
moves the source offsets, the state versions (the state index) and the sink bookkeeping
forward together. Recovery: the newest plan without a commit is replayed exactly.

Every file a driver (or its lanes) writes or deletes here goes through the checkpoint's
:class:`~eddyline.storage.Gate` for the driver's lease generation (``<checkpoint>/_staging/g=G``):
once a newer generation opened its gate, the file system refuses an older one's writes.

On an object store, which renames nothing, the epoch is committed by replacing one object,
``<checkpoint>/head.json`` (the latest commit, whole), conditionally on the version the driver
last saw; ``commits/<epoch>.json`` is its copy for the history. The head and the metadata are
:class:`~eddyline.storage.Guarded`: a driver that takes the lease over rewrites them first, and
from then on the store refuses an older generation's commit or change of network. What else an
older generation may still write there (state files and lane manifests) is named with its
generation (:func:`_by`, :func:`~eddyline.state.store.generation_file_id`), beside the newer
one's files, and never read unless a commit names it.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from eddyline.api.change import NetworkDiff
from eddyline.api.network import NetworkSpec
from eddyline.errors import CheckpointError
from eddyline.objectstore import is_object_store
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan
from eddyline.state.store import referenced_files, state_file
from eddyline.storage import Gate, Guarded, filesystem, is_s3, makedirs, read_json

FORMAT_VERSION = 1
HEAD, METADATA = "head.json", "metadata.json"
#: progress records kept in the checkpoint (they are small; the dashboard shows the recent ones)
PROGRESS_KEPT = 300


#: spec fields that say how a network's epochs run, not what it computes: a run may give other
#: values than the run before it on the same checkpoint without changing the network
RUN_ONLY = ("execution",)


def network_hash(raw: dict[str, Any]) -> str:
    """A network spec's identity: the hash of its canonical JSON (without :data:`RUN_ONLY`)."""
    import hashlib

    kept = {k: v for k, v in raw.items() if k not in RUN_ONLY}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def manifest_path(checkpoint: str, epoch: int, step: str, lane: int, generation: int = 0) -> str:
    """Where a lane's task of lease generation ``generation`` leaves its manifest (written
    atomically, read by the driver)."""
    fs, base = filesystem(checkpoint)
    return f"{base}/epochs/{epoch:010d}/{step}/lane-{lane:04d}{_by(fs, generation)}.json"


def lane_run_path(checkpoint: str, epoch: int, step: str, generation: int = 0) -> str:
    """Where the driver leaves a stateful step's epoch for its lanes when it is too large to go
    with the tasks (see ``EpochCompiler._lane_run``)."""
    fs, base = filesystem(checkpoint)
    return f"{base}/epochs/{epoch:010d}/{step}/run{_by(fs, generation)}.json"


def _by(fs: pafs.FileSystem, generation: int) -> str:
    """On an object store, which cannot refuse an older generation's writes, a driver's files
    that others read are named for its generation, as its state files are
    (:func:`~eddyline.state.store.generation_file_id`): a driver woken past its lease writes
    beside the newer one's, never over them."""
    return f"-g{generation}" if generation and is_s3(fs) else ""


class Checkpoint:
    def __init__(self, location: str):
        self.location = location
        self.fs, self.base = filesystem(location)
        #: how this driver writes here (generation 0, no lease, until :meth:`fence`)
        self.gate = Gate(location)
        #: on an object store: the head and the metadata, which only the newest generation replaces
        self.guarded = Guarded(location, "") if is_object_store(location) else None

    def fence(self, generation: int) -> None:
        """Write under lease generation ``generation`` from now on; revokes every older
        generation's writes (:class:`~eddyline.errors.Fenced` if a newer one took over)."""
        makedirs(self.fs, self.base)
        self.gate.open(generation)
        if self.guarded is not None:
            self.guarded.fence(generation, {HEAD: self._first_head, METADATA: lambda: None})
            self._keep_history()

    def _first_head(self) -> dict[str, Any]:
        """The head of a checkpoint that has none: its newest commit (one made by an Eddyline
        that kept no head), or none."""
        epochs = self._epochs("commits")
        return {"epoch": epochs[-1], "commit": read_json(self.fs, self._path("commits", epochs[-1]))} if epochs \
            else {"epoch": 0, "commit": None}

    def _write_meta(self, meta: dict[str, Any]) -> None:
        if self.guarded is not None:
            self.guarded.write(METADATA, meta)
        else:
            self._put(f"{self.base}/{METADATA}", json.dumps(meta, indent=2).encode())

    def _put(self, path: str, data: bytes, *, exclusive: bool = False,
             before: Callable[[], None] | None = None) -> bool:
        makedirs(self.fs, path.rpartition("/")[0])
        return self.gate.ready().put(path, data, exclusive=exclusive, before=before)

    def _delete(self, path: str) -> None:
        self.gate.ready().remove(path)

    # ---------------------------------------------------------------- metadata
    def open(self, fingerprint: dict[str, Any], created: str | None = None) -> dict[str, Any]:
        """Create the checkpoint, or check that an existing one belongs to this network.
        ``created``: the network's hash, remembered when the checkpoint is created."""
        path = f"{self.base}/{METADATA}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            meta = {"format": FORMAT_VERSION, "network": fingerprint, "started_at": time.time(),
                    "id": uuid.uuid4().hex[:12], **({"created": created} if created else {})}
            self._write_meta(meta)
            return meta
        meta = read_json(self.fs, path)
        assert isinstance(meta, dict)
        meta.setdefault("id", f"{int(meta['started_at'] * 1000):x}")  # made before checkpoints had ids
        old = meta.get("network", {})
        diffs = [f"{k}: checkpoint has {old.get(k)!r}, network has {v!r}" for k, v in fingerprint.items() if old.get(k) != v]
        if diffs:
            raise CheckpointError(
                f"checkpoint {self.location!r} belongs to another network ({'; '.join(diffs)}); "
                "use a new checkpoint location"
            )
        return meta

    def metadata(self) -> dict[str, Any] | None:
        path = f"{self.base}/{METADATA}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        meta = read_json(self.fs, path)
        assert isinstance(meta, dict)
        return meta

    # ---------------------------------------------------------------- live network changes
    def store_network(self, raw: dict[str, Any]) -> str:
        """Keep a network (its spec as a dict) under ``networks/<hash>.json``; returns the hash."""
        digest = network_hash(raw)
        # in the spec's own order: a step's aggregates or columns in that order make the order of
        # its state's and output's columns (the hash is of the sorted form)
        self._put(f"{self.base}/networks/{digest}.json", json.dumps(raw).encode())
        return digest

    def read_network(self, digest: str) -> dict[str, Any]:
        raw = read_json(self.fs, f"{self.base}/networks/{digest}.json")
        assert isinstance(raw, dict)
        return raw

    def in_force(self, meta: dict[str, Any] | None = None) -> str | None:
        """The hash of the network the checkpoint runs now: the one a live change put in force,
        else the one it was created with (None: no run started here, or made by an older
        Eddyline). ``meta``: the metadata, if read already."""
        meta = meta if meta is not None else self.metadata() or {}
        return (meta.get("applied") or {}).get("hash") or meta.get("created")

    def restart_change(self, spec: NetworkSpec) -> NetworkDiff | None:
        """How ``spec``, given to a run on this checkpoint, differs from the network in force:
        None when it is that network (or the one the checkpoint was created with, which goes on
        with the network applied since); else the change to apply at the next epoch boundary, as
        ``eddyline apply`` would. A :class:`~eddyline.errors.SpecError` (nothing written) when the
        state cannot follow the change: never is the state read as another network's."""
        from eddyline.api.change import check_restart
        from eddyline.api.validate import spec_from_raw

        meta = self.metadata() or {}
        digest, mine = self.in_force(meta), network_hash(spec.as_dict())
        if digest is None or mine in (digest, meta.get("created")):
            return None
        return check_restart(spec_from_raw(self.read_network(digest)), spec, self.location)

    def record_change(
        self, fingerprint: dict[str, Any], digest: str, change: dict[str, Any], rewrite: dict[str, Any] | None = None
    ) -> None:
        """From ``change["epoch"]`` on, the checkpoint runs network ``digest`` (stored first);
        ``change``: how it takes effect (``eddyline.runtime.engine.LiveChange``); ``rewrite``:
        the rule that made the change, if one did (kept in the list ``rewrites``)."""
        meta = self.metadata()
        assert meta is not None
        epoch = change["epoch"]
        meta.update(network=fingerprint, applied={"hash": digest, **change})
        if rewrite is not None:
            meta["rewrites"] = [*(r for r in meta.get("rewrites", []) if r.get("epoch") != epoch), {**rewrite, "epoch": epoch}]
        self._write_meta(meta)

    def record_caught_up(self, catch_up: dict[str, Any], copies: list[str], epoch: int) -> None:
        """From ``epoch`` on, the steps that caught up on ``copies`` read their sources
        (``catch_up``: the copies still in use); kept in the list ``caught_up``."""
        meta = self.metadata()
        assert meta is not None and "applied" in meta
        meta["applied"]["catch_up"] = catch_up
        meta["caught_up"] = [*meta.get("caught_up", []), *({"copy": c, "epoch": epoch} for c in copies)]
        self._write_meta(meta)

    # ---------------------------------------------------------------- plans and commits
    def _path(self, kind: str, epoch: int) -> str:
        return f"{self.base}/{kind}/{epoch:010d}.json"

    def _epochs(self, kind: str) -> list[int]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.base}/{kind}", allow_not_found=True))
        return sorted(int(i.base_name[:-5]) for i in infos if i.base_name.endswith(".json") and i.base_name[:-5].isdigit())

    def write_plan(self, plan: EpochPlan, *, exclusive: bool = False) -> bool:
        """Log ``plan``; with ``exclusive`` only if no plan of its epoch is logged (False then:
        another driver logged one first)."""
        return self._put(self._path("plans", plan.epoch), json.dumps(plan.to_json()).encode(), exclusive=exclusive)

    def read_plan(self, epoch: int) -> EpochPlan:
        data = read_json(self.fs, self._path("plans", epoch))
        assert isinstance(data, dict)
        return EpochPlan.from_json(data)

    def write_commit(
        self, commit: EpochCommit, before_rename: Callable[[], None] | None = None, *, exclusive: bool = False
    ) -> bool:
        """``before_rename``: runs with the commit written to a temporary file only (or, with
        ``exclusive``, just before the commit is created, which fails if the epoch was
        committed already: False then). On an object store the head is replaced instead (see the
        module), which fails the same way, and raises :class:`~eddyline.errors.Fenced` if a
        newer generation took the lease over."""
        data = commit.to_json()
        if self.guarded is None:
            return self._put(self._path("commits", commit.epoch), json.dumps(data).encode(),
                             exclusive=exclusive, before=before_rename)
        if before_rename is not None:
            before_rename()
        made = self.guarded.write(HEAD, {"epoch": commit.epoch, "commit": data},
                                  settled=lambda head: head["epoch"] >= commit.epoch)
        if made:
            self._put(self._path("commits", commit.epoch), json.dumps(data).encode())
        else:
            self._keep_history()
        return made

    def _head(self) -> tuple[int, dict[str, Any] | None]:
        """On an object store: the epoch of the head and its commit (0, None: none yet)."""
        assert self.guarded is not None
        head, _ = self.guarded.read(HEAD)
        if head is None:  # no driver kept a head here yet: the history is all there is
            head = self._first_head()
        return int(head["epoch"]), head["commit"]

    def _keep_history(self) -> None:
        """Copy the head's commit into the history if a driver stopped between the two writes."""
        epoch, data = self._head()
        if data is not None and not self.has_commit(epoch):
            self._put(self._path("commits", epoch), json.dumps(data).encode())

    def read_commit(self, epoch: int) -> EpochCommit:
        data = read_json(self.fs, self._path("commits", epoch))
        assert isinstance(data, dict)
        return EpochCommit.from_json(data)

    def latest_commit(self) -> EpochCommit | None:
        if self.guarded is not None:
            data = self._head()[1]
            return EpochCommit.from_json(data) if data is not None else None
        epochs = self._epochs("commits")
        return self.read_commit(epochs[-1]) if epochs else None

    def commits(self) -> list[EpochCommit]:
        return [self.read_commit(e) for e in self._epochs("commits")]

    def has_commit(self, epoch: int) -> bool:
        return self.fs.get_file_info(self._path("commits", epoch)).type != pafs.FileType.NotFound

    def has_plan(self, epoch: int) -> bool:
        return self.fs.get_file_info(self._path("plans", epoch)).type != pafs.FileType.NotFound

    def drop_plans_after(self, epoch: int) -> list[int]:
        """Delete the plans logged after commit ``epoch`` (not run to their commit); their epochs."""
        later = [e for e in self._epochs("plans") if e > epoch]
        for e in later:
            self._delete(self._path("plans", e))
        return later

    def adopt(self, other: Checkpoint, commit: EpochCommit) -> None:
        """Make ``commit`` of checkpoint ``other`` (same network) this checkpoint's latest: the
        state files it reads, then the commit itself. On one local file system the files are hard
        links (they never change once written); on one object store, copies the store makes.
        Raises FileNotFoundError if ``other`` deleted one of them meanwhile."""
        local = isinstance(self.fs, pafs.LocalFileSystem) and isinstance(other.fs, pafs.LocalFileSystem)
        if not local and not (is_s3(self.fs) and is_s3(other.fs)):
            raise CheckpointError("copying another checkpoint's state needs both on local or mounted paths, "
                                  "or both on an object store")
        gate = self.gate.ready()
        for step, part in commit.steps.items():
            makedirs(self.fs, f"{self.base}/state/{step}")
            for epoch, lane in sorted(referenced_files(part.index)):
                theirs, ours = state_file(other.base, step, epoch, lane), state_file(self.base, step, epoch, lane)
                if local:
                    gate.link(theirs, ours)  # a file of this name from our own past is not the leader's
                else:
                    self.fs.copy_file(theirs, ours)
        self.write_commit(commit)

    def pending_plan(self, last_committed: int) -> EpochPlan | None:
        """The plan logged after the last commit, if an epoch was cut short."""
        later = [e for e in self._epochs("plans") if e > last_committed]
        if not later:
            return None
        if later != [last_committed + 1]:
            raise CheckpointError(f"plans {later} follow commit {last_committed}; expected at most one")
        return self.read_plan(later[0])

    # ---------------------------------------------------------------- progress
    def write_progress(self, epoch: int, record: dict[str, Any]) -> None:
        self._put(self._path("progress", epoch), json.dumps(record, default=str).encode())

    def progress(self, last: int = PROGRESS_KEPT) -> list[dict[str, Any]]:
        """The progress records of the last ``last`` epochs that wrote one, oldest first."""
        out = []
        for epoch in self._epochs("progress")[-last:]:
            with contextlib.suppress(FileNotFoundError):  # (a cleanup may delete it meanwhile)
                record = read_json(self.fs, self._path("progress", epoch))
                if isinstance(record, dict):
                    out.append(record)
        return out

    def forget_progress(self, keep: int = PROGRESS_KEPT) -> None:
        """Delete all but the newest ``keep`` progress records."""
        epochs = self._epochs("progress")
        for e in epochs[: max(len(epochs) - keep, 0)]:
            self._delete(self._path("progress", e))

    # ---------------------------------------------------------------- lane manifests
    def lane_manifests(self, epoch: int, step: str, lanes: int) -> list[dict[str, Any]]:
        out = []
        for lane in range(lanes):
            path = manifest_path(self.location, epoch, step, lane, self.gate.generation)
            try:
                m = read_json(self.fs, path)
            except FileNotFoundError as e:
                raise CheckpointError(f"epoch {epoch} step '{step}': lane {lane} left no manifest") from e
            assert isinstance(m, dict)
            out.append(m)
        return out

    def forget_before(self, epoch: int) -> None:
        """Drop plans, commits and manifests of epochs before ``epoch`` (state: see the store)."""
        for kind in ("plans", "commits"):
            for e in self._epochs(kind):
                if e < epoch:
                    self._delete(self._path(kind, e))
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.base}/epochs", allow_not_found=True))
        for info in infos:
            if info.base_name.isdigit() and int(info.base_name) < epoch:
                self._delete(info.path)
