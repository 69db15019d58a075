"""What a ``postgres`` sink is given, and how it connects: the fields, the libpq options that
make a vanished server noticed, and the URL as messages may show it (without its password)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from eddyline.api.units import Columns, Duration, Model

_TABLE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$"

#: TCP keepalives: a server that vanished without closing the connection (a partition, a host
#: that died) is noticed within about 10 + 3 x 5 s, and data it never acknowledges after 30 s,
#: instead of a commit waiting on the socket for the kernel's default of two hours
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
              "tcp_user_timeout": 30_000}


def connect_options(url: str, connect_timeout_s: int) -> dict[str, Any]:
    """libpq options for a connection to ``url``: its timeout and :data:`KEEPALIVES`, except
    those the URL sets itself."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(url)
    return {k: v for k, v in {"connect_timeout": connect_timeout_s, **KEEPALIVES}.items() if k not in given}


class Postgres(Model):
    """Write into a PostgreSQL table, each epoch exactly once: ``append`` copies every row in,
    ``upsert`` applies the input's changes (``_op``) by ``key``. ``table`` is read as SQL reads
    an unquoted name (``Sales.Totals`` is ``sales.totals``); columns keep their input's names."""

    url: str = Field(min_length=1)  # a libpq URI or key=value string
    table: str = Field(pattern=_TABLE)
    mode: Literal["append", "upsert"] = "append"
    key: Columns | None = None
    connect_timeout: Duration = Field(default=10_000, gt=0)
    #: how long publish retries a lost connection, with back-off, before it fails
    retry_for: Duration = Field(default=60_000, ge=0)
    #: keep, for the network's ``history``, what it takes to take epochs back and put them back
    #: (``eddyline replay`` / ``undo``): each epoch's inserted rows (append) or the before-image
    #: of each key it touched (upsert), in ``eddyline_undo``
    rewind: bool = False


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:  # an unparsable url may hold anything: show none of it
        return "<unparsable connection string>"
    user = f"{info['user']}@" if info.get("user") else ""
    host = info.get("host") or info.get("hostaddr") or "localhost"
    return f"postgresql://{user}{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"
