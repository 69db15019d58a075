"""The ``postgres`` sink kind as the registry knows it: its fields' cross-checks, how it is
described, and how a sink is made."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eddyline.api.sinks import SINKS
from eddyline.api.units import names
from eddyline.columns import DIFF
from eddyline.io.postgres.params import Postgres, redact
from eddyline.io.postgres.sink import PostgresSink
from eddyline.io.sinks import SinkKind

if TYPE_CHECKING:
    from eddyline.api.sinks import SinkSpec


@SINKS.register
class PostgresKind(SinkKind):
    key = "postgres"
    params = Postgres
    live_params = ("url", "table")

    def check(self, sink: SinkSpec) -> list[str]:
        p: Postgres = sink.params
        key = names(p.key)
        problems = []
        if p.mode == "upsert" and not key:
            problems.append("postgres.key: upsert needs the primary key column(s)")
        if p.mode == "append" and key:
            problems.append("postgres.key: append writes every row as it comes and has no key; "
                            "remove key or use mode: upsert")
        if DIFF in key:
            problems.append(f"postgres.key: {DIFF} is a revision's weight, not a column")
        if len(set(key)) != len(key):
            problems.append("postgres.key: a column appears twice")
        if redact(p.url).startswith("<"):
            problems.append("postgres.url: expected a libpq URI (postgresql://user@host:port/db) "
                            "or key=value connection string")
        return problems

    def describe(self, params: Any) -> str:
        how = f"upsert on {', '.join(names(params.key))}" if params.mode == "upsert" else "append"
        return f"postgres table {params.table} ({how}) at {redact(params.url)}"

    def make(self, spec: SinkSpec, console: Any = None) -> PostgresSink:
        return PostgresSink(spec)
