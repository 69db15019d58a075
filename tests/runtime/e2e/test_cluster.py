"""The control plane on a real Spark cluster: a standalone master and two workers, started here.

Locally every lane runs in one executor's Python workers. On a cluster the lanes' tasks land on
different executors, each with its own Python workers and state cache, and Spark, not Eddyline,
picks the executor for a lane's task in every epoch. So a key group's state must come from the
checkpoint wherever its lane runs. The network of ``test_adaptive`` (window aggregate, dedup,
interval join) runs there with random moves, a rescale 2 → 3 → 1 and hot-key splits, and must write
what a static run on ``local[2]`` writes.
"""

from __future__ import annotations

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
from tests.runtime.e2e.test_adaptive import CHURN, network, plans, read


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``spark://`` URL of a master with two 1-core workers; the workers' directory (one folder
    per application and executor)."""
    base = tmp_path_factory.mktemp("cluster")
    port, ui, *worker_ui = free_ports(4)
    env = {**os.environ, "SPARK_LOG_DIR": str(base), "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [spark_class()]
    procs = [subprocess.Popen([*cmd, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                               str(port), "--webui-port", str(ui)],
                              env=env, stdout=subprocess.DEVNULL, stderr=(base / "master.log").open("w"))]
    url = f"spark://127.0.0.1:{port}"
    try:
        for i in range(2):
            procs.append(subprocess.Popen(
                [*cmd, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1", "--memory",
                 "2g", "--webui-port", str(worker_ui[i]), "--work-dir", str(base / "work")],
                env=env, stdout=subprocess.DEVNULL, stderr=(base / f"worker-{i}.log").open("w")))
        deadline = time.monotonic() + 90
        while alive_workers(ui) < 2:
            assert time.monotonic() < deadline, (base / "master.log").read_text()[-2000:]
            assert all(p.poll() is None for p in procs), "a cluster process exited"
            time.sleep(0.5)
        yield url, base / "work"
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.slow
def test_moves_rescales_and_splits_on_a_two_worker_cluster_match_a_static_local_run(
    spark, cluster: tuple[str, Path], tmp_path: Path
) -> None:
    url, work = cluster
    Engine(load_spec(network(tmp_path / "ref")), spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text(yaml.safe_dump(network(tmp_path / "out", CHURN)))
    ckpt = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec_file), "--checkpoint", str(ckpt), "--until-idle",
           "--no-live", "--master", url]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}  # the executors reach the driver on loopback
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]

    for what in ("windows", "firsts", "pairs"):
        want = read(tmp_path / "ref", what)
        assert len(want) > 100, what
        assert read(tmp_path / "out", what) == want, what

    # the application ran on both workers, and both executors ran tasks
    executors = [d for d in work.glob("app-*/*") if d.is_dir()]
    assert len(executors) == 2, executors
    for d in executors:
        assert "Running task" in (d / "stderr").read_text(), d
    # and the control plane did move, rescale and split while it ran there
    logged = plans(ckpt)
    assert [p["routing"]["per_key"]["lanes"] for p in logged][2:4] == [3, 3]
    assert any(d["kind"] == "chaos" for p in logged for d in p["decisions"])
    assert any(p["routing"]["bids_in_auction"].get("spread") for p in logged)
