"""Event time as the engine counts it: epoch milliseconds, with two sentinel watermarks."""

from __future__ import annotations

from datetime import UTC, datetime

#: The watermark before any event time was seen.
NO_WATERMARK = -(2**62)
#: The watermark once the input ended: every window and timer fires.
END_OF_STREAM = 2**62


def iso_ms(ms: int | None) -> str | None:
    """``ms`` as an ISO-8601 UTC timestamp; None before any watermark, ``end-of-stream`` after."""
    if ms is None or ms <= NO_WATERMARK:
        return None
    if ms >= END_OF_STREAM:
        return "end-of-stream"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
