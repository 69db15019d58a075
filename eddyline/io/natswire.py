"""A small, synchronous NATS client for the paths where Eddyline moves every record: reading
a range of a JetStream stream (through a pull consumer), publishing with acknowledgements, and
receiving a core NATS subscription in batches (:class:`Subscription`, for the ``nats_core``
source's write-ahead log).

Why not nats-py for these: it is asyncio-only (each Spark task would need its own event loop) and
spends most of its time per message in Python (header parsing alone is ~35 µs a message). Reading
200K small messages took 3 s with it and under 0.5 s here; see docs/perf-notes.md. The
protocol subset is small — CONNECT, SUB, PUB/HPUB, MSG/HMSG, PING/PONG, -ERR — and everything else
(stream administration in the tests, the reference reader the tests compare against) is left to
nats-py. URLs: ``nats://[user:password@ | token@]host[:port]``, or ``tls://…`` for a server
that requires TLS, with ``?ca=FILE`` (certificates to trust instead of the system's) and, for
mutual TLS, ``&cert=FILE&key=FILE`` (this client's certificate and key).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import socket
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from eddyline.errors import EddylineError


class NatsError(EddylineError):
    """The server refused something (``-ERR``, an API error, no stream for a subject)."""


class NatsUnreachable(NatsError):
    """The server could not be reached, or the connection was lost or timed out."""


#: the de-duplication window Eddyline gives the streams it creates
DEDUP_WINDOW_MS = 120_000


#: what a ``tls://`` URL's query may say: files of certificates to trust, and this client's own
TLS_OPTIONS = ("ca", "cert", "key")


#: subjects Eddyline itself writes in a stream (a ``nats`` sink's fence messages); readers skip them
EDDYLINE_SUBJECTS = b"_eddyline."


def tls_context(url: str) -> ssl.SSLContext | None:
    """The TLS settings of a ``tls://`` URL (None for ``nats://``); a bad option or file is a
    :class:`NatsError` naming it."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    options = dict(parse_qsl(parts.query))
    if parts.scheme != "tls":
        if options:
            raise NatsError(f"{redact(url)}: options {sorted(options)} need a tls:// URL")
        return None
    unknown = sorted(set(options) - set(TLS_OPTIONS))
    if unknown:
        raise NatsError(f"{redact(url)}: unknown TLS option(s) {unknown}; expected {list(TLS_OPTIONS)}")
    if "key" in options and "cert" not in options:
        raise NatsError(f"{redact(url)}: key= without cert=")
    try:
        context = ssl.create_default_context(cafile=options.get("ca"))
        if "cert" in options:
            context.load_cert_chain(options["cert"], options.get("key"))
    except (OSError, ssl.SSLError) as e:
        raise NatsError(f"{redact(url)}: TLS files {options}: {e}") from e
    return context


def redact(url: str) -> str:
    """``url`` without its password or token, for messages."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    host = parts.hostname or "127.0.0.1"
    return f"{parts.scheme}://{host}:{parts.port or 4222}"


class NatsConnection:
    """One connection; not thread-safe. Requests are answered on one wildcard inbox."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, name: str = "eddyline"):
        self.url = url
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        if parts.scheme not in ("nats", "tls"):
            raise NatsError(f"{redact(url)}: expected a nats:// or tls:// URL")
        tls = tls_context(url)
        options: dict[str, Any] = {
            "verbose": False, "pedantic": False, "headers": True, "no_responders": True,
            "protocol": 1, "name": name, "lang": "python-eddyline",
        }
        if parts.username and parts.password is not None:
            options |= {"user": unquote(parts.username), "pass": unquote(parts.password)}
        elif parts.username:
            options["auth_token"] = unquote(parts.username)
        host = parts.hostname or "127.0.0.1"
        try:
            self.sock = socket.create_connection((host, parts.port or 4222), timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # the server sends INFO in the clear and then waits for us (for TLS: the handshake)
            info = b""
            while not info.endswith(b"\n") and len(info) < 1 << 16:
                chunk = self.sock.recv(4096)
                if not chunk:
                    break
                info += chunk
            if not info.startswith(b"INFO "):
                raise NatsError(f"{redact(url)}: not a NATS server (it said {info[:40]!r})")
            self.info = json.loads(info[5:])
            if tls is not None:
                self.sock = tls.wrap_socket(self.sock, server_hostname=host)
            elif self.info.get("tls_required"):
                raise NatsError(f"{redact(url)}: the server requires TLS: use a tls:// URL")
            self.file = self.sock.makefile("rb", buffering=1 << 20)
            self.inbox = f"_INBOX.{os.urandom(8).hex()}"
            self.sock.sendall(
                b"CONNECT " + json.dumps(options).encode() + b"\r\nSUB " + self.inbox.encode() + b".* 1\r\nPING\r\n"
            )
            self._expect_pong()
        except ssl.SSLCertVerificationError as e:  # not a passing outage: say so, do not retry
            raise NatsError(f"{redact(url)}: TLS: {e.verify_message or e}") from e
        except OSError as e:
            raise NatsUnreachable(f"{redact(url)}: {e}") from e
        self._next = 0

    # ------------------------------------------------------------------ frames
    def _expect_pong(self) -> None:
        while True:
            line = self._line()
            if line.startswith(b"PONG"):
                return
            self._control(line)

    def _line(self) -> bytes:
        try:
            return self.file.readline()
        except OSError as e:
            raise NatsUnreachable(f"{redact(self.url)}: {e}") from e

    def _read(self, total: int) -> bytes:
        """A message's ``total`` bytes and the CRLF after them."""
        try:
            blob = self.file.read(total + 2)
        except OSError as e:
            raise NatsUnreachable(f"{redact(self.url)}: {e}") from e
        if len(blob) < total + 2:
            raise NatsUnreachable(f"{redact(self.url)}: the connection closed mid-message")
        return blob

    def _control(self, line: bytes) -> None:
        """A frame that is not a message: answered (PING), raised (-ERR, a closed connection) or
        ignored (+OK, INFO)."""
        if not line:
            raise NatsUnreachable(f"{redact(self.url)}: the server closed the connection")
        if line.startswith(b"-ERR"):
            raise NatsError(f"{redact(self.url)}: {line[5:].strip().decode(errors='replace')}")
        if line.startswith(b"PING"):
            self._send(b"PONG\r\n")

    def _message(self) -> tuple[bytes, bytes, bytes]:
        """The next message for us: (reply subject it came to, headers, payload)."""
        while True:
            line = self._line()
            if line.startswith(b"HMSG") or line.startswith(b"MSG"):
                parts = line.split()
                total = int(parts[-1])
                hlen = int(parts[-2]) if line.startswith(b"HMSG") else 0
                blob = self._read(total)
                return parts[1], blob[:hlen], blob[hlen:total]
            self._control(line)

    def _reply_subject(self) -> str:
        self._next += 1
        return f"{self.inbox}.{self._next}"

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise NatsUnreachable(f"{redact(self.url)}: {e}") from e

    # ------------------------------------------------------------------ requests
    def request(self, subject: str, payload: bytes = b"") -> tuple[bytes, bytes]:
        """One request, one reply: (headers, payload). No responders is an error."""
        reply = self._reply_subject()
        self._send(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(payload), payload))
        while True:
            to, headers, body = self._message()
            if to.decode() == reply:
                if _status(headers) == b"503":
                    raise NatsError(f"{redact(self.url)}: no responders for {subject}")
                return headers, body

    def api(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A JetStream API call (``$JS.API.…``); an error reply raises :class:`NatsError`."""
        _, raw = self.request(f"$JS.API.{subject}", json.dumps(body).encode() if body is not None else b"")
        out = json.loads(raw)
        if "error" in out:
            err = out["error"]
            raise NatsError(f"{redact(self.url)}: {subject}: {err.get('description')} (code {err.get('err_code')})")
        return out

    def stream_info(self, stream: str) -> dict[str, Any]:
        return self.api(f"STREAM.INFO.{stream}")

    def messages_on(self, stream: str, subject: str) -> Iterator[tuple[dict[str, str], bytes]]:
        """(headers, payload) of every message on ``subject`` in ``stream``, in order, one
        request each (``STREAM.MSG.GET`` with ``next_by_subj``): for rare reads that need the
        headers, which :meth:`read_range` leaves out."""
        seq = 1
        while True:
            try:
                found = self.api(f"STREAM.MSG.GET.{stream}", {"seq": seq, "next_by_subj": subject})["message"]
            except NatsError as e:
                if "no message found" in str(e):
                    return
                raise
            raw = base64.b64decode(found.get("hdrs") or b"")
            headers = dict(line.split(": ", 1) for line in raw.decode().split("\r\n")[1:] if ": " in line)
            yield headers, base64.b64decode(found.get("data") or b"")
            seq = int(found["seq"]) + 1

    def last_on(self, stream: str, subject: str) -> tuple[int, dict[str, str], bytes] | None:
        """The last message on ``subject`` in ``stream``: (sequence, headers, payload), or None."""
        try:
            found = self.api(f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject})["message"]
        except NatsError as e:
            if "no message found" in str(e):
                return None
            raise
        raw = base64.b64decode(found.get("hdrs") or b"")
        headers = dict(line.split(": ", 1) for line in raw.decode().split("\r\n")[1:] if ": " in line)
        return int(found["seq"]), headers, base64.b64decode(found.get("data") or b"")

    def publish_one(self, subject: str, payload: bytes, headers: bytes) -> int:
        """Publish one message with ``headers`` (lines ``Name: value\\r\\n``) to JetStream and
        return its sequence; a refusal (a failed expectation, say) raises :class:`NatsError`."""
        reply = self._reply_subject()
        hdr = b"NATS/1.0\r\n" + headers + b"\r\n"
        self._send(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(hdr),
                                                        len(hdr) + len(payload), hdr, payload))
        while True:
            to, status, body = self._message()
            if to.decode() != reply:
                continue
            if _status(status) == b"503":
                raise NatsError(f"{redact(self.url)}: no stream takes subject {subject!r}")
            ack = json.loads(body)
            if "error" in ack:
                raise NatsError(f"{redact(self.url)}: publish to {subject!r}: {ack['error'].get('description')}")
            return int(ack["seq"])

    # ------------------------------------------------------------------ reading a range
    def read_range(
        self, stream: str, start: int, end: int, subject: str | None = None, batch: int = 10_000
    ) -> Iterator[tuple[list[int], list[bytes]]]:
        """The stream's messages with sequence in [``start``, ``end``) (matching ``subject`` if
        given), as chunks of (sequences, payloads) in sequence order.

        Read through a short-lived pull consumer that starts at ``start`` (in memory, no acks,
        deleted when done or, should this process die, by the server after a minute idle). Direct
        get would need no consumer, but the server spends about three times the CPU per message
        on it when messages carry headers (a ``Nats-Msg-Id``, as most producers set), which made
        it the bottleneck on two cores. This loop runs once per record, so frames are parsed
        inline, and the next batch is asked for before the current one is read."""
        if start >= end:
            return
        config: dict[str, Any] = {
            "deliver_policy": "by_start_sequence", "opt_start_seq": start, "ack_policy": "none",
            "mem_storage": True, "num_replicas": 1, "inactive_threshold": 60_000_000_000,
        }
        if subject:
            config["filter_subject"] = subject
        consumer = self.api(f"CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": config})["name"]
        pull = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()
        try:
            yield from self._pull(pull, consumer.encode(), end, batch)
        finally:
            # Not waited for: the server takes ~15 ms to answer, and a consumer whose delete
            # was lost with the connection goes by itself once idle for inactive_threshold.
            with contextlib.suppress(NatsUnreachable):
                delete = f"$JS.API.CONSUMER.DELETE.{stream}.{consumer}".encode()
                self._send(b"PUB %s %s 0\r\n\r\n" % (delete, self._reply_subject().encode()))

    def _pull(self, pull: bytes, consumer: bytes, end: int, batch: int) -> Iterator[tuple[list[int], list[bytes]]]:
        """The consumer's messages before sequence ``end``. Two pull requests are kept open (a
        request that does not wait would be refused while another is open); the server fills
        them in order, so after every ``batch`` messages another is sent. The read ends with the
        message at ``end - 1`` or past it, or when a request expires unfilled (messages before
        ``end`` were deleted and the stream has no more). Messages come with their own subject
        and the ack subject ``$JS.ACK.<stream>.<consumer>.<delivered count>.<stream sequence>.…``
        (newer servers put a domain and an account hash after ACK); only a request's end of
        messages comes to the request's reply subject."""
        mine: set[bytes] = set()

        def ask() -> None:
            reply = self._reply_subject().encode()
            body = b'{"batch":%d,"expires":%d}' % (batch, _PULL_EXPIRES_NS)
            self._send(b"PUB %s %s %d\r\n%s\r\n" % (pull, reply, len(body), body))
            mine.add(reply)

        readline, read = self.file.readline, self.file.read
        ask()
        ask()
        due = 2 * batch  # messages asked for and not yet received
        seqs: list[int] = []
        payloads: list[bytes] = []
        try:
            while True:
                line = readline()
                if line[:5] == b"HMSG ":
                    parts = line.split()
                    total = int(parts[-1])
                    blob = read(total + 2)
                    if len(blob) < total + 2:
                        raise NatsUnreachable(f"{redact(self.url)}: the connection closed mid-message")
                    if len(parts) == 5:  # no ack subject: a status, for a pull request of ours?
                        if parts[1] in mine and blob[8:9] == b" ":
                            if blob[9:12] in (b"404", b"408"):  # expired unfilled: all there is was read
                                break
                            first = blob[: blob.find(b"\r\n")].decode(errors="replace")
                            raise NatsError(f"{redact(self.url)}: reading through consumer {consumer.decode()}: {first}")
                        continue
                    ack, payload = parts[3], blob[int(parts[-2]) : total]
                elif line[:4] == b"MSG ":
                    parts = line.split()
                    total = int(parts[-1])
                    blob = read(total + 2)
                    if len(blob) < total + 2:
                        raise NatsUnreachable(f"{redact(self.url)}: the connection closed mid-message")
                    if len(parts) != 5:
                        continue
                    ack, payload = parts[3], blob[:total]
                else:
                    self._control(line)
                    continue
                tokens = ack.split(b".")
                old = len(tokens) == 9
                if tokens[3 if old else 5] != consumer:
                    continue
                seq = int(tokens[5 if old else 7])
                if seq >= end:
                    break
                if not parts[1].startswith(EDDYLINE_SUBJECTS):  # a sink's fence (jetstream): not a record
                    seqs.append(seq)
                    payloads.append(payload)
                if seq == end - 1:
                    break
                due -= 1
                if due <= batch:  # the older request is filled
                    yield seqs, payloads
                    seqs, payloads = [], []
                    ask()
                    due += batch
        except OSError as e:
            raise NatsUnreachable(f"{redact(self.url)}: {e}") from e
        if seqs:
            yield seqs, payloads

    # ------------------------------------------------------------------ publishing
    def publish(
        self, messages: list[tuple[str, str | None, bytes]], window: int = 4000, headers: bytes = b""
    ) -> list[bool]:
        """Publish (subject, message id or None, payload) to JetStream and wait for every
        acknowledgement, at most ``window`` outstanding. Returns, in message order, whether the
        server dropped each message as a duplicate of one with the same id. Like reading, this
        runs once per record, so acknowledgements are parsed inline. ``headers``: header lines
        (``Name: value``, each ending in CRLF) that every message of the call carries besides its
        id, the same for all of them."""
        if headers and (not headers.endswith(b"\r\n") or b"\r\n\r\n" in headers or headers.startswith(b"\r\n")):
            raise ValueError(f"headers: expected lines 'Name: value\\r\\n', got {headers!r}")
        # the header block is made once per call, so that extra headers cost nothing per message
        with_id = b"NATS/1.0\r\nNats-Msg-Id: %s\r\n" + headers.replace(b"%", b"%%") + b"\r\n"
        bare = b"NATS/1.0\r\n" + headers + b"\r\n" if headers else None
        duplicate = [False] * len(messages)
        pending: dict[bytes, int] = {}
        sent = 0
        readline = self.file.readline
        try:
            while sent < len(messages) or pending:
                # refill only once half the window is acknowledged: one send per batch, not per ack
                if sent < len(messages) and len(pending) <= window // 2:
                    frames = []
                    while sent < len(messages) and len(pending) < window:
                        subject, msg_id, payload = messages[sent]
                        reply = self._reply_subject().encode()
                        pending[reply] = sent
                        sent += 1
                        if msg_id is not None:
                            hdr = with_id % msg_id.encode()
                        elif bare is not None:
                            hdr = bare
                        else:
                            frames.append(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply, len(payload), payload))
                            continue
                        frames.append(
                            b"HPUB %s %s %d %d\r\n%s%s\r\n"
                            % (subject.encode(), reply, len(hdr), len(hdr) + len(payload), hdr, payload)
                        )
                    self._send(b"".join(frames))
                line = readline()
                if line[:4] == b"MSG ":  # an ack: {"stream":"S","seq":N[,"duplicate":true]}
                    parts = line.split()
                    body = self._read(int(parts[-1]))
                    index = pending.pop(parts[1], None)
                    if index is not None:
                        if b'"error"' in body:
                            error = json.loads(body)["error"].get("description")
                            raise NatsError(f"{redact(self.url)}: publish to {messages[index][0]!r}: {error}")
                        duplicate[index] = b'"duplicate"' in body
                elif line[:5] == b"HMSG ":  # a status: no stream takes the subject
                    parts = line.split()
                    body = self._read(int(parts[-1]))
                    index = pending.pop(parts[1], None)
                    if index is not None and _status(body) == b"503":
                        raise NatsError(f"{redact(self.url)}: no stream takes subject {messages[index][0]!r}")
                else:
                    self._control(line)
        except OSError as e:
            raise NatsUnreachable(f"{redact(self.url)}: {e}") from e
        return duplicate

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> NatsConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Subscription:
    """A core NATS subscription (plain ``SUB``: no JetStream, nothing kept by the server) on a
    connection of its own, received in batches: :meth:`receive` returns every message that has
    arrived (up to ``max_bytes``), waiting at most ``timeout_s`` for the first, so the caller can
    store one batch while the next arrives. Messages published while nobody is subscribed are
    not delivered: that is core NATS.

    The connection is made and subscribed like any other (the ``PONG`` after ``SUB`` says the
    server registered it); from then on the socket is read directly into a buffer of its own
    and parsed in place, so that a wait can time out without leaving a half-read frame behind.
    Not thread-safe."""

    SID = b"2"  # sid 1 is the connection's request inbox

    def __init__(self, url: str, subject: str, *, timeout_s: float = 5.0, name: str = "eddyline-subscriber"):
        if not subject or any(c.isspace() for c in subject):
            raise NatsError(f"{redact(url)}: invalid subject {subject!r}")
        self.conn = NatsConnection(url, timeout_s=timeout_s, name=name)
        self.url, self.subject = url, subject
        try:
            self.conn._send(b"SUB %s %s\r\nPING\r\n" % (subject.encode(), self.SID))
            self.conn._expect_pong()  # the server took the SUB, or said why not (-ERR)
            sock = self.conn.sock
            sock.setblocking(False)  # what the buffered reader holds past the PONG, without waiting
            try:
                self._buf = bytearray(self.conn.file.read1(1 << 20) or b"")
            except ssl.SSLWantReadError:
                self._buf = bytearray()
            sock.settimeout(timeout_s)
        except BaseException:
            self.conn.close()
            raise
        self.received = 0  # messages received on this connection

    def receive(self, timeout_s: float, max_bytes: int = 4 << 20) -> list[bytes]:
        """The payloads of the messages that have arrived, in order, at most about ``max_bytes``
        of them (the rest stay for the next call); waits up to ``timeout_s`` for the first.
        A lost connection raises :class:`NatsUnreachable`, a refusal (-ERR) :class:`NatsError`."""
        out = self._parse(max_bytes)
        if out:
            return out
        sock, wait, limit = self.conn.sock, timeout_s, max_bytes
        try:
            while True:
                if not self._readable(wait):
                    return []
                while True:  # what is there, without waiting, up to the limit
                    chunk = sock.recv(1 << 20)
                    if not chunk:
                        raise NatsUnreachable(f"{redact(self.url)}: the server closed the connection")
                    self._buf += chunk
                    if len(self._buf) >= limit or not self._readable(0):
                        break
                out = self._parse(max_bytes)
                if out:
                    return out
                # a frame is not complete yet (it may be larger than max_bytes: read on past
                # the limit until it is), or only control frames came
                limit, wait = len(self._buf) + (1 << 20), 0.05
        except OSError as e:
            raise NatsUnreachable(f"{redact(self.url)}: {e}") from e

    def _readable(self, wait: float) -> bool:
        """Something to receive within ``wait`` seconds (over TLS: bytes already decrypted, which
        the socket no longer shows to ``select``, count too)."""
        sock = self.conn.sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        return bool(select.select([sock], [], [], wait)[0])

    def _parse(self, max_bytes: int) -> list[bytes]:
        """The complete messages at the front of the buffer (control frames handled on the way)."""
        buf, pos, out, size = self._buf, 0, [], 0
        while size < max_bytes:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            if buf.startswith(b"MSG ", pos) or buf.startswith(b"HMSG ", pos):
                parts = bytes(buf[pos:eol]).split()  # [H]MSG subject sid [reply] [hdr bytes] bytes
                total = int(parts[-1])
                start, end = eol + 2, eol + 2 + total
                if end + 2 > len(buf):
                    break  # the rest of the message has not arrived
                if parts[2] == self.SID:
                    hlen = int(parts[-2]) if parts[0] == b"HMSG" else 0
                    out.append(bytes(buf[start + hlen : end]))
                    size += total
                pos = end + 2
                continue
            line = bytes(buf[pos : eol + 2])
            pos = eol + 2
            if line.startswith(b"-ERR"):
                text = line[5:].strip().decode(errors="replace")
                if "Permissions Violation" in text or "Invalid Subject" in text:
                    raise NatsError(f"{redact(self.url)}: subscribing to {self.subject!r}: {text}")
                raise NatsUnreachable(f"{redact(self.url)}: {text}")  # the server closes the connection
            if line.startswith(b"PING"):
                self.conn._send(b"PONG\r\n")
            # +OK, PONG, INFO: nothing to do
        if pos:
            del buf[:pos]
        self.received += len(out)
        return out

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether the NATS subject ``subject`` is one ``pattern`` (with ``*`` and ``>``) takes."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


def ensure_stream(conn: NatsConnection, stream: str, subjects: list[str], duplicate_window_ms: int | None = None,
                  also: list[str] | None = None) -> dict[str, Any]:
    """Create ``stream`` (file storage; direct get allowed, for other readers) if it does not exist; widen its
    de-duplication window to ``duplicate_window_ms`` if it is shorter. ``also``: subjects an
    existing stream is given if it does not take them yet (Eddyline's own). Returns its config."""
    try:
        config = conn.stream_info(stream)["config"]
    except NatsError as e:
        if "10059" not in str(e):  # stream not found
            raise
        config = {"name": stream, "subjects": [*subjects, *(also or [])], "storage": "file", "allow_direct": True,
                  "retention": "limits", "discard": "old", "num_replicas": 1}
        if duplicate_window_ms is not None:
            config["duplicate_window"] = duplicate_window_ms * 1_000_000
        return conn.api(f"STREAM.CREATE.{stream}", config)["config"]
    update: dict[str, Any] = {}
    if duplicate_window_ms is not None and config.get("duplicate_window", 0) < duplicate_window_ms * 1_000_000:
        update["duplicate_window"] = duplicate_window_ms * 1_000_000
    missing = [s for s in also or [] if not any(subject_matches(p, s) for p in config.get("subjects") or [])]
    if missing:
        update["subjects"] = [*(config.get("subjects") or []), *missing]
    if update:
        config = conn.api(f"STREAM.UPDATE.{stream}", {**config, **update})["config"]
    return config


#: how long a pull request waits for messages: they are in the stream already, so only a read
#: whose last messages were deleted waits this long
_PULL_EXPIRES_NS = 1_000_000_000


def _status(headers: bytes) -> bytes | None:
    """The status code of a status message (``NATS/1.0 204 EOB``), else None."""
    if headers.startswith(b"NATS/1.0 ") and len(headers) >= 12:
        return headers[9:12]
    return None
