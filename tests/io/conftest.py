"""Fixtures shared by the sink tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from eddyline.api.sinks import SinkSpec
from eddyline.io.postgres import PostgresSink
from eddyline.io.sinks import make_sink


@pytest.fixture
def sinks(postgres) -> Iterator[Any]:
    """Makes ``postgres`` sinks on the test server (each one a driver of its own) and closes
    them after: ``sinks(table, name="out", url=None, **params)``."""
    made: list[PostgresSink] = []

    def make(table: str, name: str = "out", url: str | None = None, **params: Any) -> PostgresSink:
        spec = SinkSpec.model_validate(
            {"name": name, "input": "x", "postgres": {"url": url or postgres.url, "table": table, **params}}
        )
        sink = make_sink(spec)
        assert isinstance(sink, PostgresSink)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        sink.close()
