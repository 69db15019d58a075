"""The ``eddyline`` command line. Environment variables are read here and nowhere else.

Exit codes: 0 success, 2 invalid spec (nothing ran), 3 checkpoint does not fit, 1 other errors.

One module a group of commands (check, running, changes, producing, browsing, demos); this one
puts them on :data:`app` in the order ``eddyline --help`` lists them.
"""

from __future__ import annotations

from eddyline.cli import browsing, changes, check, demos, producing, running
from eddyline.cli.common import app

for _command in (check.validate, check.explain, running.sql, running.run, changes.apply, changes.replay, changes.undo,
                 producing.produce, browsing.ui, browsing.status, demos.demo):
    app.command()(_command)
app.add_typer(changes.control_app, name="control")

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover
    app()
