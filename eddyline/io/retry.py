"""Retrying an outside server with back-off, and saying so while it lasts.

A source or sink that talks to a server keeps a :class:`Health`: ``ok``, or what went wrong and
since when. The progress report shows it per source and sink (``status``), so a run that waits
for a server says what it waits for instead of looking stuck.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: first pause after a failure; it doubles up to :data:`MAX_PAUSE_S`
FIRST_PAUSE_S = 0.1
MAX_PAUSE_S = 5.0


@dataclass
class Health:
    status: str = "ok"
    since: float | None = None  # when the current trouble began (time.time())
    retries: int = 0  # retries since the run started

    def failing(self, error: Exception) -> None:
        if self.since is None:
            self.since = time.time()
        self.retries += 1
        self.status = f"retrying since {time.strftime('%H:%M:%S', time.localtime(self.since))}: {error}"

    def recovered(self) -> None:
        self.status, self.since = "ok", None

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "retries": self.retries}


def with_retry(
    action: Callable[[], T],
    *,
    retryable: tuple[type[Exception], ...],
    bound_s: float,
    health: Health | None = None,
    give_up: Callable[[Exception, float], Exception],
) -> T:
    """``action()``, retried on ``retryable`` errors with exponential back-off for up to
    ``bound_s`` seconds; then ``give_up(last error, seconds waited)`` is raised."""
    t0, pause = time.monotonic(), FIRST_PAUSE_S
    while True:
        try:
            out = action()
        except retryable as e:
            waited = time.monotonic() - t0
            if health is not None:
                health.failing(e)
            if waited + pause > bound_s:
                raise give_up(e, waited) from e
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if health is not None and health.since is not None:
            health.recovered()
        return out
