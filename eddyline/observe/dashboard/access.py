"""Who may reach the dashboard, its ``/metrics`` and its control API, and from where.

A dashboard on 127.0.0.1 is still reachable from every web page the operator has open: a page can
send a form (``POST``, ``text/plain`` or form-encoded, no script, no preflight) to
``http://127.0.0.1:PORT/``, and a page on a name that its DNS later points at 127.0.0.1 (DNS
rebinding) can even read the answers. Three rules close that, checked before any route runs:

1. **A token by default.** Unless the operator gives one (``--ui-token``, ``$EDDYLINE_UI_TOKEN``)
   the server makes a random one at start and prints, once, the URL that carries it. Reads take it
   as ``Authorization: Bearer``, ``?token=`` or the page's cookie; control calls only as the
   header, which a foreign page cannot set without CORS (and this server answers no preflight).
   Serving without one is an explicit choice, and refused beyond loopback.
2. **The Host header must be one the server was bound for**: the loopback names, the bind
   address, this machine's names when bound to every address, and the names the operator adds.
   A rebinding page sends its own name, so it is refused before any route.
3. **Every call that changes something is non-simple**: ``Content-Type: application/json``
   (which a page can only send with a preflighted ``fetch``), and neither a foreign ``Origin``
   nor ``Sec-Fetch-Site: cross-site``/``same-site``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from eddyline.errors import SpecError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: methods a browser's cross-site requests may use that change nothing here
READS = frozenset({"GET", "HEAD"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _this_machine() -> set[str]:
    """The names and addresses a browser may use for this machine when the server listens on all."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        with contextlib.suppress(OSError):  # a name that does not resolve here
            names |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    return names


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (and without the brackets of an IPv6 literal)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class Access:
    """The rules one server enforces: ``token`` (None only when the operator chose none, on
    loopback), the ``hosts`` its Host header may name, and whether the token was made here (then
    the URL that carries it is printed once)."""

    token: str | None
    hosts: frozenset[str]
    generated: bool = False

    @classmethod
    def bind(cls, host: str, token: str | None = None, *, no_token: bool = False, allow_hosts: tuple[str, ...] = (),
             options: tuple[str, str, str] = ("--ui-host", "--ui-token", "--ui-no-token")) -> Access:
        """The rules for a server listening on ``host`` (``options``: how the command names the
        address, the token and the choice of none, for its errors)."""
        where, token_option, none_option = options
        if no_token and token:
            raise SpecError(f"{none_option} and {token_option} (or $EDDYLINE_UI_TOKEN) contradict each other: give one")
        if no_token and not is_loopback(host):
            raise SpecError(f"{where} {host}: the dashboard controls the network; {none_option} is only allowed on "
                            "127.0.0.1 / ::1 / localhost")
        hosts = set(LOOPBACK_NAMES) | {host_name(h) for h in allow_hosts}
        if is_wildcard(host):
            hosts |= _this_machine()
        else:
            hosts.add(host_name(host))
        if no_token:
            return cls(None, frozenset(hosts))
        if token:
            return cls(token, frozenset(hosts))
        return cls(secrets.token_urlsafe(24), frozenset(hosts), generated=True)

    @classmethod
    def open_loopback(cls, token: str | None = None) -> Access:
        """Loopback names only, with ``token`` or none (for tests and embedded use)."""
        return cls(token, LOOPBACK_NAMES)

    def refusal(self, method: str, headers: dict[str, str]) -> tuple[int, str] | None:
        """Why a request with these (lower-cased) headers is refused before any route, or None."""
        host = headers.get("host", "")
        if host_name(host) not in self.hosts:
            return 400, (f"this dashboard does not serve the host {host!r} (it answers for "
                         f"{', '.join(sorted(self.hosts))}; add a name with --ui-allow-host)")
        if method in READS:
            return None
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return 403, f"a call from another site ({site}) is refused: use the dashboard's own page or a client"
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc.lower() != host.strip().lower():
            return 403, f"a call from the origin {origin!r} is refused: use the dashboard's own page or a client"
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return 415, f"a call that changes something must send Content-Type: application/json (got {media or 'none'!r})"
        return None


class Guard:
    """ASGI middleware that applies :meth:`Access.refusal` to every HTTP request before routing."""

    def __init__(self, app: Any, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            refused = self.access.refusal(scope["method"], headers)
            if refused is not None:
                from fastapi.responses import JSONResponse

                await JSONResponse({"detail": refused[1]}, status_code=refused[0])(scope, receive, send)
                return
        await self.app(scope, receive, send)
