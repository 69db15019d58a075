"""A TCP relay that makes a link slow, lossy or dead, from outside the processes on either end
(this kernel has no ``netem``). Run on the store's host in front of the store::

    python -m tests.hosts.slowlink LISTEN_IP:PORT TARGET_IP:PORT CONTROL.json

``CONTROL.json`` (read every 0.1 s, absent = a plain relay): ``delay_ms`` added to every round trip
(half on each direction, order kept), ``loss`` the share of chunks held back 200 ms as TCP's
retransmission of a lost segment would, ``down`` true: every open connection is cut and new ones
are closed at once, ``strip``: names of request headers to drop (``["if-none-match"]`` makes the
store one that ignores conditional writes).

It also counts the HTTP requests it relays, by kind (GET, PUT, HEAD, DELETE, POST, and LIST: a
GET of a bucket listing), in ``CONTROL.counts.json`` next to the control file: the store's side of
what a run costs in requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

RETRANSMIT_S = 0.2
METHODS = (b"GET", b"PUT", b"HEAD", b"DELETE", b"POST")


def request_kind(chunk: bytes) -> str | None:
    """The kind of the HTTP request that ``chunk`` starts, if it starts one."""
    method, _, rest = chunk[:2048].partition(b" ")
    if method not in METHODS or not rest.startswith(b"/"):
        return None
    target = rest.split(b" ", 1)[0]
    if method == b"GET" and (b"list-type=" in target or b"prefix=" in target):
        return "LIST"
    return method.decode()


def strip_headers(request: bytes, names: set[bytes]) -> bytes:
    """``request`` (a chunk that starts an HTTP request) without the headers named ``names``."""
    head, sep, body = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    kept = [lines[0], *(h for h in lines[1:] if h.split(b":", 1)[0].strip().lower() not in names)]
    return b"\r\n".join(kept) + sep + body


class Link:
    def __init__(self, control: Path):
        self.control, self.delay_s, self.loss, self.down = control, 0.0, 0.0, False
        self.strip: set[bytes] = set()
        self.open: set[asyncio.StreamWriter] = set()
        self.counts: Counter[str] = Counter()
        self.counts_file = control.with_name(control.stem + ".counts.json")

    async def watch(self) -> None:
        while True:
            try:
                c = json.loads(self.control.read_text())
            except (OSError, ValueError):
                c = {}
            self.delay_s, self.loss = float(c.get("delay_ms", 0)) / 1000, float(c.get("loss", 0))
            self.down = bool(c.get("down", False))
            self.strip = {h.lower().encode() for h in c.get("strip", [])}
            if self.down:
                for w in list(self.open):
                    w.transport.abort()
            self.counts_file.write_text(json.dumps(self.counts))
            await asyncio.sleep(0.1)

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool = False) -> None:
        """Copy one direction, each chunk sent half a round trip's delay after it arrived."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError):
                writer.write_eof()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(65536):
                if count and (kind := request_kind(data)) is not None:
                    self.counts[kind] += 1
                    if self.strip:
                        data = strip_headers(data, self.strip)
                held = RETRANSMIT_S if random.random() < self.loss else 0.0
                queue.put_nowait((time.monotonic() + self.delay_s / 2 + held, data))
        except OSError:
            pass
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await sender

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: tuple[str, int]) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*target)
        except OSError:
            writer.transport.abort()
            return
        self.open |= {writer, up_w}
        try:
            await asyncio.gather(self.pipe(reader, up_w, count=True), self.pipe(up_r, writer))
        finally:
            self.open -= {writer, up_w}
            for w in (writer, up_w):
                w.close()


async def main(listen: str, target: str, control: str) -> None:
    link = Link(Path(control))
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)
    server = await asyncio.start_server(lambda r, w: link.serve(r, w, (thost, int(tport))), lhost, int(lport))
    asyncio.create_task(link.watch())  # noqa: RUF006 (runs as long as the server)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
