"""Commands for a running network (control lines, :mod:`eddyline.api.live`).

``eddyline control set`` leaves a command in the checkpoint's inbox; the engine takes the inbox
at the next epoch boundary, validates each command against the network as it runs, and either
logs it in the epoch's plan (it takes effect with that epoch, also in a replay) or refuses it
with the reason. Either way the command moves to ``done`` with its outcome::

    <checkpoint>/control/inbox/<ns>-<id>.json   {"id", "set": {"STEP.PARAM": value}, "from", "submitted_at"}
                                                (or "network": a whole spec, "reset": [steps];
                                                 "replay": epoch [+ "network"]; "undo": epoch)
    <checkpoint>/control/done/<id>.json         the same + "outcome" (applied | refused), "epoch", "reason"
    <checkpoint>/control/paused.json            while an operator's pause is in force: {"id", "since"}

Besides settings and changes of network, a command may ask the distribution manager for a
routing change (``"route": {"step", "rebalance" | "lanes" | "move"}``) or pause (``"pause": true``)
and resume (``"resume": true``) the network.

On an object store a listing is the dearest request there is, so the driver does not list the
inbox at every epoch: whoever queues a command rings a bell after it (rewrites
``control/bell.json``), and the driver lists the inbox when the bell's version changed, while
commands it listed are still open, and at least every :data:`RELIST_S` seconds (for a command
put there by other means, or whose bell was never rung).

A command is closed only after the plan that applies it is logged: a driver that dies in
between finds it in the inbox again and applies the same setting again, which changes nothing.
What the driver writes here (closing a command, pausing) goes through the checkpoint's gate, so
a driver that lost its lease cannot close or pause anything (:class:`~eddyline.storage.Gate`);
commands are queued by operators, who hold no lease.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pyarrow.fs as pafs

from eddyline import objectstore
from eddyline.storage import Gate, filesystem, is_s3, makedirs, read_json, write_atomic

#: on an object store, the longest a driver goes without listing the inbox
RELIST_S = 30.0


class Inbox:
    def __init__(self, checkpoint: str, gate: Gate | None = None):
        """``gate``: the driver's, for what it writes (None: an operator's or a reader's inbox)."""
        self.fs, base = filesystem(checkpoint)
        self.inbox, self.closed = f"{base}/control/inbox", f"{base}/control/done"
        self.gate = gate if gate is not None else Gate(checkpoint)
        #: on an object store: the bell (bucket, key), the version last seen, when last listed, and
        #: whether that listing found commands
        self._bell = objectstore.split(f"s3://{base}/control/bell.json") if is_s3(self.fs) else None
        self._rung: str | None = None
        self._listed_at = float("-inf")
        self._open = True

    def submit(self, settings: dict[str, Any], origin: str = "cli") -> str:
        """Queue ``settings`` for the next epoch; returns the command's id."""
        return self._queue({"set": settings, "from": origin})

    def submit_network(self, raw: dict[str, Any], reset: list[str], origin: str = "cli") -> str:
        """Queue a whole new network (``eddyline apply``, :mod:`eddyline.api.change`)."""
        return self._queue({"network": raw, "reset": reset, "from": origin})

    def submit_command(self, body: dict[str, Any], origin: str = "cli") -> str:
        """Queue another command (``{"replay": N, ...}``, ``{"undo": E}``)."""
        return self._queue({**body, "from": origin})

    def _queue(self, body: dict[str, Any]) -> str:
        command_id = uuid.uuid4().hex[:12]
        command = {"id": command_id, **body, "submitted_at": time.time()}
        makedirs(self.fs, self.inbox)
        write_atomic(self.fs, f"{self.inbox}/{time.time_ns():020d}-{command_id}.json", json.dumps(command).encode())
        if self._bell is not None:  # after the command: a driver that hears the bell finds it listed
            objectstore.bucket(self._bell.bucket).put(self._bell.key, json.dumps({"id": command_id}).encode())
        return command_id

    def waiting(self) -> list[dict[str, Any]]:
        """The driver's look at the inbox before it plans an epoch: :meth:`pending`, listed on an
        object store only when the bell rang since the last listing, when that listing found
        commands (they stay until closed), or :data:`RELIST_S` after it; else nothing."""
        if self._bell is not None:
            got = objectstore.bucket(self._bell.bucket).get(self._bell.key)
            rung = got[1] if got is not None else None
            if rung == self._rung and not self._open and time.monotonic() - self._listed_at < RELIST_S:
                return []
            self._rung, self._listed_at = rung, time.monotonic()
        found = self.pending()
        self._open = bool(found)
        return found

    def pending(self) -> list[dict[str, Any]]:
        """The queued commands, oldest first; a file that is not a command is refused as one."""
        out = []
        for path in self._files(self.inbox):
            try:
                command = read_json(self.fs, path)
            except (OSError, ValueError) as e:
                command = {"id": path.rsplit("/", 1)[-1][:-5], "set": None, "error": f"not a JSON command: {e}"}
            if not isinstance(command, dict):
                command = {"id": path.rsplit("/", 1)[-1][:-5], "set": None, "error": "not a JSON object"}
            command.setdefault("id", path.rsplit("/", 1)[-1][:-5])
            out.append({**command, "_path": path})
        return out

    def close(self, command: dict[str, Any], outcome: str, epoch: int, reason: str | None = None) -> None:
        record = {k: v for k, v in command.items() if k != "_path"} | {"outcome": outcome, "epoch": epoch}
        if reason is not None:
            record["reason"] = reason
        makedirs(self.fs, self.closed)
        gate = self.gate.ready()
        gate.put(f"{self.closed}/{record['id']}.json", json.dumps(record).encode())
        path = command.get("_path")
        if path:
            gate.remove(path)

    def paused(self) -> dict[str, Any] | None:
        """The pause in force (who paused, since when), or None."""
        try:
            data = read_json(self.fs, self._paused)
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    def set_paused(self, pause: dict[str, Any] | None) -> None:
        if pause is None:
            self.gate.ready().remove(self._paused)
            return
        makedirs(self.fs, self.inbox.rsplit("/", 1)[0])
        self.gate.ready().put(self._paused, json.dumps(pause).encode())

    @property
    def _paused(self) -> str:
        return f"{self.inbox.rsplit('/', 1)[0]}/paused.json"

    def done(self) -> list[dict[str, Any]]:
        """Closed commands, in the order they were closed."""
        records = [read_json(self.fs, p) for p in self._files(self.closed)]
        return sorted((r for r in records if isinstance(r, dict)), key=lambda r: (r.get("epoch", 0), r.get("submitted_at", 0)))

    def _files(self, directory: str) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        return sorted(i.path for i in infos if i.base_name.endswith(".json"))
