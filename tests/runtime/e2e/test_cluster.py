"""The control plane on a real Spark cluster: a standalone master and two workers, started here.

Locally every lane runs in one executor's Python workers. On a cluster the lanes' tasks land on
different executors, each with its own Python workers and state cache, and Spark, not Eddyline,
picks the executor for a lane's task in every epoch. So a key group's state must come from the
checkpoint wherever its lane runs. The network of ``test_adaptive`` (window aggregate, dedup,
interval join) runs there with random moves, a rescale 2 → 3 → 1 and hot-key splits, and must write
what a static run on ``local[2]`` writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.runtime.engine import Engine

from .adaptive_net import CHURN, network, plans
from .helpers import read


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master with two 1-core workers."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def static_run(spark, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The network's output from a static run on ``local[2]`` (in this process)."""
    base = tmp_path_factory.mktemp("static")
    Engine(load_spec(network(base / "ref")), spark, str(base / "ref-ckpt")).run(until_idle=True)
    return base / "ref"


def cli_run(spec: Path, ckpt: Path, master: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec), "--checkpoint", str(ckpt), "--until-idle",
           "--no-live", "--master", master]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}  # the executors reach the driver on loopback
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_moves_rescales_and_splits_on_a_two_worker_cluster_match_a_static_local_run(
    cluster: Cluster, static_run: Path, tmp_path: Path
) -> None:
    url, work = cluster.url, cluster.work
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text(yaml.safe_dump(network(tmp_path / "out", CHURN)))
    ckpt = tmp_path / "ckpt"
    before = set(work.glob("app-*"))
    done = cli_run(spec_file, ckpt, url)
    _, err = done.communicate(timeout=600)
    assert done.returncode == 0, err[-3000:]

    for what in ("windows", "firsts", "pairs"):
        want = read(static_run, what)
        assert len(want) > 100, what
        assert read(tmp_path / "out", what) == want, what

    # the application ran on both workers, and both executors ran tasks
    (app,) = set(work.glob("app-*")) - before
    executors = [d for d in app.iterdir() if d.is_dir()]
    assert len(executors) == 2, executors
    for d in executors:
        assert "Running task" in (d / "stderr").read_text(), d
    # and the control plane did move, rescale and split while it ran there
    logged = plans(ckpt)
    assert [p["routing"]["per_key"]["lanes"] for p in logged][2:4] == [3, 3]
    assert any(d["kind"] == "chaos" for p in logged for d in p["decisions"])
    assert any(p["routing"]["bids_in_auction"].get("spread") for p in logged)


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_does_not_change_the_output(cluster: Cluster, static_run: Path, tmp_path: Path) -> None:
    """SIGKILL one of the two workers (its JVM, its executor, their Python workers) once epoch 3's
    plan is logged: Spark loses the executor's tasks and shuffle output and runs them again on
    the other one; the lanes load their key groups' state from the checkpoint wherever they run,
    so the output is the static local run's."""
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text(yaml.safe_dump(network(tmp_path / "out", {"chaos": {"random_moves": 3, "seed": 11}})))
    ckpt = tmp_path / "ckpt"
    proc = cli_run(spec_file, ckpt, cluster.url)
    try:
        deadline = time.monotonic() + 180
        while not (ckpt / "plans" / f"{3:010d}.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no epoch 3"
            time.sleep(0.02)
        while not cluster.executors(0):
            assert time.monotonic() < deadline, "worker 0 runs no executor"
            time.sleep(0.05)
        killed_at = time.time()
        cluster.kill_worker(0)
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    commit = json.loads((ckpt / "commits" / f"{3:010d}.json").read_text())
    assert commit["committed_at"] > killed_at  # the kill came inside epoch 3
    assert "Lost executor" in err or "ExecutorLost" in err, err[-3000:]
    for what in ("windows", "firsts", "pairs"):
        assert read(tmp_path / "out", what) == read(static_run, what), what
