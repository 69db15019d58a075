"""A Spark standalone cluster on separate hosts (:mod:`tests.hosts.netns`) with its checkpoint on an
S3-compatible store: a ``store`` host (moto's server, behind :mod:`tests.hosts.slowlink` so the
store can be made slow), a ``master`` host, worker hosts ``w1``, ``w2``, ..., and driver hosts
(``leader``, ``standby``) made on demand. Nothing is shared between hosts but the network: a
driver's spec is written into its host's ``/tmp``, the checkpoint and the sinks are on the store.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.runtime.e2e.adaptive_net import network

from .netns import Host, Hosts

S3_PORT, MOTO_PORT, MASTER_PORT, MASTER_UI = 9000, 9001, 7077, 8080
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "eddyline", "AWS_SECRET_ACCESS_KEY": "eddyline", "AWS_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
# The master gives up on a worker it has not heard from for this long (its default is 60 s); a
# worker sends its heartbeat every quarter of it, so both must know it.
DAEMON_OPTS = "-Dspark.worker.timeout=10"


# Each driver's application takes two cores (one on each worker), so a standby's application has
# its executors before it takes over; a request to the store gives up after a second, well inside
# the lease timeouts the tests use.
DRIVER_ENV = {"EDDYLINE_SPARK_CONF": "spark.cores.max=2", "EDDYLINE_STORE_TIMEOUT": "1"}


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def wait_for(what: str, ok: Any, timeout_s: float = 180.0, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(every)


def listening(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


class Cluster:
    """The hosts, the store and Spark. :attr:`env` is what a process needs to reach the store."""

    def __init__(self, base: Path, workers: int = 2):
        self.hosts = Hosts(base)
        try:
            self.store = self.hosts.add("store")
            self.master = self.hosts.add("master")
            self.workers = [self.hosts.add(f"w{i + 1}") for i in range(workers)]
            self.env = {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://{self.store.ip}:{S3_PORT}"}
            self._start_store()
            self._start_master()
            for w in self.workers:
                self.start_worker(w)
            wait_for("every worker registered", lambda: self.alive_workers() == len(self.workers), 90)
        except BaseException:
            self.hosts.close()
            raise

    # the store -------------------------------------------------------------------------------
    def _start_store(self) -> None:
        moto = str(Path(sys.executable).parent / "moto_server")
        self.store.start([moto, "-H", "127.0.0.1", "-p", str(MOTO_PORT)], "moto.log")
        self.store.start([sys.executable, "-m", "tests.hosts.slowlink", f"{self.store.ip}:{S3_PORT}",
                          f"127.0.0.1:{MOTO_PORT}", "/tmp/slowlink.json"], "slowlink.log",
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        wait_for("the store", lambda: listening(self.store.ip, S3_PORT), 30)
        wait_for("moto behind the relay", self._store_answers, 30)

    def _store_answers(self) -> bool:
        try:
            urllib.request.urlopen(f"http://{self.store.ip}:{S3_PORT}/", timeout=2).close()
            return True
        except OSError:
            return False

    def bucket(self, name: str) -> str:
        req = urllib.request.Request(f"http://{self.store.ip}:{S3_PORT}/{name}", method="PUT")
        urllib.request.urlopen(req, timeout=10).close()
        return f"s3://{name}"

    def slow_store(self, delay_ms: float = 0, loss: float = 0.0, down: bool = False) -> None:
        """What the relay in front of the store does from now on: ``delay_ms`` added to each round
        trip, a share ``loss`` of the chunks held back as a lost packet is (200 ms), or (``down``)
        every connection refused and cut."""
        (self.store.tmp / "slowlink.json").write_text(json.dumps({"delay_ms": delay_ms, "loss": loss, "down": down}))
        time.sleep(0.3)  # the relay reads it every 0.1 s

    # Spark ----------------------------------------------------------------------------------
    def _spark_env(self, host: Host) -> dict[str, str]:
        env = {**self.env, "SPARK_LOCAL_IP": host.ip, "SPARK_LOCAL_HOSTNAME": host.ip, "SPARK_LOG_DIR": "/tmp",
               "PYSPARK_PYTHON": sys.executable, "SPARK_WORKER_DIR": "/tmp/work", "SPARK_DAEMON_JAVA_OPTS": DAEMON_OPTS}
        if "SPARK_SUBMIT_OPTS" in os.environ:  # the suite's JVM options, for every JVM
            env["JDK_JAVA_OPTIONS"] = os.environ["SPARK_SUBMIT_OPTS"]
        return env

    def _start_master(self) -> None:
        self.master.start([spark_class(), "org.apache.spark.deploy.master.Master", "--host", self.master.ip,
                           "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI)], "master.log",
                          env=self._spark_env(self.master))

    @property
    def url(self) -> str:
        return f"spark://{self.master.ip}:{MASTER_PORT}"

    def start_worker(self, host: Host) -> None:
        host.start([spark_class(), "org.apache.spark.deploy.worker.Worker", self.url, "--host", host.ip,
                    "--cores", "2", "--memory", "4g", "--work-dir", "/tmp/work"], "worker.log",
                   env=self._spark_env(host))

    def master_state(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://{self.master.ip}:{MASTER_UI}/json/", timeout=2) as r:
                return dict(json.loads(r.read()))
        except (OSError, ValueError):
            return {}

    def alive_workers(self) -> int:
        return int(self.master_state().get("aliveworkers", 0))

    def executor_hosts(self) -> list[str]:
        """The names of the worker hosts that run an executor now."""
        return [w.name for w in self.workers if any("CoarseGrainedExecutorBackend" in _cmdline(p) for p in w.pids())]

    # drivers --------------------------------------------------------------------------------
    def driver_host(self, name: str) -> Host:
        return self.hosts.hosts.get(name) or self.hosts.add(name)

    def driver(self, host: Host, spec: dict[str, Any], checkpoint: str, *args: str,
               master: str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``eddyline run`` on ``host`` against the cluster (or ``master``); its output in the host's
        ``driver.log``."""
        import yaml

        (host.tmp / "net.yaml").write_text(yaml.safe_dump(spec))
        for old in ("driver.log", "progress.jsonl"):  # an earlier run's on this host
            (host.tmp / old).unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "eddyline.cli", "run", "/tmp/net.yaml", "--checkpoint", checkpoint, "--no-live",
               "--master", master or self.url, "--progress-json", "/tmp/progress.jsonl", *args]
        return host.start(cmd, "driver.log", env={**self._spark_env(host), **DRIVER_ENV, **(env or {})})

    def close(self) -> None:
        self.hosts.close()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def store_client(cluster: Cluster, bucket: str) -> Any:
    """An :class:`~eddyline.objectstore.ObjectStore` of ``bucket`` on the cluster's store, for this
    process (which may use another store through its own environment)."""
    from eddyline import objectstore

    with objectstore.using(cluster.env):
        return objectstore.ObjectStore(bucket)


def download(cluster: Cluster, location: str, to: Path) -> Path:
    """Copy everything under ``s3://bucket/prefix`` to the folder ``to`` (to read it with DuckDB)."""
    import pyarrow.fs as pafs

    from eddyline import objectfs, objectstore

    with objectstore.using(cluster.env):
        pafs.copy_files(location.removeprefix("s3://"), str(to), source_filesystem=objectfs.filesystem(),
                        destination_filesystem=pafs.LocalFileSystem())
    return to


def on_store(spec: dict, bucket: str) -> dict:
    """``spec`` with its files sinks moved to ``s3://bucket/out/<name>``."""
    for sink in spec["sinks"]:
        sink["files"]["path"] = f"s3://{bucket}/out/{Path(sink['files']['path']).name}"
    return spec


def paced(out: Path, bucket: str, per_epoch: int = 300, trigger_ms: int = 1000) -> dict:
    """The network with ``per_epoch`` rows a source and epochs ``trigger_ms`` apart: long enough
    to do something to a host while it runs."""
    spec = on_store(network(out, {"chaos": {"random_moves": 3, "seed": 11}}), bucket)
    spec["trigger"] = trigger_ms
    for source in spec["sources"]:
        source["max_rows_per_epoch"] = per_epoch
    return spec


def documents(cluster: Cluster, bucket: str, folder: str) -> dict[int, dict]:
    """The checkpoint's plans or commits by epoch, read from the store."""
    store = store_client(cluster, bucket)
    found = {}
    for key in store.list(f"ckpt/{folder}"):
        got = store.get(key) if key.endswith(".json") else None
        if got is not None:
            found[int(key.rsplit("/", 1)[1][:-5])] = json.loads(got[0])
    return found


def commits(cluster: Cluster, bucket: str) -> dict[int, dict]:
    return documents(cluster, bucket, "commits")


def store_requests(cluster: Cluster) -> dict[str, int]:
    """How many requests of each kind the store's relay has passed on so far."""
    try:
        return dict(json.loads((cluster.store.tmp / "slowlink.counts.json").read_text()))
    except (OSError, ValueError):
        return {}


def wait_mid_epoch(cluster: Cluster, bucket: str, after: int = 3) -> int:
    """Wait until an epoch past ``after`` is under way (its plan logged, no commit yet): its
    tasks are about to run or running. That epoch."""
    store = store_client(cluster, bucket)

    def epochs(folder: str) -> set[int]:
        return {int(k.rsplit("/", 1)[1][:-5]) for k in store.list(f"ckpt/{folder}") if k.endswith(".json")}

    found: list[int] = []

    def under_way() -> bool:
        open_ = epochs("plans") - epochs("commits")
        found[:] = [e for e in open_ if e > after]
        return bool(found)

    wait_for(f"an epoch after {after} under way", under_way, every=0.02)
    return max(found)
