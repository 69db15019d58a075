"""Reading a JetStream stream with nats-py, the reference client, so that tests check what
Eddyline wrote with a client other than Eddyline's own."""

from __future__ import annotations

import asyncio

#: the subjects of a ``nats`` sink's fence messages (eddyline.io.jetstream), which a reader of
#: the sink's data leaves out
FENCES = "_eddyline."


def read_stream(url: str, stream: str) -> list[tuple[int, bytes, str | None]]:
    """(sequence, payload, message id) of every message in ``stream`` but the sinks' fences."""
    return asyncio.run(_read(url, stream))


async def _read(url: str, stream: str) -> list[tuple[int, bytes, str | None]]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        m = await js.get_msg(stream, seq)
        if not m.subject.startswith(FENCES):
            out.append((m.seq, m.data, (m.headers or {}).get("Nats-Msg-Id")))
    await nc.close()
    return out
