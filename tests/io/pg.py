"""Reading and changing the test server's tables directly with psycopg (autocommit), for the
``postgres`` sink's tests."""

from __future__ import annotations

from typing import Any

import psycopg


def query(postgres: Any, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        return conn.execute(statement, args).fetchall()


def run(postgres: Any, statement: str) -> None:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(statement)
