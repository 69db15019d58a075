"""A control stream (``control.commands``): control tuples read from files at epoch boundaries.

Each file in the directory holds JSON lines ``{"query", "step", "parameter", "value"}`` (the
meta-query form of seed 003: a stream whose tuples change another query's parameters). The
engine reads the files after its cursor, in name order, at every epoch boundary; each tuple
becomes a command like ``eddyline control set``'s and is applied or refused the same way. The
cursor (the last file read) is logged in the epoch plan and kept in the commit, so a replay
reads no file twice and a restart goes on after the last file an epoch took.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.fs as pafs

from eddyline.storage import filesystem

FIELDS = ("query", "step", "parameter", "value")


class CommandFiles:
    def __init__(self, directory: str, query: str):
        self.fs, self.base = filesystem(directory)
        self.query = query

    def after(self, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """The commands of the files after ``cursor``, and the new cursor. A malformed tuple
        is a command with an ``error`` (refused with it); a tuple for another query is skipped."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        names = sorted(i.base_name for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith((".", "_")))
        names = [n for n in names if cursor is None or n > cursor]
        commands: list[dict[str, Any]] = []
        for name in names:
            with self.fs.open_input_stream(f"{self.base}/{name}") as f:
                text = f.read().decode("utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    command = self._command(line, f"{name}:{number}")
                    if command is not None:
                        commands.append(command)
        return commands, (names[-1] if names else cursor)

    def _command(self, line: str, where: str) -> dict[str, Any] | None:
        base = {"id": f"stream-{where}", "from": f"control stream {where}"}
        try:
            t = json.loads(line)
        except ValueError as e:
            return {**base, "set": None, "error": f"not a JSON object: {e}"}
        if not isinstance(t, dict) or any(k not in t for k in FIELDS):
            missing = [k for k in FIELDS if not isinstance(t, dict) or k not in t]
            return {**base, "set": None, "error": f"a control tuple needs {', '.join(FIELDS)}; missing {', '.join(missing)}"}
        if t["query"] != self.query:
            return None
        return {**base, "set": {f"{t['step']}.{t['parameter']}": t["value"]}}
