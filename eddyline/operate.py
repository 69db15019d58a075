"""What an operator sees and does from outside the epoch loop: the dashboard's feed (from a
running engine, or from a checkpoint alone) and the status summary of ``eddyline status``.

Everything here reads what the engine already writes (progress records, commits, the lease, the
control inbox) and changes the network only through the inbox, so a control call is checked,
logged and replayed like any other command.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from eddyline.api.live import with_settings
from eddyline.api.network import NetworkSpec
from eddyline.api.validate import spec_from_raw
from eddyline.errors import CheckpointError, SpecError
from eddyline.observe.dashboard.app import Feed, following
from eddyline.observe.metrics import Metrics
from eddyline.runtime.checkpoint import PROGRESS_KEPT, Checkpoint
from eddyline.runtime.inbox import Inbox

if TYPE_CHECKING:
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine


def network_in_force(ck: Checkpoint) -> NetworkSpec:
    """The network the checkpoint runs now (the one a live change put in force, else the first)."""
    meta = ck.metadata()
    if meta is None:
        raise CheckpointError(f"checkpoint {ck.location!r}: no run has started there")
    digest = (meta.get("applied") or {}).get("hash") or meta.get("created")
    if digest is None:
        raise CheckpointError(f"checkpoint {ck.location!r} does not name its network (made by an older Eddyline)")
    return spec_from_raw(ck.read_network(digest))


def check_command(net: NetworkSpec, settings: dict[str, Any], command: dict[str, Any]) -> None:
    """Refuse (raise :class:`SpecError`) a control call that cannot fit the network as it runs
    with ``settings``, before it is queued (the engine checks it again when it takes it)."""
    if "set" in command:
        with_settings(with_settings(net, settings), command["set"])
    if "route" in command:
        step = command["route"].get("step")
        stateful = [s.name for s in net.stateful_steps()]
        if step not in stateful:
            raise SpecError(f"route: step {step!r} is not a stateful step of {net.name} "
                            f"(stateful: {', '.join(stateful) or 'none'})")
        if "lanes" in command["route"] and net.control.scale is None:
            raise SpecError(f"route {step}: the network has no control.scale, so its lane count is fixed "
                            "(run with --lanes)")


def _commands(inbox: Inbox) -> list[dict[str, Any]]:
    return [*inbox.done(), *({k: v for k, v in c.items() if k != "_path"} for c in inbox.pending())]


def _submit(inbox: Inbox) -> Any:
    def submit(command: dict[str, Any]) -> str:
        body = {k: v for k, v in command.items() if k != "from"}
        return inbox.submit_command(body, origin=str(command.get("from", "dashboard")))

    return submit


def live_feed(engine: Engine, reporter: ProgressReporter) -> Feed:
    """The dashboard of a running engine: its reporter's records as they come (after those the
    checkpoint kept from earlier runs), control calls into its inbox."""
    lock = threading.Lock()
    records: deque[dict[str, Any]] = deque(engine.ckpt.progress(), maxlen=PROGRESS_KEPT)
    metrics = Metrics()

    def received(record: dict[str, Any]) -> None:
        with lock:
            records.append(record)
        metrics.observe(record)

    def recent() -> list[dict[str, Any]]:
        with lock:
            return list(records)

    def status() -> dict[str, Any]:
        lease = engine.lease.describe() if engine.lease is not None else None
        return {"live": True, "paused": engine.paused, "lease": lease}

    reporter.listeners.append(received)
    return Feed(
        network=lambda: engine.base_spec, records=recent, status=status, commands=lambda: _commands(engine.inbox),
        submit=_submit(engine.inbox), check=lambda c: check_command(engine.base_spec, engine.settings, c),
        metrics=metrics,
    )


def checkpoint_feed(checkpoint: str) -> Feed:
    """The dashboard of a checkpoint (a stopped run, or one running elsewhere): read-only."""
    ck, inbox = Checkpoint(checkpoint), Inbox(checkpoint)
    net = network_in_force(ck)
    metrics = Metrics()
    for record in ck.progress():
        metrics.observe(record)
    return Feed(network=following(ck.in_force, ck.read_network, net), records=ck.progress, commands=lambda: _commands(inbox),
                status=lambda: {"live": False, "paused": inbox.paused() is not None}, metrics=metrics)


def status(checkpoint: str) -> dict[str, Any]:
    """A running or stopped network's state, from its checkpoint alone (``eddyline status``)."""
    ck = Checkpoint(checkpoint)
    net = network_in_force(ck)
    last = ck.latest_commit()
    records = ck.progress(20)
    record = records[-1] if records else {}
    out: dict[str, Any] = {
        "network": net.name,
        "checkpoint": checkpoint,
        "lastEpoch": last.epoch if last else 0,
        "committedAt": last.committed_at if last else None,
        "endOfStream": bool(last and last.end_of_stream),
        "paused": Inbox(checkpoint).paused(),
        "leader": _leader(checkpoint),
        # as the last epoch's driver reported itself (a hot pair's lease is in its group, not here)
        "driver": record.get("driver"),
        # the driver's mode at the last epoch it ran, and the transition that led to it
        "mode": record.get("mode"),
        "sources": {
            s.name: {"offset": last.source_ends.get(s.name, 0) if last else 0,
                     "backlog": (record.get("backlog") or {}).get(s.name)}
            for s in net.sources
        },
        "routing": record.get("routing") or {},
        "state": {op["operatorName"]: {"rows": op["numRowsTotal"], "bytes": op["memoryUsedBytes"]}
                  for op in record.get("stateOperators", [])},
        "lastEpochStats": {k: record.get(k) for k in ("numInputRows", "durationMs", "eventTime", "deadLetters",
                                                        "lateRows")} if record else {},
        # over the epochs whose progress the checkpoint keeps, and where they are
        "deadLetters": {"total": sum(r.get("deadLetters", 0) for r in ck.progress()),
                        "path": dead_letter_path(net, checkpoint)},
        "tentative": last.tentative if last else [],
        "settings": last.settings if last else {},
    }
    from eddyline.observe.dashboard.views import decisions

    out["recentDecisions"] = decisions(records)[:8]
    return out


def dead_letter_path(net: NetworkSpec, checkpoint: str) -> str:
    """Where a network's dead letters are written: its ``dead_letters`` target, else under the checkpoint."""
    return net.dead_letters.path if net.dead_letters is not None else f"{checkpoint.rstrip('/')}/dead-letters"


def _leader(checkpoint: str) -> dict[str, Any] | None:
    from eddyline.ha.lease import Lease

    try:
        cur = Lease(checkpoint).current()
    except CheckpointError:  # a URI of another file system has no lease
        return None
    if cur is None:
        return None
    return {"holder": cur.holder, "generation": cur.generation, "acquiredAt": cur.acquired_at,
            "alive": cur.expires_at > time.time(), "expiresAt": cur.expires_at}
