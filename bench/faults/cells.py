"""The cells of the fault matrix: one fault applied to one run of the network of :mod:`.harness`,
and what recovers from it. :func:`run_cell` runs a cell and verifies its sinks.

A run is ``eddyline run --until-idle`` (the leader), as a user would start it. A fault from the
outside comes once the leader has committed ``FAULT_AFTER`` epochs, as soon as the next epoch's
plan is logged (so it lands inside an epoch); the test hooks ``--crash-at`` / ``--freeze-at``
land exactly at a stage boundary of a chosen epoch. A driver that dies is started again with a
plain ``eddyline run`` (it takes the lease at once); a frozen driver is replaced by a standby
(``--standby``, started beside it and waiting) that takes over once the lease expires, and is
woken afterwards: it must stop ("taken over") without writing anything.

The hot cells run a hot pair (``eddyline run --hot GROUP``, each driver on a checkpoint of its
own: the leader's is the cell's ``ckpt``, the follower's ``ckpt-b``) and apply the fault once the
follower has caught up and the leader has committed once more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eddyline.storage import staging_leftovers

from .harness import (
    MOVE_EVERY,
    CellError,
    Driver,
    Outputs,
    Servers,
    Setup,
    SinkCheck,
    SinkRows,
    Watch,
    network,
    read_outputs,
    verify,
    wait_until,
    write_spec,
    zombie_writes,
)

#: outside faults come once this many epochs are committed
FAULT_AFTER = 3
#: the epoch a crash point inside a key-group move is aimed at (the relocation drill changes the
#: routing every MOVE_EVERY epochs), and the epochs for the commit and publish points
MOVE_EPOCH = 3 * MOVE_EVERY
COMMIT_EPOCH = 8
PUBLISH_EPOCH = 7
#: how long a stopped or killed server stays away (below the sources' and sinks' retry budget)
DOWN_S = 6.0
#: the lease's timeout: a standby takes over this long after the leader's last renewal
LEASE_S = 3.0
#: the epochs of plans a leader keeps (the network's ``history``) in the cell whose follower
#: falls out of them (otherwise the default, 10, of a 12-epoch input)
KEPT = 2


@dataclass
class Ctx:
    """One cell's run: its directory, drivers, the checkpoint watch, when the fault began and
    when what it took away was back."""

    setup: Setup
    servers: Servers
    directory: Path
    out: Outputs
    master: str = "local[2]"
    cluster: Any = None  # tests.runtime.e2e.standalone.Cluster, for the executor cell
    drivers: list[Driver] = field(default_factory=list)
    watches: list[Watch] = field(default_factory=list)  # of other checkpoints (a hot pair's follower)
    timed: Watch | None = None  # the checkpoint whose commits time the recovery (None: ``ckpt``'s)
    fault_at: float | None = None
    back_at: float | None = None  # the server restarted / resumed; None: at once
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.spec = write_spec(self.directory / "net.yaml", self.setup, self.out)
        self.ckpt = self.directory / "ckpt"
        self.watch = Watch(self.ckpt)
        self.watch.start()

    def driver(self, name: str, *extra: str, ckpt: Path | None = None) -> Driver:
        d = Driver(name, self.directory, self.spec, ckpt or self.ckpt, self.master, LEASE_S, *extra)
        self.drivers.append(d)
        return d

    def leader(self, *extra: str) -> Driver:
        d = self.driver("leader", *extra)
        wait_until(lambda: (self.ckpt / "lease").is_dir() and any((self.ckpt / "lease").iterdir()), 180,
                   "the leader's lease", alive=lambda: d.proc.poll() is None)
        return d

    def mid_epoch(self, who: Driver) -> int:
        """Wait until ``FAULT_AFTER`` epochs are committed and the next one's plan is logged."""
        wait_until(lambda: self.watch.last_commit >= FAULT_AFTER, 300, f"commit {FAULT_AFTER}",
                   alive=lambda: who.proc.poll() is None)
        e = self.watch.last_commit + 1
        wait_until(lambda: e in self.watch.plans, 60, f"epoch {e}'s plan", alive=lambda: who.proc.poll() is None)
        return e

    def watch_also(self, ckpt: Path) -> Watch:
        w = Watch(ckpt)
        w.start()
        self.watches.append(w)
        return w

    def fault(self) -> None:
        self.fault_at = time.time()

    def back(self) -> None:
        self.back_at = time.time()

    def died(self, d: Driver, timeout_s: float = 300) -> None:
        wait_until(lambda: d.proc.poll() is not None, timeout_s, f"{d.name} to die")

    def finish(self, timeout_s: float = 400) -> None:
        deadline = time.monotonic() + timeout_s
        for d in self.drivers:
            try:
                d.proc.wait(max(1.0, deadline - time.monotonic()))
            except Exception:
                self.problems.append(f"{d.name} still running after {timeout_s:.0f} s")

    def expect(self, d: Driver, ok: Callable[[int | None, str], bool], what: str) -> None:
        rc = d.proc.poll()
        if not ok(rc, d.err()):
            self.problems.append(f"{d.name}: expected {what}, got exit {rc}: {d.last_error()}")

    def close(self) -> None:
        for d in self.drivers:
            if d.proc.poll() is None:
                self.problems.append(f"{d.name} had to be killed")
            d.end()
        for w in [self.watch, *self.watches]:
            w.stop()


EXITED_0 = (lambda rc, err: rc == 0, "exit 0")
KILLED = (lambda rc, err: rc == -signal.SIGKILL, "death by SIGKILL")
FENCED = (lambda rc, err: rc not in (0, None) and "taken over" in err, "a non-zero exit saying it was taken over")
TOOK_OVER = (lambda rc, err: rc == 0 and "lease generation 2" in err, "exit 0 under lease generation 2")


# ---------------------------------------------------------------------------- the cells' runs


def driver_kill(ctx: Ctx) -> None:
    """SIGKILL to the leader inside an epoch, then ``eddyline run`` again."""
    leader = ctx.leader()
    e = ctx.mid_epoch(leader)
    ctx.fault()
    leader.signal(signal.SIGKILL)
    ctx.died(leader)
    again = ctx.driver("restarted")
    ctx.notes.append(f"killed in epoch {e}")
    ctx.finish()
    ctx.expect(leader, *KILLED)
    ctx.expect(again, *TOOK_OVER)


def standby(ctx: Ctx) -> Driver:
    """A ``--standby`` on the checkpoint, started now; not waited for."""
    return ctx.driver("standby", "--standby")


def fenced(ctx: Ctx, leader: Driver, standby: Driver) -> None:
    """The leader is frozen (``ctx.fault_at`` set): the standby takes over once the lease has
    expired; once it has committed, the leader (its whole process tree) is woken and must stop
    without writing anything."""
    wait_until(lambda: any(c["generation"] >= 2 for c in ctx.watch.commits.values()), 300,
               "a commit by the standby", alive=lambda: standby.proc.poll() is None)
    time.sleep(1.0)
    signal_tree(leader, signal.SIGCONT)
    ctx.finish()
    ctx.expect(leader, *FENCED)
    ctx.expect(standby, *TOOK_OVER)


def signal_tree(d: Driver, sig: int) -> None:
    """``sig`` to a driver and every process it started (the tree as last seen)."""
    d.remember_tree()
    for pid in [d.pid, *d.tree]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def driver_freeze(ctx: Ctx) -> None:
    """SIGSTOP to the leader's whole process tree (its Python, its JVM, Spark's Python workers:
    a paused machine) inside an epoch, past the lease; a standby takes over; then SIGCONT."""
    leader = ctx.leader()
    waiting = standby(ctx)
    wait_until(lambda: "waiting for its lease to expire" in waiting.err(), 300, "the standby to wait",
               alive=lambda: waiting.proc.poll() is None)
    e = ctx.mid_epoch(leader)
    ctx.fault()
    signal_tree(leader, signal.SIGSTOP)
    ctx.notes.append(f"frozen in epoch {e} ({1 + len(leader.tree)} processes)")
    fenced(ctx, leader, waiting)


def cluster_leader(ctx: Ctx) -> tuple[Any, Driver, int]:
    """The leader on the two-worker cluster, once both executors run, inside an epoch: (the
    cluster, the leader, the epoch)."""
    cluster = ctx.cluster
    leader = ctx.leader()
    wait_until(lambda: len(list(cluster.work.glob("app-*/*/stderr"))) >= 2, 120, "two executors",
               alive=lambda: leader.proc.poll() is None)
    return cluster, leader, ctx.mid_epoch(leader)


def executor_kill(ctx: Ctx) -> None:
    """On the two-worker standalone cluster: SIGKILL to a worker (its JVM, its executor's JVM and
    Python workers) inside an epoch. A new worker is started in its place."""
    cluster, leader, e = cluster_leader(ctx)
    ctx.fault()
    had = len(cluster.executors(0))
    killed = cluster.kill_worker(0)
    ctx.notes.append(f"worker killed in epoch {e} ({len(killed)} processes, {had} executor JVM)")
    ctx.finish()
    ctx.expect(leader, *EXITED_0)
    if "Lost executor" not in leader.err() and "ExecutorLost" not in leader.err():
        ctx.notes.append("the driver's log does not show the executor lost")


def executor_freeze(ctx: Ctx) -> None:
    """On the two-worker cluster: SIGSTOP to one executor (its JVM and Python workers) inside an
    epoch for ``DOWN_S``, then SIGCONT: shorter than Spark's executor heartbeat timeout, so its
    tasks wait and finish late; nothing is lost or run twice."""
    import psutil

    cluster, leader, e = cluster_leader(ctx)
    wait_until(lambda: cluster.executors(0), 60, "an executor on worker 0", alive=lambda: leader.proc.poll() is None)
    procs = [q for p in cluster.executors(0) for q in [p, *p.children(recursive=True)]]
    ctx.fault()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.suspend()
    time.sleep(DOWN_S)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.resume()
    ctx.notes.append(f"executor frozen {DOWN_S:.0f} s in epoch {e} ({len(procs)} processes)")
    ctx.finish()
    ctx.expect(leader, *EXITED_0)


def worker_restart(ctx: Ctx) -> None:
    """On the two-worker cluster: SIGTERM to a worker inside an epoch (a clean stop, as in a
    rolling restart: it stops its executor), and a new worker started in its place."""
    cluster, leader, e = cluster_leader(ctx)
    ctx.fault()
    had = len(cluster.executors(0))
    took = cluster.restart_worker(0)
    ctx.notes.append(f"worker stopped in epoch {e} ({had} executor JVM; it exited {took:.1f} s after SIGTERM)")
    ctx.finish()
    ctx.expect(leader, *EXITED_0)


def server_fault(server: str, sig: int) -> Callable[[Ctx], None]:
    """SIGKILL (then started again on the same port and store) or SIGSTOP (then SIGCONT) to the
    NATS server, the Kafka broker or every PostgreSQL process, for ``DOWN_S`` seconds inside an epoch."""

    def run(ctx: Ctx) -> None:
        s = ctx.servers
        leader = ctx.leader()
        e = ctx.mid_epoch(leader)
        ctx.fault()
        broker = s.nats if server == "nats" else s.kafka if server == "kafka" else None
        if broker is not None:
            if sig == signal.SIGKILL:
                broker.kill()
            else:
                broker.pause()
        elif not s.pg_signal(sig):
            raise CellError("no PostgreSQL process to signal")
        time.sleep(DOWN_S)
        if broker is not None:
            if sig == signal.SIGKILL:
                broker.start()
            else:
                broker.resume()
        elif sig == signal.SIGKILL:
            s.pg.restart()  # crash recovery from its WAL
        else:
            s.pg_signal(signal.SIGCONT)
        ctx.back()
        ctx.notes.append(f"in epoch {e}")
        ctx.finish()
        ctx.expect(leader, *EXITED_0)
        retried = [x for x in leader.progress_records() for part in x.get("sources", []) + x.get("sinks", [])
                   if part.get("retries", 0) > 0]
        if not retried:
            ctx.notes.append("no retry shown in the progress")

    return run


def point_crash(epoch: int, point: str) -> Callable[[Ctx], None]:
    """``--crash-at EPOCH:POINT`` (SIGKILL there), then ``eddyline run`` again."""

    def run(ctx: Ctx) -> None:
        leader = ctx.leader("--crash-at", f"{epoch}:{point}")
        ctx.died(leader)
        ctx.fault()  # (when the harness saw it dead: a few ms after the point)
        again = ctx.driver("restarted")
        ctx.finish()
        ctx.expect(leader, *KILLED)
        ctx.expect(again, *TOOK_OVER)

    return run


def point_freeze(epoch: int, point: str) -> Callable[[Ctx], None]:
    """``--freeze-at EPOCH:POINT`` (SIGSTOP to the driver's Python there) with a standby
    started beside the leader: it takes over, then SIGCONT."""

    def run(ctx: Ctx) -> None:
        leader = ctx.leader("--freeze-at", f"{epoch}:{point}")
        waiting = standby(ctx)
        wait_until(leader.stopped, 300, "the leader to freeze", alive=lambda: leader.proc.poll() is None)
        ctx.fault()
        if "waiting for its lease to expire" not in waiting.err():
            ctx.notes.append("the standby was not yet waiting when the leader froze")
        fenced(ctx, leader, waiting)

    return run


def hot_pair(ctx: Ctx) -> tuple[Driver, Driver, Watch]:
    """A leader and a follower of a hot pair; returns once the follower has caught up (at most
    one epoch behind, ``FAULT_AFTER`` epochs committed) and the leader has committed once more,
    as the leader's next plan is logged (so a fault lands inside an epoch). Also the follower's
    checkpoint's watch."""
    group = ctx.directory / "group"
    leader = ctx.driver("leader", "--hot", str(group))
    wait_until(lambda: "leading as" in leader.err(), 180, "the leader to lead", alive=lambda: leader.proc.poll() is None)
    fw = ctx.watch_also(ctx.directory / "ckpt-b")
    follower = ctx.driver("follower", "--hot", str(group), ckpt=ctx.directory / "ckpt-b")

    def both() -> bool:
        return leader.proc.poll() is None and follower.proc.poll() is None

    wait_until(lambda: "following" in follower.err(), 180, "the follower to follow", alive=both)
    lw = ctx.watch
    wait_until(lambda: fw.last_commit >= FAULT_AFTER and fw.last_commit >= lw.last_commit - 1, 300,
               "the follower to catch up", alive=both)
    led = lw.last_commit
    wait_until(lambda: lw.last_commit > led, 120, "one more commit of the leader", alive=both)
    e = lw.last_commit + 1
    wait_until(lambda: e in lw.plans, 60, f"the leader's plan of epoch {e}", alive=both)
    if any(c["end_of_stream"] for c in lw.commits.values()):
        raise CellError("the leader reached the end of the stream before the fault")
    ctx.notes.append(f"in the leader's epoch {e} (follower at commit {fw.last_commit})")
    return leader, follower, fw


def output_times(ctx: Ctx) -> list[float]:
    """When each files sink's epoch was written (its directory's last change, just before its publish)."""
    return sorted(p.stat().st_mtime for kind in ("raw", "win") for p in (ctx.out.directory / kind).glob("epoch=*"))


def held(w: Watch, after: float) -> str:
    """The longest a leader waited between a commit (from ``after`` on) and its next plan: it
    waits there for a live follower two epochs behind (unheld, the next plan follows at once)."""
    waits = [(w.plans[e + 1] - c["at"], e) for e, c in w.commits.items() if c["at"] > after and e + 1 in w.plans]
    if not waits:
        return "–"
    wait, e = max(waits)
    return f"{max(0.0, wait):.1f} s (before epoch {e + 1})"


def hot_leader_kill(ctx: Ctx) -> None:
    """SIGKILL to the leader's process tree once the follower has caught up: the follower takes
    the lease over and leads on from its own checkpoint."""
    leader, follower, fw = hot_pair(ctx)
    ctx.timed = fw
    ctx.fault()
    signal_tree(leader, signal.SIGKILL)
    ctx.died(leader)
    ctx.finish()
    ctx.expect(leader, *KILLED)
    ctx.expect(follower, *EXITED_0)
    assert ctx.fault_at is not None
    own = sorted((c["at"], e) for e, c in fw.commits.items() if c["generation"] >= 2)
    if own:
        ctx.notes.append(f"the follower's first epoch under its own lease: {own[0][1]}, "
                         f"{own[0][0] - ctx.fault_at:.1f} s after the kill")
    else:
        ctx.problems.append("no commit of the follower under lease generation 2")
    times = output_times(ctx)
    before = [t for t in times if t < ctx.fault_at]
    after = [t for t in times if t >= ctx.fault_at]
    if before and after:
        ctx.notes.append(f"output gap {after[0] - before[-1]:.1f} s (files sinks; first output "
                         f"{after[0] - ctx.fault_at:.1f} s after the kill)")


def hot_follower_kill(ctx: Ctx) -> None:
    """SIGKILL to the follower's process tree: the leader stops waiting for it once its
    heartbeat is older than the lease timeout, and goes on; once the leader has committed again,
    the follower is started again on its checkpoint and must rejoin and follow to the end."""
    leader, follower, fw = hot_pair(ctx)
    ctx.fault()
    signal_tree(follower, signal.SIGKILL)
    ctx.died(follower)
    at, had = fw.last_commit, ctx.watch.last_commit
    wait_until(lambda: ctx.watch.last_commit > had, 120, "the leader to commit without its follower",
               alive=lambda: leader.proc.poll() is None)
    again = ctx.driver("follower again", "--hot", str(ctx.directory / "group"), ckpt=fw.ckpt)
    started = ctx.watch.last_commit
    ctx.finish()
    ctx.expect(follower, *KILLED)
    ctx.expect(leader, *EXITED_0)
    ctx.expect(again, *EXITED_0)
    assert ctx.fault_at is not None
    ctx.notes.append(f"the follower was killed at commit {at}; started again as the leader committed {started}, "
                     f"it followed to commit {fw.last_commit}")
    ctx.notes.append(f"the leader's longest wait to plan after the kill: {held(ctx.watch, ctx.fault_at)}")


def hot_follower_join(ctx: Ctx) -> None:
    """A hot leader alone; once it has committed, a follower is started beside it: it copies the
    leader's latest commit (rather than run every plan since epoch 1) and the leader does not
    wait for it while it joins: the longest time between two of the leader's commits from the
    follower's start to its first commit, against the leader's commits before."""
    group = ctx.directory / "group"
    leader = ctx.driver("leader", "--hot", str(group))
    wait_until(lambda: ctx.watch.last_commit >= 1, 180, "the leader's first commit", alive=lambda: leader.proc.poll() is None)
    fw = ctx.watch_also(ctx.directory / "ckpt-b")
    ctx.fault()  # (the "fault": the follower's start)
    started = time.time()
    follower = ctx.driver("follower", "--hot", str(group), ckpt=ctx.directory / "ckpt-b")
    wait_until(lambda: fw.last_commit >= 1, 300, "the follower's first commit", alive=lambda: follower.proc.poll() is None)
    if leader.proc.poll() is not None:
        raise CellError("the leader ended before the follower joined")
    first = min(fw.commits)
    joined = fw.commits[first]["at"]
    at = sorted(c["at"] for c in ctx.watch.commits.values())
    steady = sorted(b - a for a, b in zip(at, at[1:], strict=False) if a > joined or b < started)
    pause = max((b - a for a, b in zip(at, at[1:], strict=False) if b > started and a < joined), default=0.0)
    ctx.notes.append(f"the follower joined at epoch {first} ({joined - started:.1f} s after its start, from a copy of "
                     f"commit {first - 1}); the leader's longest time between commits meanwhile {pause:.1f} s "
                     f"(steady {steady[len(steady) // 2] if steady else float('nan'):.1f} s)")
    ctx.finish()
    ctx.expect(leader, *EXITED_0)
    ctx.expect(follower, *EXITED_0)


def hot_follower_freeze(ctx: Ctx) -> None:
    """SIGSTOP to the follower's process tree for ``DOWN_S`` (past the lease timeout), then
    SIGCONT: the leader goes on meanwhile; the follower catches up, by replaying the leader's
    plans or, further behind than the leader keeps them, from a copy of its latest state."""
    leader, follower, fw = hot_pair(ctx)
    ctx.fault()
    signal_tree(follower, signal.SIGSTOP)
    at, had = fw.last_commit, ctx.watch.last_commit
    time.sleep(DOWN_S)
    signal_tree(follower, signal.SIGCONT)
    ctx.notes.append(f"follower frozen {DOWN_S:.0f} s at commit {at} ({1 + len(follower.tree)} processes); the "
                     f"leader went from commit {had} to {ctx.watch.last_commit} meanwhile")
    ctx.finish()
    ctx.expect(leader, *EXITED_0)
    rc = follower.proc.poll()
    if rc == 0:
        plans = [json.loads(p.read_text()) for p in sorted((ctx.directory / "ckpt-b" / "plans").glob("*.json"))]
        copied = [p["base"] for p in plans if p.get("base")]
        how = f", from a copy of the leader's commit {copied[0]}" if copied else ", replaying the leader's plans"
        ctx.notes.append(f"the follower caught up{how}, and ended (exit 0) at commit {fw.last_commit}")
    else:
        ctx.problems.append(f"follower: expected exit 0, got exit {rc}: {follower.last_error()}")
    assert ctx.fault_at is not None
    ctx.notes.append(f"the leader's longest wait to plan after the freeze: {held(ctx.watch, ctx.fault_at)}")


def epochs(ckpt: Path, kind: str) -> list[int]:
    """The epochs of the plans or commits a checkpoint holds now (the engine deletes old ones)."""
    return sorted(int(p.stem) for p in (ckpt / kind).glob("*.json") if p.stem.isdigit())


def hot_follower_left_behind(ctx: Ctx) -> None:
    """A hot pair whose network keeps ``KEPT`` epochs of plans (``history``); SIGSTOP to the
    follower's process tree until the leader no longer keeps the plans it needs next, then
    SIGCONT: the follower must copy the leader's latest commit and its state and follow on."""
    ctx.spec.write_text(yaml.safe_dump({**network(ctx.setup, ctx.out), "history": KEPT}))
    leader, follower, fw = hot_pair(ctx)
    ctx.fault()
    signal_tree(follower, signal.SIGSTOP)
    at, had = max(epochs(fw.ckpt, "commits"), default=0), ctx.watch.last_commit
    # it needs the plan of epoch at + 1 next (at + 2 if it had read that one already)
    wait_until(lambda: min(epochs(ctx.ckpt, "plans"), default=0) > at + 2, 120,
               f"the leader to drop its plan of epoch {at + 2}", alive=lambda: leader.proc.poll() is None)
    kept = epochs(ctx.ckpt, "plans")
    assert ctx.fault_at is not None
    woke = time.time()
    signal_tree(follower, signal.SIGCONT)
    if any(c["end_of_stream"] for c in ctx.watch.commits.values()):
        raise CellError("the leader reached the end of the stream before the follower was woken")
    ctx.notes.append(f"follower frozen {woke - ctx.fault_at:.1f} s at commit {at} ({1 + len(follower.tree)} "
                     f"processes) while the leader went from commit {had} to {ctx.watch.last_commit}, keeping "
                     f"(history: {KEPT}) plans {kept[0]}–{kept[-1]} only")
    ctx.finish()
    ctx.expect(leader, *EXITED_0)
    ctx.expect(follower, *EXITED_0)
    records = follower.progress_records()
    copied = [r["driver"]["copied_state"] for r in records if "copied_state" in (r.get("driver") or {})]
    if copied:
        e, ran = copied[0]["epoch"], {r["batchId"] for r in records}
        skipped = [x for x in range(1, e + 1) if x not in ran]
        after = fw.commits.get(e + 1)
        ctx.notes.append(f"the follower went on from a copy of the leader's commit {e} (driver.copied_state in its "
                         f"progress; it never ran epochs {skipped[0]}–{skipped[-1]})" if skipped else
                         f"the follower copied the leader's commit {e} (driver.copied_state in its progress)")
        ctx.notes.append((f"its epoch {e + 1} committed {after['at'] - woke:.1f} s after SIGCONT; " if after else "")
                         + f"it ended at commit {fw.last_commit}")
    else:
        ctx.problems.append("the follower's progress records show no copy of the leader's state (driver.copied_state)")
    # an epoch the leader had committed whose files-sink directory was put in place again after SIGCONT
    done = {e for e, c in ctx.watch.commits.items() if c["at"] < woke}
    again = sorted({e for kind in ("raw", "win") for d in (ctx.out.directory / kind).glob("epoch=*")
                    if (e := int(d.name.partition("=")[2])) in done and d.stat().st_ctime >= woke})
    if again:
        ctx.notes.append(f"the follower published epoch {', '.join(map(str, again))} again after SIGCONT (the files "
                         "sinks' directories replaced): the leader's cleanup had dropped its stream selector records")
    ctx.notes.append(f"the leader's longest wait to plan after the freeze: {held(ctx.watch, ctx.fault_at)}")


# ---------------------------------------------------------------------------- the matrix


@dataclass(frozen=True)
class Cell:
    target: str
    mode: str
    how: str
    run: Callable[[Ctx], None]
    cluster: bool = False
    #: the Kafka network: input from a Kafka topic, Kafka sinks (see :mod:`.harness`)
    kafka: bool = False
    #: read the input at a third of the rate (the same records, so the same output): the cell
    #: starts a second driver whose JVM and first, cold epoch must come before the input ends
    slow_input: bool = False

    @property
    def key(self) -> str:
        return f"{self.target} × {self.mode}"


KILL, STOP = "SIGKILL → restart", "SIGSTOP → SIGCONT"

CELLS: list[Cell] = [
    Cell("driver", KILL, "SIGKILL to the leader inside an epoch, then `eddyline run` again", driver_kill),
    Cell("driver", STOP, f"SIGSTOP to the leader's process tree inside an epoch; a `--standby` takes over "
         f"after the lease ({LEASE_S:.0f} s); SIGCONT: the old leader must stop, fenced", driver_freeze, slow_input=True),
    Cell("executor (2-worker cluster)", "SIGKILL", "SIGKILL to one of the two standalone workers with its executor "
         "inside an epoch (a new worker is started)", executor_kill, cluster=True),
    Cell("executor (2-worker cluster)", STOP, f"SIGSTOP to one worker's executor (JVM and Python workers) inside "
         f"an epoch, SIGCONT {DOWN_S:.0f} s later", executor_freeze, cluster=True),
    Cell("worker (2-worker cluster)", "SIGTERM → new worker", "SIGTERM to one of the two standalone workers inside "
         "an epoch (it stops its executor), and a new worker started in its place", worker_restart, cluster=True),
    Cell("NATS server", KILL, f"SIGKILL inside an epoch, started again {DOWN_S:.0f} s later (same port and store)",
         server_fault("nats", signal.SIGKILL)),
    Cell("NATS server", STOP, f"SIGSTOP inside an epoch, SIGCONT {DOWN_S:.0f} s later",
         server_fault("nats", signal.SIGSTOP)),
    Cell("PostgreSQL", KILL, f"SIGKILL to every PostgreSQL process inside an epoch, started again {DOWN_S:.0f} s "
         "later (crash recovery)", server_fault("pg", signal.SIGKILL)),
    Cell("PostgreSQL", STOP, f"SIGSTOP to every PostgreSQL process inside an epoch, SIGCONT {DOWN_S:.0f} s later",
         server_fault("pg", signal.SIGSTOP)),
    Cell("key-group move", KILL, f"`--crash-at {MOVE_EPOCH}:in_task` (epoch {MOVE_EPOCH} moves 2 key groups; "
         "a lane has written its state), then `eddyline run` again", point_crash(MOVE_EPOCH, "in_task")),
    Cell("key-group move", f"{STOP} (standby)", f"`--freeze-at {MOVE_EPOCH}:in_task` (the driver stops while a "
         "lane writes a moved key group's state); a `--standby` takes over; SIGCONT: the old leader must stop, fenced",
         point_freeze(MOVE_EPOCH, "in_task")),
    Cell("commit", KILL, f"`--crash-at {COMMIT_EPOCH}:mid_commit` (commit written, not yet in place), "
         "then `eddyline run` again", point_crash(COMMIT_EPOCH, "mid_commit")),
    Cell("commit", f"{STOP} (standby)", f"`--freeze-at {COMMIT_EPOCH}:mid_commit`; a `--standby` takes over; "
         "SIGCONT: the old leader must not put its commit in place", point_freeze(COMMIT_EPOCH, "mid_commit")),
    Cell("publish", KILL, f"`--crash-at {PUBLISH_EPOCH}:mid_publish` (a sink has published part of the epoch), "
         "then `eddyline run` again", point_crash(PUBLISH_EPOCH, "mid_publish")),
    Cell("publish", f"{STOP} (standby)", f"`--freeze-at {PUBLISH_EPOCH}:after_stage` (its lease checked, every "
         "output staged, nothing published); a `--standby` takes over and publishes the epoch; SIGCONT: the old "
         "leader wakes straight into its publish, which every store must refuse", point_freeze(PUBLISH_EPOCH, "after_stage")),
    Cell("Kafka → Kafka: driver", KILL, "the Kafka network (a topic in, a Kafka sink of each output, one transaction "
         "an epoch): SIGKILL to the leader inside an epoch, then `eddyline run` again", driver_kill, kafka=True),
    Cell("Kafka → Kafka: publish", KILL, f"the Kafka network: `--crash-at {PUBLISH_EPOCH}:mid_publish` (a Kafka "
         "sink's transaction cut in the middle), then `eddyline run` again", point_crash(PUBLISH_EPOCH, "mid_publish"),
         kafka=True),
    Cell("Kafka broker (Tansu, log on S3)", KILL, f"the Kafka network: SIGKILL to the broker inside an epoch, "
         f"started again {DOWN_S:.0f} s later (same port and log)", server_fault("kafka", signal.SIGKILL), kafka=True),
    Cell("Kafka broker (Tansu, log on S3)", STOP, f"the Kafka network: SIGSTOP to the broker inside an epoch, "
         f"SIGCONT {DOWN_S:.0f} s later (past the clients' 5 s request timeout)", server_fault("kafka", signal.SIGSTOP),
         kafka=True),
    Cell("hot leader", "SIGKILL (follower takes over)", "a hot pair (`--hot`, a checkpoint each); once the follower "
         "has caught up, SIGKILL to the leader's process tree inside an epoch; the follower takes the lease over "
         "(timed to the follower's next commit)", hot_leader_kill, slow_input=True),
    Cell("hot follower (replica)", KILL, "a hot pair; once the follower has caught up, SIGKILL to its process "
         "tree; the leader must go on (timed to the leader's next commit); once it has committed again, the "
         "follower is started again and must follow to the end", hot_follower_kill, slow_input=True),
    Cell("hot follower (replica)", "joins mid-run", "a hot leader alone; after its first commit a follower is started "
         "beside it: it must copy the leader's latest commit, not hold the leader while it joins, and follow to the "
         "end", hot_follower_join, slow_input=True),
    Cell("hot follower (replica)", STOP, f"a hot pair; once the follower has caught up, SIGSTOP to its process tree "
         f"for {DOWN_S:.0f} s (past the {LEASE_S:.0f} s lease), then SIGCONT; the leader must go on, the follower "
         "catch up (from the leader's plans, or from a copy of its state if it fell out of them)", hot_follower_freeze, slow_input=True),
    Cell("hot follower (replica)", f"{STOP}, past the kept plans", f"a hot pair whose network keeps {KEPT} epochs of "
         f"plans (`history: {KEPT}`; the reference keeps 10); once the follower has caught up, SIGSTOP to its process tree "
         "until the leader has dropped the plans it needs next, then SIGCONT; the leader must go on, the follower "
         "copy the leader's latest commit and its state and follow on", hot_follower_left_behind, slow_input=True),
]

#: rows of the issue's matrix that have no cell yet
NOT_RUN: dict[str, str] = {}


@dataclass
class Result:
    target: str
    mode: str
    how: str
    status: str  # pass | FAIL | error
    checks: list[SinkCheck] = field(default_factory=list)
    recovery_s: float | None = None
    outage_s: float = 0.0
    next_commit: int | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: what the drivers the lease was taken from wrote visibly after it was taken (None: no takeover)
    zombie_writes: int | None = None

    @property
    def lost(self) -> int:
        return sum(c.lost for c in self.checks)

    @property
    def duplicated(self) -> int:
        return sum(c.duplicated for c in self.checks)

    @property
    def identical(self) -> bool:
        return bool(self.checks) and all(c.identical for c in self.checks)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Result:
        return cls(d["target"], d["mode"], d["how"], d["status"], [SinkCheck(**c) for c in d["sinks"]],
                   d["recovery_s"], d["outage_s"], d["next_commit"], d["notes"], d["seconds"], d.get("zombie_writes"))

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target, "mode": self.mode, "how": self.how, "status": self.status,
            "lost": self.lost, "duplicated": self.duplicated, "identical": self.identical,
            "recovery_s": self.recovery_s, "outage_s": round(self.outage_s, 2), "next_commit": self.next_commit,
            "notes": self.notes, "seconds": round(self.seconds, 1), "sinks": [c.__dict__ for c in self.checks],
            "zombie_writes": self.zombie_writes,
        }


def run_cell(c: Cell, setup: Setup, servers: Servers, directory: Path, reference: SinkRows | None,
             expected: list, cluster: Any = None) -> Result:
    """Run one cell in ``directory`` and verify every sink against the input and ``reference``."""
    directory.mkdir(parents=True, exist_ok=True)
    name = "c" + "".join(ch for ch in directory.name.lower() if ch.isalnum())[:20]
    if c.slow_input:
        setup = dataclasses.replace(setup, per_epoch=max(1, setup.per_epoch // 3))
    ctx = Ctx(setup, servers, directory, Outputs(directory / "out", name),
              master=cluster.url if c.cluster else "local[2]", cluster=cluster)
    t0 = time.monotonic()
    error = None
    try:
        c.run(ctx)
    except CellError as e:
        error = str(e)
    except Exception as e:  # a bug of the harness: say so, go on with the next cell
        error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        ctx.close()
        servers.heal()
    result = Result(c.target, c.mode, c.how, "error" if error else "pass", seconds=time.monotonic() - t0,
                    notes=list(ctx.notes))
    if error:
        result.notes.append(f"harness: {error}")
        result.notes += [f"{d.name} exit {d.proc.poll()}: {d.last_error()}" for d in ctx.drivers]
    outputs = read_outputs(setup, ctx.out)
    result.checks = verify(outputs, setup.n, expected, reference)
    if setup.kafka:
        result.notes.append(f"{outputs.aborted} records of aborted Kafka transactions dropped by the reader (Tansu shows them)")
    try:
        result.zombie_writes = zombie_writes(setup, ctx.out, ctx.ckpt)
    except Exception as e:  # the harness could not count them: said, not passed over
        result.notes.append(f"zombie writes not counted: {type(e).__name__}: {e}")
    if result.zombie_writes:
        ctx.problems.append(f"{result.zombie_writes} writes by a driver after its lease was taken over")
    left = [f for kind in ("raw", "win") for f in staging_leftovers(ctx.out.directory / kind)]
    if left:  # a revoked driver's staging goes with its gate; the last driver's is cleared as it publishes
        ctx.problems.append(f"{len(left)} staged files left behind in the files sinks, e.g. {left[0]}")
    if ctx.fault_at is not None:
        back = ctx.back_at or ctx.fault_at
        result.outage_s = back - ctx.fault_at
        nxt = (ctx.timed or ctx.watch).first_commit_after(back)
        if nxt is not None:
            result.next_commit, at = nxt
            result.recovery_s = round(at - ctx.fault_at, 2)
    if not any(v["end_of_stream"] for w in [ctx.watch, *ctx.watches] for v in w.commits.values()):
        ctx.problems.append("the run never committed its end of stream")
    if not error and (ctx.problems or not all(ch.ok for ch in result.checks)):
        result.status = "FAIL"
    result.notes.extend(ctx.problems)
    return result
