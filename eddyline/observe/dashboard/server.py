"""Serve the dashboard from a background thread of the driver (uvicorn; outside the main thread it
installs no signal handlers, so Ctrl-C still stops the run after its epoch)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from eddyline.observe.dashboard.access import Access, is_wildcard
from eddyline.observe.dashboard.app import Feed, create_app


class DashboardServer:
    """The dashboard of ``feed`` on ``host:port`` (port 0: any free port; see :attr:`port`) under
    the rules of ``access``, until :meth:`stop`."""

    def __init__(self, feed: Feed, access: Access, host: str = "127.0.0.1", port: int = 8080):
        self.host, self.access = host, access
        self.server = uvicorn.Server(uvicorn.Config(create_app(feed, access), host=host, port=port, log_level="warning",
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
        host = socket.gethostname() if is_wildcard(self.host) else self.host  # a name its Host check accepts
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    @property
    def login_url(self) -> str:
        """The URL to open: with the token when this server made it (printed once, as Jupyter does)."""
        return f"{self.url}?token={self.access.token}" if self.access.generated else self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
