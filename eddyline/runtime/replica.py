"""A hot pair: two drivers that run every epoch, so that the one that survives is already warm.

Each driver of the pair has a checkpoint of its own (its own copy of the state) and both share a
**group** (a directory, or a location on an object store): the lease (:mod:`eddyline.ha.lease`, whose holder names its checkpoint), the
stream selector's records (:mod:`eddyline.ha.selector`) and a heartbeat per follower::

    <group>/group.json                      the group's id and network (one network per group)
    <group>/lease/...                       who leads
    <group>/selector/<epoch>/<sink>.json    who published which output, with its digest
    <group>/followers/<writer>.json         the epoch a follower committed last, its state, and when

The **leader** plans as a single driver does, and logs its plans in its own checkpoint. It plans
epoch ``n`` only once every follower that has caught up (is *following*) has committed epoch
``n - 1 - max_lag`` (``max_lag`` 1 by default: a follower is at most one epoch behind). A follower
whose heartbeat is older than the lease's timeout is not waited for, nor one that is still
*joining* or *copying*: a follower never holds the leader while it catches up.
The **follower** runs the leader's logged plans, in order, with its own state,
and commits them in its own checkpoint. Both stage every output; each sink's epoch is published
by whichever finishes first, and the other compares its digest with the record (a difference
stops it with :class:`~eddyline.ha.selector.Diverged`). Sinks know the pair by the group's id, so
a message id or an epoch row is the same whichever driver writes it.

When the leader's lease expires (it died, or froze), the follower runs any plan the leader had
logged and it had not run yet, takes the lease, and leads from its own checkpoint; a driver
started later on the old leader's checkpoint (with the same ``--hot`` group) follows it. The old
leader, if it was only frozen, is fenced like any driver: every store refuses its writes.

A follower goes through three states, in its heartbeat, its progress records' ``driver.state``,
``eddyline status`` and ``/metrics``: **joining** when it starts; **copying** when it is more
than ``COPY_BEYOND`` epochs behind the leader's latest commit (a new replica, a former leader
started again, one that was frozen): it copies that commit and the state files it reads (hard
links on a file system, copies by the store on an object store: the files never change once
written) instead of running every plan since, and the first
plan after the copy names the copied commit as its base; then **following** once it has run an
epoch of its own (the first is slow: a cold JVM and Python workers; a follower that fell
further behind meanwhile copies again) and is within ``max_lag`` epochs of the leader. Plans of its own that it never committed are dropped first (a
former leader's: the epochs after its last commit are the new leader's).

A follower takes the lease over when the leader's lease expires, or at once when it can tell the
leader is gone: a leader on the same host whose process no longer exists. Taking it early is
safe because every store refuses an older generation's writes (docs/fencing.md). A
``nats_core`` source is not replicated (its write-ahead log is the leader's own), nor is
Delay-Process-Correct (``max_delay``) yet: both are refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from eddyline.api.network import NetworkSpec
from eddyline.control.controller import Controller
from eddyline.control.state import ControllerState
from eddyline.errors import CheckpointError, SpecError
from eddyline.ha.lease import Holding, Lease
from eddyline.ha.selector import Selector
from eddyline.runtime.checkpoint import Checkpoint
from eddyline.runtime.epoch.plan import Planner
from eddyline.runtime.epoch.records import EpochCommit, EpochPlan
from eddyline.storage import (
    create_exclusive,
    filesystem,
    makedirs,
    read_bytes,
    read_json,
    write_atomic,
)

#: how often a follower looks for the leader's next plan (and whether its lease expired); on an
#: object store, where each look is a few requests (the lease, the leader's head, its next plan)
POLL_S, STORE_POLL_S = 0.05, 0.2
#: a follower further behind the leader's latest commit than this copies it instead of running
#: the plans in between (each costs an epoch; a copy costs hard links)
COPY_BEYOND = 3
JOINING, COPYING, FOLLOWING = "joining", "copying", "following"


class HotPair:
    """This driver's side of a hot pair: the group directory and its checkpoint."""

    def __init__(self, group: str, checkpoint: str, *, timeout_s: float = 5.0, max_lag: int = 1):
        """``max_lag``: how many epochs a follower that has caught up may fall behind before the
        leader waits for it."""
        self.fs, self.dir = filesystem(group)
        self.location = group if "://" in group and not group.startswith("file://") else self.dir
        self.checkpoint = _location(checkpoint)
        self.lease = Lease(self.location, timeout_s=timeout_s, info={"checkpoint": self.checkpoint})
        self.selector = Selector(self.location, self.lease.holder)
        #: names this driver's staging area in sinks both drivers write
        self.writer = "driver-" + hashlib.sha1(self.checkpoint.encode()).hexdigest()[:8]
        self.max_lag = max_lag
        self._committed = 0
        #: this driver as a follower: joining, copying, following (see the module's docstring)
        self.state = JOINING
        #: set when this follower started from a copy of the leader's state: whose, which epoch
        self.adopted: dict[str, Any] | None = None
        self._beating: threading.Thread | None = None
        self._stop = threading.Event()
        self._beat_lock = threading.Lock()
        self._said: tuple[int, str] | None = None  # what the last heartbeat said
        self._others: list[str] = []  # the other followers' heartbeats, listed ...
        self._listed_at = 0.0  # ... then

    @staticmethod
    def check(spec: NetworkSpec) -> None:
        """Refuse what a hot pair cannot replicate, before anything runs."""
        problems = [
            f"source '{s.name}': a nats_core source cannot be replicated (its write-ahead log is the leader's own)"
            for s in spec.sources if s.kind == "nats_core"
        ]
        if spec.max_delay is not None:
            problems.append("max_delay: Delay-Process-Correct is not supported in a hot pair yet")
        if problems:
            raise SpecError(problems)

    def join(self, fingerprint: dict[str, Any]) -> str:
        """The group's id (created by the first driver); a driver of another network is refused."""
        path = f"{self.dir}/group.json"
        makedirs(self.fs, self.dir)
        create_exclusive(self.fs, path, json.dumps({"id": os.urandom(6).hex(), "network": fingerprint}).encode())
        group = read_json(self.fs, path)
        assert isinstance(group, dict)
        if group["network"] != fingerprint:
            raise CheckpointError(f"hot group {self.location!r} runs another network "
                                  f"({group['network'].get('name')!r}); use another group directory")
        if self.location == self.checkpoint:
            raise CheckpointError("--hot: the group directory must not be the checkpoint itself")
        return str(group["id"])

    # ------------------------------------------------------------------ followers' heartbeats
    def beat(self, committed: int, state: str | None = None) -> None:
        """Say which epoch this follower committed last (and its state), now and then every
        ``timeout / 3`` from a thread (an epoch may take longer than the timeout), until :meth:`close`."""
        self._committed = committed
        if state is not None:
            self.state = state
        if self._said != (committed, self.state):  # else the thread's next beat says it again
            self._write_beat()
        if self._beating is None:
            self._beating = threading.Thread(target=self._beat_loop, name="eddyline-follower", daemon=True)
            self._beating.start()

    def _write_beat(self) -> None:
        makedirs(self.fs, f"{self.dir}/followers")
        beat = {"epoch": self._committed, "at": time.time(), "holder": self.lease.holder, "state": self.state}
        with self._beat_lock:  # (the thread's beat and the planner's: one at a time, in order)
            write_atomic(self.fs, self._beat_path(self.writer), json.dumps(beat).encode())
            self._said = (self._committed, self.state)

    def _beat_path(self, writer: str) -> str:
        return f"{self.dir}/followers/{writer}.json"

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.lease.timeout_s / 3):
            with contextlib.suppress(OSError):  # a disk hiccup: the next beat
                self._write_beat()

    def close(self) -> None:
        """Stop the follower's heartbeat and remove it (a leader then stops waiting for it)."""
        self._stop.set()
        if self._beating is not None:
            self._beating.join()
            self._beating = None
            with contextlib.suppress(OSError):
                self.fs.delete_file(self._beat_path(self.writer))

    def behind(self, epoch: int) -> list[str]:
        """Live followers that have caught up and not committed ``epoch - 1 - max_lag``: the
        leader waits for them before it plans ``epoch``, so that a replica stays a warm one. One
        still joining or copying is not waited for."""
        late = []
        for beat in self.followers():
            if beat.get("state", FOLLOWING) == FOLLOWING and int(beat["epoch"]) < epoch - 1 - self.max_lag:
                late.append(f"follower {beat['holder']}")
        return late

    def followers(self) -> list[dict[str, Any]]:
        """The other drivers' live heartbeats as followers (newer than the lease's timeout)."""
        now = time.time()
        if now - self._listed_at > self.lease.timeout_s / 3:
            # who follows changes rarely: on an object store a listing at every epoch would cost
            # a LIST per epoch, so the names are listed at most every third of a lease
            found = self.fs.get_file_info(pafs.FileSelector(f"{self.dir}/followers", allow_not_found=True))
            self._others = [i.path for i in found if i.base_name.endswith(".json")
                            and i.base_name != f"{self.writer}.json"]
            self._listed_at = now
        out = []
        for path in self._others:
            try:
                beat = json.loads(read_bytes(self.fs, path))
            except (OSError, ValueError):
                continue  # being replaced, or gone
            if now - float(beat["at"]) < self.lease.timeout_s:
                out.append(beat)
        return out

    def leader(self) -> Holding | None:
        return self.lease.current()

    def describe(self, leading: bool) -> dict[str, Any]:
        if leading:
            return {**self.lease.describe(), "role": "leader"}
        cur = self.leader()
        out = {"holder": self.lease.holder, "role": "follower", "state": self.state,
               "following": cur.holder if cur else None, "generation": cur.generation if cur else None}
        if self.adopted is not None:
            out["copied_state"] = self.adopted
        return out


class Leading:
    """The leader's planner: the usual one, held back while a follower is two epochs behind."""

    poll_s = None

    def __init__(self, planner: Planner, pair: HotPair):
        self.planner, self.pair = planner, pair
        self.held: list[str] = []

    @property
    def waiting_for(self) -> list[str]:
        return [*self.planner.waiting_for, *self.held]

    def next(self, last: EpochCommit | None, elapsed_s: float, until_idle: bool) -> EpochPlan | None:
        self.held = self.pair.behind((last.epoch if last else 0) + 1)
        if self.held:
            return None
        return self.planner.next(last, elapsed_s, until_idle)


class Following:
    """The follower's planner: the leader's logged plans, one after the other; once the
    leader's lease expires, it takes the lease (``lead()`` makes the engine a leader) and plans
    with the usual planner from then on."""

    def __init__(self, planner: Planner, pair: HotPair, controller: Controller, lead: Callable[[], None],
                 checkpoint: Checkpoint):
        self.planner, self.pair, self.controller, self.lead = planner, pair, controller, lead
        self.leading = False
        #: the leader's commit this driver copied and continues from, until it ran past it
        self.adopted: EpochCommit | None = None
        #: this driver's own checkpoint (the engine's, whose gate it writes through)
        self.checkpoint = checkpoint
        last = checkpoint.latest_commit()
        done = last.epoch if last is not None else 0
        # plans of our own never committed are a former leader's: those epochs are the new leader's
        checkpoint.drop_plans_after(done)
        #: the epoch this process started from (or last copied): it follows once it ran past it
        self._ran_from = done
        # the leader sees this driver from now on, before it has even run an epoch
        pair.beat(done, JOINING)

    @property
    def poll_s(self) -> float | None:
        """A follower runs a plan as soon as the leader logged it: it looks often."""
        if self.leading:
            return None
        return POLL_S if isinstance(self.pair.fs, pafs.LocalFileSystem) else STORE_POLL_S

    @property
    def waiting_for(self) -> list[str]:
        return self.planner.waiting_for if self.leading else ["the leader"]

    def next(self, last: EpochCommit | None, elapsed_s: float, until_idle: bool) -> EpochPlan | None:
        if self.leading:
            return self._after_adopted(self.planner.next(self._from(last), elapsed_s, until_idle))
        start = self._from(last)
        done = start.epoch if start else 0
        cur = self.pair.leader()
        theirs = (cur.info or {}).get("checkpoint") if cur is not None else None
        if theirs and theirs != self.pair.checkpoint:
            leader = Checkpoint(theirs)
            done = self._catch_up(leader, done)
            plan = self._plan_of(leader, done + 1)
            if plan is not None:
                if plan.control:  # decide on from where the leader's controller was
                    self.controller.restore(ControllerState.model_validate(plan.control))
                return self._after_adopted(plan)
        else:
            self.pair.beat(done)
        dead = cur is not None and gone(cur)
        if (cur is None or cur.expires_at <= time.time() or dead) and self.pair.lease.try_acquire(force=dead):
            self.leading = True
            self.pair.close()  # no longer a follower: the new leader waits for nobody
            self.lead()
            return self._after_adopted(self.planner.next(self._from(last), elapsed_s, until_idle))
        return None

    def _catch_up(self, leader: Checkpoint, done: int) -> int:
        """Copy the leader's latest commit if it is more than ``COPY_BEYOND`` epochs ahead (a
        new follower, or one that was frozen), and be *following* once within ``max_lag`` of it
        (the leader waits for it from then on). Returns the epoch this driver continues from."""
        newest = leader.latest_commit()
        ahead = newest.epoch if newest is not None else 0
        if ahead - done > COPY_BEYOND and newest is not None:
            self.pair.beat(done, COPYING)
            if self._adopt(leader, newest):
                done = self._ran_from = ahead
        # following once it has run an epoch of its own since it started or copied: its first one
        # is slow (a cold JVM and Python workers), and the leader would wait for it meanwhile
        warm = done > self._ran_from or ahead == 0
        self.pair.beat(done, FOLLOWING if warm and ahead - done <= self.pair.max_lag else None)
        return done

    def _from(self, last: EpochCommit | None) -> EpochCommit | None:
        """The commit this driver continues from: its own last, or a newer one it copied."""
        if self.adopted is not None and (last is None or last.epoch < self.adopted.epoch):
            return self.adopted
        return last

    def _after_adopted(self, plan: EpochPlan | None) -> EpochPlan | None:
        """The first plan after a copied commit names it as its base: the engine continues from
        that commit, not from the one it last ran (as a correction of Delay-Process-Correct does)."""
        if plan is not None and self.adopted is not None and plan.epoch == self.adopted.epoch + 1 and plan.base is None:
            return dataclasses.replace(plan, base=self.adopted.epoch)
        return plan

    def _adopt(self, leader: Checkpoint, newest: EpochCommit) -> bool:
        """Copy the leader's commit ``newest`` and the state it reads into our checkpoint; if the
        leader deleted a file of it meanwhile (it moved on), the next poll copies a newer one."""
        try:
            self.checkpoint.adopt(leader, newest)
        except FileNotFoundError:
            return False
        self.adopted = newest
        self.pair.adopted = {"checkpoint": leader.location, "epoch": newest.epoch}
        return True

    def _plan_of(self, leader: Checkpoint, epoch: int) -> EpochPlan | None:
        try:
            return leader.read_plan(epoch)
        except FileNotFoundError:
            pass
        newest = leader.latest_commit()
        if newest is not None and newest.epoch > epoch:  # fell out of the kept plans: copy, then follow
            self.pair.beat(epoch - 1, COPYING)
            self._adopt(leader, newest)
        return None


def _location(where: str) -> str:
    """A checkpoint's location as both drivers name it (in the lease): an absolute path, or the URI."""
    if "://" in where and not where.startswith("file://"):
        return where.rstrip("/")
    return os.path.abspath(where.removeprefix("file://"))


def gone(holder: Holding) -> bool:
    """Whether the lease's holder is known to be gone: a process on this host that no longer
    exists (a holder is named ``host:pid:random``). Anything else may be alive: only its lease's
    expiry tells."""
    host, _, rest = holder.holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's process: alive
        return False
    return False
