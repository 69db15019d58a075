"""Serve the dashboard from a background thread of the driver (uvicorn; outside the main thread it
installs no signal handlers, so Ctrl-C still stops the run after its epoch)."""

from __future__ import annotations

import ipaddress
import threading
import time

import uvicorn
from fastapi import FastAPI

from eddyline.errors import SpecError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_binding(host: str, token: str | None, options: tuple[str, str] = ("--ui-host", "--ui-token")) -> None:
    """Refuse to serve the control API beyond this machine without a token (``options``: how the
    command names the address and the token)."""
    if not is_loopback(host) and not token:
        raise SpecError(f"{options[0]} {host}: the dashboard controls the network; binding to an address other "
                        f"than 127.0.0.1 / ::1 / localhost needs {options[1]} (or $EDDYLINE_UI_TOKEN)")


class DashboardServer:
    """``app`` on ``host:port`` (port 0: any free port; see :attr:`port`) until :meth:`stop`."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
                 options: tuple[str, str] = ("--ui-host", "--ui-token")):
        check_binding(host, token, options)
        self.host = host
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, name="eddyline-ui", daemon=True)

    def start(self, timeout_s: float = 15.0) -> DashboardServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the dashboard could not listen on {self.host} (is the port in use?)")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
