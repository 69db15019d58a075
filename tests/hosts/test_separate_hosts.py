"""Eddyline on separate hosts (network and mount namespaces, :mod:`tests.hosts.netns`): a Spark
master, two worker hosts, driver hosts and a store host, sharing nothing but the network. The
checkpoint and the sinks are only on the store (moto's S3 server), so a lane that a move or a
rescale lands on the other worker host loads the state the first one wrote from there.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from eddyline.api.validate import load_spec
from eddyline.runtime.engine import Engine
from tests.runtime.e2e.adaptive_net import CHURN, network
from tests.runtime.e2e.helpers import read

from .cluster import (
    Cluster,
    commits,
    documents,
    download,
    on_store,
    paced,
    store_client,
    wait_for,
    wait_mid_epoch,
)

OUTPUTS = ("windows", "firsts", "pairs")
#: the drivers' lease timeout: a holder cut off from the store stops after three quarters of it
LEASE_S = 4


@pytest.fixture(scope="module")
def local_run(spark, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The network's output from a static run on ``local[2]`` with a local checkpoint."""
    base = tmp_path_factory.mktemp("local")
    Engine(load_spec(network(base / "ref")), spark, str(base / "ref-ckpt")).run(until_idle=True)
    return base / "ref"


@pytest.mark.slow
def test_moves_rescales_and_splits_across_hosts_with_the_checkpoint_on_the_store_match_a_local_run(
    cluster: Cluster, local_run: Path, tmp_path: Path
) -> None:
    bucket = f"net-{uuid.uuid4().hex[:8]}"
    cluster.bucket(bucket)
    leader = cluster.driver_host("leader")
    driver = cluster.driver(leader, on_store(network(Path("out"), CHURN), bucket), f"s3://{bucket}/ckpt", "--until-idle")
    assert driver.wait(600) == 0, (leader.tmp / "driver.log").read_text()[-3000:]

    got = download(cluster, f"s3://{bucket}/out", tmp_path / "out")
    for what in OUTPUTS:
        want = read(local_run, what)
        assert len(want) > 100, what
        assert read(got, what) == want, what
    # the lanes ran on both worker hosts, each in an executor of its own
    for w in cluster.workers:
        logs = list(w.tmp.glob("work/app-*/*/stderr"))
        assert any("Running task" in log.read_text() for log in logs), w.name
    # the control plane moved, rescaled and split while it ran there
    plans = [p for _, p in sorted(documents(cluster, bucket, "plans").items())]
    assert [p["routing"]["per_key"]["lanes"] for p in plans][2:4] == [3, 3]
    assert any(d["kind"] == "chaos" for p in plans for d in p["decisions"])
    # and nothing of the checkpoint is on any host's disk
    for host in cluster.hosts.hosts.values():
        assert not [p for p in host.tmp.rglob("*") if p.name in ("commits", "plans", "lease")], host.name


CONTEND = """
import json, sys, time
from eddyline.ha.lease import Lease
name, checkpoint, start_at, rounds = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
won = []
for r in range(rounds):
    lease = Lease(checkpoint, timeout_s=60, holder=f"{name}-{r}")
    time.sleep(max(0.0, start_at + 2.0 * r - time.time()))
    if lease.try_acquire(force=True):
        won.append(lease.generation)
print(json.dumps(won))
"""


def test_drivers_on_three_hosts_racing_for_the_lease_leave_one_winner_per_generation(cluster: Cluster) -> None:
    """Processes on three hosts, each round starting at one moment, take the lease over from
    whoever holds it: every generation any of them took has exactly one holder, and it is the
    one whose lease file the store kept."""
    bucket = f"lease-{uuid.uuid4().hex[:8]}"
    cluster.bucket(bucket)
    hosts = [cluster.driver_host(n) for n in ("leader", "standby", "third")]
    start_at, rounds = time.time() + 4, 4
    procs = {h.name: h.start([sys.executable, "-c", CONTEND, h.name, f"s3://{bucket}/ckpt", str(start_at),
                              str(rounds)], "contend.log", env=cluster.env) for h in hosts}
    won = {}
    for name, p in procs.items():
        assert p.wait(120) == 0, (cluster.hosts[name].tmp / "contend.log").read_text()[-2000:]
        won[name] = json.loads((cluster.hosts[name].tmp / "contend.log").read_text().strip().splitlines()[-1])
    taken = Counter(g for gens in won.values() for g in gens)
    assert taken and all(n == 1 for n in taken.values()), won
    assert sum(taken.values()) >= rounds  # at least one winner a round (a late one may win the next)
    store = store_client(cluster, bucket)
    for name, gens in won.items():
        for g in gens:
            assert json.loads(store.get(f"ckpt/lease/{g:010d}.json")[0])["holder"].startswith(name)


@pytest.mark.slow
def test_a_worker_host_that_dies_mid_epoch_costs_seconds_and_changes_no_row(
    cluster: Cluster, local_run: Path, tmp_path: Path
) -> None:
    """Worker host w1 cut off the network and every process of it killed (its worker, its
    executors, their Python workers) while an epoch runs, so nothing tells the others: the driver gives the executor up, its tasks run again on w2, and the
    lanes there load the key groups' state from the store."""
    bucket = f"kill-{uuid.uuid4().hex[:8]}"
    cluster.bucket(bucket)
    leader = cluster.driver_host("leader")
    driver = cluster.driver(leader, paced(Path("out"), bucket), f"s3://{bucket}/ckpt", "--until-idle")
    try:
        wait_for("epoch 4 committed", lambda: 4 in commits(cluster, bucket))
        assert set(cluster.executor_hosts()) == {"w1", "w2"}
        wait_mid_epoch(cluster, bucket, after=4)
        victim = cluster.workers[0]
        killed_at = time.time()
        victim.down()  # off the network first, so that no process of it says goodbye
        victim.kill()
        assert driver.wait(600) == 0, (leader.tmp / "driver.log").read_text()[-3000:]
    finally:
        victim.up()
        cluster.start_worker(victim)  # the host comes back for the next test
    done = commits(cluster, bucket)
    after = sorted(c["committed_at"] for c in done.values() if c["committed_at"] > killed_at)
    gaps = [b - a for a, b in zip(after, after[1:], strict=False)]
    print(f"a worker host lost: first commit {after[0] - killed_at:.1f} s after the kill, slowest epoch after "
          f"it {max(gaps, default=0):.1f} s")
    assert after[0] - killed_at < 15
    got = download(cluster, f"s3://{bucket}/out", tmp_path / "out")
    for what in OUTPUTS:
        assert read(got, what) == read(local_run, what), what


@pytest.mark.slow
def test_a_leader_cut_off_from_the_store_fences_itself_and_a_standby_on_another_host_takes_over(
    cluster: Cluster, local_run: Path, tmp_path: Path
) -> None:
    """The store stops answering the leader's host (its requests arrive, the answers vanish). The
    leader cannot renew, so it stops before its lease can expire; the standby on its own host
    takes the lease with a conditional write and finishes the run. The old leader's process ends
    around the takeover, and every plan and commit since is the standby's."""
    bucket = f"cut-{uuid.uuid4().hex[:8]}"
    cluster.bucket(bucket)
    leader, standby = cluster.driver_host("leader"), cluster.driver_host("standby")
    spec, ckpt = paced(Path("out"), bucket, per_epoch=250), f"s3://{bucket}/ckpt"
    lease = ("--until-idle", "--lease-timeout", str(LEASE_S))
    first = cluster.driver(leader, spec, ckpt, *lease)
    # once the leader leads (a standby finding no lease would take it)
    wait_for("the leader leads", lambda: "leading as" in (leader.tmp / "driver.log").read_text())
    second = cluster.driver(standby, spec, ckpt, *lease, "--standby")
    try:
        wait_for("the standby waits", lambda: "waiting for its lease" in (standby.tmp / "driver.log").read_text())
        wait_for("3 epochs committed", lambda: len(commits(cluster, bucket)) >= 3)
        assert first.poll() is None, "the leader ended before the standby was ready"
        cut = time.time()
        cluster.store.drop_from(leader)
        first.wait(60)
        ended = time.time()  # (polled: the leader ended before this)
        wait_for("a commit by the standby", lambda: any(c["generation"] == 2 for c in commits(cluster, bucket).values()))
        cluster.store.answer(leader)
        assert second.wait(600) == 0, (standby.tmp / "driver.log").read_text()[-3000:]
    finally:
        cluster.store.answer(leader)
        for p in (first, second):
            if p.poll() is None:
                p.kill()
    log = (leader.tmp / "driver.log").read_text()
    # it stops on its own lease watch, or on the first write the store leaves unanswered: either
    # way with one line that says why
    said = ("could not renew its lease (generation 1)", "did not answer")
    assert first.returncode == 1 and any(s in log for s in said) and "Traceback" not in log, log[-3000:]
    took = json.loads(store_client(cluster, bucket).get(f"ckpt/lease/{2:010d}.json")[0])["acquired_at"]
    # it fences itself with a quarter of its lease left (tests/ha: the watch), later when the machine
    # is starved (CI runs eight JVMs on two cores here), and its process then ends (Spark's stop);
    # what it could still write after the takeover, the store refuses (the generations below)
    assert ended < took + 6.0, ended - took
    done = commits(cluster, bucket)
    assert all(c["generation"] == 2 for c in done.values() if c["committed_at"] > took)
    first_by_standby = min(c["committed_at"] for c in done.values() if c["generation"] == 2)
    print(f"the leader cut off from the store: it stopped {ended - cut:.1f} s after the cut, the standby "
          f"took the lease {took - cut:.1f} s and committed {first_by_standby - cut:.1f} s after it")
    assert first_by_standby - cut < 15  # (bench/hosts.py reports it; the goal is 10 s, CI is loaded)
    got = download(cluster, f"s3://{bucket}/out", tmp_path / "out")
    for what in OUTPUTS:
        assert read(got, what) == read(local_run, what), what
