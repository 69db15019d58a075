"""The small value types every part of a spec uses: names, durations, sizes, event-time windows.

Durations are milliseconds that read and print as ``"10s"``; sizes are bytes that read as
``"64MiB"``. Every model is frozen and refuses unknown fields, so a typo is an error that names
the field, never a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: Any) -> int:
    """Parse ``'10s'``, ``'500ms'``, ``'2m'``, ``'1h'``, ``'1d'`` (or a whole number of ms).

    >>> parse_duration_ms("2s"), parse_duration_ms("1.5m"), parse_duration_ms(250)
    (2000, 90000, 250)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '10s', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a non-negative duration, got {value!r}")
        return value
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return int(round(float(m.group(1)) * _UNIT_MS[m.group(2)]))
    raise ValueError(f"expected a duration like '10s', got {value!r}")


def format_duration_ms(ms: int) -> str:
    """>>> format_duration_ms(90_000), format_duration_ms(1_500)
    ('90s', '1500ms')
    """
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


#: A duration in milliseconds; accepts "10s"-style strings and serialises back to them.
Duration = Annotated[
    int,
    BeforeValidator(parse_duration_ms),
    PlainSerializer(format_duration_ms, return_type=str),
]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)?\s*$", re.IGNORECASE)
_UNIT_BYTES = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_bytes(value: Any) -> int:
    """Parse ``'64MiB'``, ``'500kb'``, ``'2GB'`` (or a whole number of bytes).

    >>> parse_bytes("1KiB"), parse_bytes("1.5kb"), parse_bytes(7)
    (1024, 1500, 7)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return int(round(float(m.group(1)) * _UNIT_BYTES[(m.group(2) or "b").lower()]))
    raise ValueError(f"expected a size like '64MiB', got {value!r}")


#: A size in bytes; accepts "64MiB"-style strings.
ByteSize = Annotated[int, BeforeValidator(parse_bytes)]

_NAME = r"^[A-Za-z_][A-Za-z0-9_\-]*$"
#: The name of a source, step or sink.
Name = Annotated[str, Field(pattern=_NAME, min_length=1, max_length=64)]
#: One column, or several (a composite key).
Columns = str | tuple[str, ...]


def names(value: Columns | None) -> tuple[str, ...]:
    """A column or columns as a tuple: ``"a"`` → ``("a",)``, None → ``()``."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


class Model(BaseModel):
    """Base of every spec model: frozen, unknown fields refused, fields settable by alias."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Window(Model):
    """An event-time window: tumbling when ``slide`` is absent, sliding otherwise; with ``step``,
    cumulative (Flink's ``CUMULATE``): from each multiple of ``size``, windows that end every
    ``step`` up to ``size`` long."""

    size: Duration = Field(gt=0)
    slide: Duration | None = Field(default=None, gt=0)
    step: Duration | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _slide_divides(self) -> Window:
        for name, part in (("slide", self.slide), ("step", self.step)):
            if part is not None and (part > self.size or self.size % part):
                raise ValueError(
                    f"{name}: expected a {name} that divides the size ({format_duration_ms(self.size)}),"
                    f" got {format_duration_ms(part)}"
                )
        if self.slide is not None and self.step is not None:
            raise ValueError("window: a slide (sliding windows) or a step (cumulative windows), not both")
        return self

    @property
    def slide_ms(self) -> int:
        return self.slide if self.slide is not None else self.size


class Files(Model):
    """A directory of files: a source (new files are picked up in name order) or a sink.

    As a source, ``schema`` (a Spark DDL string such as ``"id long, name string"``) is required for
    ``json`` and ``csv``; records that do not parse or do not fit it go to the dead-letter sink.
    As a sink, each epoch's output appears atomically as ``path/epoch=NNNNNNNN/``.

    CSV is RFC 4180 (a quote inside a quoted field written twice). ``header``: whether the first
    line of each CSV file names the columns; a source skips it (default: no header), a sink
    writes it (default: a header), so a source reading a sink's CSV sets ``header: true``.

    ``retract`` (a sink's): how it takes published epochs back (a replay, an undo, a correction
    of tentative epochs). ``move`` (the default) moves their directories aside, into
    ``path/_corrections/``; ``revisions`` (Parquet only) leaves every directory where it is, as
    an append-only changelog: each epoch's rows carry a ``_diff`` weight (+1 unless the step
    writes weights itself), and the epoch that takes an earlier one back writes that epoch's
    rows again with the weight negated (``retract-<epoch>.parquet`` in its own directory); an
    undo writes them once more as they were (``restore-<epoch>.parquet``). Summing ``_diff``
    per row over all directories gives what is in force.
    """

    path: str = Field(min_length=1)
    format: Literal["parquet", "json", "csv"] = "parquet"
    schema_: str | None = Field(default=None, alias="schema")
    max_files_per_epoch: int | None = Field(default=None, gt=0)
    header: bool | None = None
    retract: Literal["move", "revisions"] | None = None

    def __init__(self, path: str | None = None, /, **data: Any) -> None:
        """Allow ``Files("out/dir", format="json")`` with the path first."""
        if path is not None:
            data["path"] = path
        super().__init__(**data)
