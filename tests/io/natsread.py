"""Reading a ``nats`` sink's stream back with nats-py, the reference client, and what a consumer
that follows the sink's rules (``eddyline.io.jetstream``: rows kept under their writer, sink and
epoch; a correction drops that epoch's rows) ends up showing."""

from __future__ import annotations

import asyncio
import json
from typing import Any


def read_stream(url: str, stream: str, fences: bool = False) -> list[tuple[dict[str, str], bytes]]:
    """(headers, payload) of every message in ``stream``, in order; the sinks' fence messages
    only with ``fences``."""

    async def read() -> list[tuple[dict[str, str], bytes]]:
        import nats

        nc = await nats.connect(url)
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1) if info.state.messages else []:
            m = await js.get_msg(stream, seq)
            if fences or not m.subject.startswith("_eddyline."):
                out.append((dict(m.headers or {}), m.data))
        await nc.close()
        return out

    return asyncio.run(read())


def consume(messages: list[tuple[dict[str, str], bytes]]) -> tuple[list[Any], list[Any]]:
    """(every row shown, tentative ones included; the stable rows only), corrections applied."""
    shown: list[tuple[tuple[str, str, int], bool, Any]] = []
    for headers, payload in messages:
        if "Eddyline-Retract" in headers:
            body = json.loads(payload)
            assert int(headers["Eddyline-Retract"]) == body["retract_epoch"]
            gone = (body["writer"], body["sink"], body["retract_epoch"])
            shown = [row for row in shown if row[0] != gone]
        else:
            network, checkpoint, sink, epoch, _ = headers["Nats-Msg-Id"].split("/")
            tentative = headers.get("Eddyline-Tentative") == "true"
            if tentative:
                assert headers["Eddyline-Epoch"] == epoch
            shown.append(((f"{network}/{checkpoint}", sink, int(epoch)), tentative, json.loads(payload)))
    return [row for _, _, row in shown], [row for _, tentative, row in shown if not tentative]
