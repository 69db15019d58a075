"""A standalone Spark master and workers on this machine, all on 127.0.0.1 and one file system:
the fault matrix's executor and worker cells (``bench/faults``) use it. The same on separate
hosts, with nothing shared but the network, is :mod:`tests.hosts.cluster`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket stays bound until all are chosen, so the same
    port cannot come back twice."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return int(json.loads(r.read())["aliveworkers"])
    except (OSError, ValueError, KeyError):
        # not up yet; once, right after start, the master answered /json/ with its HTML page
        return 0


class Cluster:
    """A standalone master and ``workers`` 1-core workers on 127.0.0.1, each a process of its own
    (the fault matrix in ``bench/faults`` uses it too); :attr:`work` holds one folder per
    application and executor."""

    def __init__(self, base: Path, workers: int = 2):
        self.base, self.work = base, base / "work"
        self.port, self.ui = free_ports(2)
        self.env = {**os.environ, "SPARK_LOG_DIR": str(base), "SPARK_LOCAL_IP": "127.0.0.1"}
        # the master, the workers and the executors they start get the suite's JVM options too
        # (tests/conftest.py); Java's launcher reads JDK_JAVA_OPTIONS for every JVM it starts
        if "SPARK_SUBMIT_OPTS" in os.environ:
            self.env["JDK_JAVA_OPTIONS"] = os.environ["SPARK_SUBMIT_OPTS"]
        self.master = subprocess.Popen(
            [spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
             "--webui-port", str(self.ui)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=(base / "master.log").open("w"))
        self.workers: list[subprocess.Popen] = []
        self.started = 0
        try:
            for _ in range(workers):
                self.workers.append(self.start_worker())
            self.wait_alive(workers)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start_worker(self) -> subprocess.Popen:
        (ui,) = free_ports(1)
        self.started += 1
        return subprocess.Popen(
            [spark_class(), "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1", "--cores", "1",
             "--memory", "2g", "--webui-port", str(ui), "--work-dir", str(self.work)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=(self.base / f"worker-{self.started}.log").open("w"))

    def wait_alive(self, n: int, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while alive_workers(self.ui) < n:
            assert time.monotonic() < deadline, (self.base / "master.log").read_text()[-2000:]
            assert self.master.poll() is None and all(p.poll() is None for p in self.workers), "a cluster process exited"
            time.sleep(0.5)

    def kill_worker(self, i: int) -> list[int]:
        """SIGKILL worker ``i`` with everything it started (its executor's JVM and Python
        workers), as when its machine dies; start a fresh worker in its place (it registers
        with the master, which may or may not give it an executor of the running application).
        The pids killed."""
        import psutil

        victim = psutil.Process(self.workers[i].pid)
        procs = [victim, *victim.children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(procs, timeout=10)
        self.workers[i].wait()
        self.workers[i] = self.start_worker()
        return [p.pid for p in procs]

    def restart_worker(self, i: int) -> float:
        """SIGTERM to worker ``i`` (it stops its executors first, as in a rolling restart), then a
        fresh worker in its place; the seconds the old one took to exit."""
        t0 = time.monotonic()
        self.workers[i].terminate()
        try:
            self.workers[i].wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.workers[i].kill()
            self.workers[i].wait()
        took = time.monotonic() - t0
        self.workers[i] = self.start_worker()
        return took

    def executors(self, i: int) -> list:
        """The executor JVMs worker ``i`` runs (psutil processes)."""
        import psutil

        found = []
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(self.workers[i].pid).children(recursive=True):
                # the executor's Python workers come and go between listing and asking: skip them
                with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()):
                        found.append(p)
        return found

    def stop(self) -> None:
        procs = [*reversed(self.workers), self.master]
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
