"""A control stream (``control.commands``): control tuples read at epoch boundaries.

A tuple is a JSON object ``{"query", "step", "parameter", "value"}`` (the meta-query form of
seed 003: a stream whose tuples change another query's parameters): a line of a file in a
directory, or a message of a JetStream stream. The engine reads what came after its cursor at
every epoch boundary; each tuple becomes a command like ``eddyline control set``'s and is applied
or refused the same way. The cursor (the last file, or the last sequence, read) is logged in the
epoch plan and kept in the commit, so a replay reads nothing twice and a restart goes on after
what the last epoch took.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pyarrow.fs as pafs

from eddyline.storage import filesystem

FIELDS = ("query", "step", "parameter", "value")


def command_reader(location: str, query: str) -> CommandFiles | CommandNats:
    """The control stream at ``location``: a JetStream stream (``nats://host:port/STREAM``,
    ``tls://…``, optionally ``?subject=…``) or a directory of files."""
    if location.startswith(("nats://", "tls://")):
        return CommandNats(location, query)
    return CommandFiles(location, query)


def tuple_command(text: str, where: str, query: str) -> dict[str, Any] | None:
    """One control tuple as a command (``None``: it is for another query); a malformed one is
    a command with an ``error`` (refused with it)."""
    base = {"id": f"stream-{where}", "from": f"control stream {where}"}
    try:
        t = json.loads(text)
    except ValueError as e:
        return {**base, "set": None, "error": f"not a JSON object: {e}"}
    if not isinstance(t, dict) or any(k not in t for k in FIELDS):
        missing = [k for k in FIELDS if not isinstance(t, dict) or k not in t]
        return {**base, "set": None, "error": f"a control tuple needs {', '.join(FIELDS)}; missing {', '.join(missing)}"}
    if t["query"] != query:
        return None
    return {**base, "set": {f"{t['step']}.{t['parameter']}": t["value"]}}


class CommandFiles:
    """Files of JSON lines in name order; the cursor is the last file read."""

    def __init__(self, directory: str, query: str):
        self.fs, self.base = filesystem(directory)
        self.query = query

    def close(self) -> None:
        pass

    def after(self, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """The commands of the files after ``cursor``, and the new cursor."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        names = sorted(i.base_name for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_")))
        names = [n for n in names if cursor is None or n > cursor]
        commands: list[dict[str, Any]] = []
        for name in names:
            with self.fs.open_input_stream(f"{self.base}/{name}") as f:
                text = f.read().decode("utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip() and (command := tuple_command(line, f"{name}:{number}", self.query)) is not None:
                    commands.append(command)
        return commands, (names[-1] if names else cursor)


class CommandNats:
    """A JetStream stream, one tuple per message; the cursor is the last sequence read. While the
    server does not answer, no command is read (they wait in the stream, like any input). The
    connection stays open from one boundary to the next (reopened after a failure)."""

    def __init__(self, location: str, query: str):
        parts = urlsplit(location)
        params = parse_qs(parts.query)
        self.subject = (params.pop("subject", [None]) or [None])[0]
        self.stream = parts.path.strip("/")
        self.url = urlunsplit((parts.scheme, parts.netloc, "", urlencode(params, doseq=True), ""))
        self.query = query
        self._conn: Any = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def after(self, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
        from eddyline.io.natswire import NatsConnection, NatsError

        start = int(cursor) + 1 if cursor else 1
        commands: list[dict[str, Any]] = []
        try:
            if self._conn is None:
                self._conn = NatsConnection(self.url)
            conn = self._conn
            last = int(conn.stream_info(self.stream)["state"]["last_seq"])
            for seqs, payloads in conn.read_range(self.stream, start, last + 1, self.subject):
                for seq, payload in zip(seqs, payloads, strict=True):
                    command = tuple_command(payload.decode("utf-8", errors="replace"), f"{self.stream}:{seq}", self.query)
                    if command is not None:
                        commands.append(command)
        except (NatsError, OSError):
            self.close()
            return [], cursor
        return commands, (str(last) if last >= start else cursor)
