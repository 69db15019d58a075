"""What every command shares: the app, the error console, the option types, and how a spec is
loaded, a Spark session made and an Eddyline error turned into an exit code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from eddyline.errors import CheckpointError, EddylineError, SpecError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Adaptive stream processing on Apache Spark.")
err = Console(stderr=True)

SpecArg = Annotated[Path, typer.Argument(help="network spec (YAML)", exists=False)]
Master = Annotated[
    str | None,
    typer.Option(help="Spark master; default $EDDYLINE_SPARK_MASTER or local[*]"),
]
# the options of a run (`run`, `sql`)
Epochs = Annotated[int | None, typer.Option(help="stop after this many epochs")]
Seconds = Annotated[float | None, typer.Option("--duration", help="stop after this many seconds")]
UntilIdle = Annotated[bool, typer.Option(help="stop when the input is exhausted (flushes all windows)")]
Lanes = Annotated[int | None, typer.Option(help="lanes per stateful step (may differ from the last run)")]
ProgressJson = Annotated[str | None, typer.Option(help="append one JSON progress record per epoch")]
Live = Annotated[bool, typer.Option(help="live progress table in the terminal")]


def fail(e: EddylineError) -> typer.Exit:
    if isinstance(e, SpecError):
        for p in e.problems:
            err.print(f"[red]error:[/red] {p}", highlight=False, soft_wrap=True)
        return typer.Exit(2)
    err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
    return typer.Exit(3 if isinstance(e, CheckpointError) else 1)


def load(path: Path):  # noqa: ANN202
    from eddyline.api.validate import load_spec

    if not path.exists():
        raise SpecError(f"network: spec file {str(path)!r} does not exist")
    return load_spec(path)


def spark(master: str | None):  # noqa: ANN202
    from eddyline.runtime.session import get_spark

    return get_spark(master or os.environ.get("EDDYLINE_SPARK_MASTER") or "local[*]")
