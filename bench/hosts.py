"""Faults across separate hosts, and what the object store costs (issue #54).

A cluster of network namespaces (``tests/hosts``): a store host (moto's S3 server behind a relay
that can delay, lose or refuse), a Spark master, two 2-core worker hosts, a leader's and a
standby's host. The checkpoint and the sinks are only on the store.

**Fault matrix.** Each cell runs the adaptive network (a window, a dedup and a join, 3 key groups
moved every epoch; an epoch a second) once, does one thing to one host after epoch 3, and checks
every sink against a run on ``local[2]`` with a local checkpoint: rows lost, rows duplicated,
identical or not. *Detected*: from the fault to the moment the system acted on it (the driver gave
the executor up, the leader fenced itself); *recovered*: from the fault (for a fault that ends, from
its end) to the first commit after it was over. The leader's log says when it gave an executor
up to the second, so a detection within a second of the fault shows as 0.

**Kafka cells.** A Tansu broker on a host of its own (``kafka``), its log on the store host's S3
server so that it survives a kill; the adaptive network's three inputs produced into a topic each
(``eddyline produce``'s Kafka path), read by ``kafka`` sources, its three outputs written by
``kafka`` sinks (one transaction an epoch). The reference is the same network on ``local[2]`` with
a local checkpoint, reading the same topics and writing topics of its own; every output topic is
read ``read_committed`` (less the records of aborted attempts Tansu still hands out, see
``bench/faults/harness.read_topic``) and compared with the reference's, row by row. The faults:
the broker's host off the network for longer than the clients' request timeouts, the broker
killed and started again, and the driver SIGKILLed with an epoch's Kafka transaction open
(``--crash-at EPOCH:mid_publish``), then run again.

**Store cost.** The same network unpaced on ``local[2]`` on the leader's host: a local checkpoint
against the checkpoint and the sinks on the store with 0, 20 and 100 ms added to each round trip,
and the requests the store received per epoch, by kind.

Usage (root, iproute2)::

    ./dev.sh bench bench/hosts.py                    # all (~27 min on a quiet 2-core machine)
    python bench/hosts.py --only store-cost --no-write
    python bench/hosts.py --only worker              # the cells whose names contain this
    python bench/hosts.py --only kafka --merge       # the Kafka cells, into the last recorded run

Writes ``bench/results/hosts.json`` and the tables of the "Separate hosts" section of
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `tests` importable
    sys.path.append(str(ROOT))

from tests.hosts.cluster import (  # noqa: E402
    Cluster,
    commits,
    documents,
    download,
    listening,
    on_store,
    paced,
    store_client,
    store_requests,
    wait_for,
    wait_mid_epoch,
)
from tests.hosts.netns import Host, available  # noqa: E402
from tests.runtime.e2e.adaptive_net import network  # noqa: E402
from tests.runtime.e2e.helpers import read  # noqa: E402

JSON_OUT = ROOT / "bench" / "results" / "hosts.json"
RESULTS = ROOT / "bench" / "RESULTS.md"
TABLES = {"faults": ("<!-- hosts-faults:start -->", "<!-- hosts-faults:end -->"),
          "store": ("<!-- hosts-store:start -->", "<!-- hosts-store:end -->")}
OUTPUTS = ("windows", "firsts", "pairs")
LEASE_S = 4
PARTITION_S = 15  # past the executor timeout (10 s, eddyline.runtime.session.CLUSTER_CONF)
KAFKA_PORT = 9092
KAFKA_WAIT = "60s"  # how long the sources and sinks retry a broker that does not answer
BROKER_PARTITION_S = 20  # past the clients' 5 s request timeout (eddyline.io.kafka.client.REQUEST_S)
BROKER_DOWN_S = 5
CRASH_EPOCH = 5


@dataclass
class Run:
    """One cell's drivers and what the fault noted."""

    cluster: Cluster
    bucket: str
    leader: Any
    standby: Any | None
    fault_at: float = 0.0
    ended_at: float | None = None  # when a fault that lasts ended
    detected_at: float | None = None
    recovered_at: float | None = None  # when the fault's own measure of recovery says (a takeover)
    notes: list[str] = field(default_factory=list)


def lost_executor_at(cluster: Cluster, after: float) -> float | None:
    """When the leader's log says it gave an executor up (its lines carry HH:MM:SS)."""
    log = (cluster.hosts["leader"].tmp / "driver.log").read_text()
    day = datetime.fromtimestamp(after).strftime("%Y-%m-%d")
    for m in re.finditer(r"^(\d\d:\d\d:\d\d) ERROR TaskSchedulerImpl: Lost executor", log, re.M):
        t = datetime.strptime(f"{day} {m.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp()
        if t + 1 >= after:
            return t
    return None


# ---------------------------------------------------------------------------------- the faults
def worker_lost(off_network: bool) -> Callable[[Run], None]:
    def fault(run: Run) -> None:
        w1 = run.cluster.workers[0]
        wait_mid_epoch(run.cluster, run.bucket)  # an epoch's tasks about to run or running
        run.fault_at = time.time()
        if off_network:  # first, so that no process of it says goodbye
            w1.down()
        w1.kill()
        try:
            wait_for("the leader gives the executor up", lambda: lost_executor_at(run.cluster, run.fault_at), 60)
            run.detected_at = lost_executor_at(run.cluster, run.fault_at)
        finally:
            w1.up()
            run.cluster.start_worker(w1)  # the machine is replaced
    return fault


def worker_partitioned(run: Run) -> None:
    w1 = run.cluster.workers[0]
    wait_mid_epoch(run.cluster, run.bucket)
    run.fault_at = time.time()
    w1.down()
    time.sleep(PARTITION_S)
    w1.up()
    run.ended_at = time.time()
    run.detected_at = lost_executor_at(run.cluster, run.fault_at)


def leader_cut(whole_host: bool) -> Callable[[Run], None]:
    def fault(run: Run) -> None:
        leader = run.cluster.hosts["leader"]
        run.fault_at = time.time()
        leader.down() if whole_host else run.cluster.store.drop_from(leader)
        try:
            run.leader.wait(60)
            run.detected_at = time.time()
            wait_for("the standby's first commit", lambda: generation_2(run), 120)
            run.recovered_at = min(c["committed_at"] for c in commits(run.cluster, run.bucket).values()
                                   if c["generation"] == 2)
        finally:
            leader.up() if whole_host else run.cluster.store.answer(leader)
        run.ended_at = time.time()
        run.notes.append(f"leader exit {run.leader.returncode}")
        taken = taken_at(run, 2)
        if taken is not None:  # where the takeover's time goes: the lease, then the first epoch
            run.notes.append(f"lease taken at {taken - run.fault_at:.1f} s")
            run.notes.append(first_epoch(run))
    return fault


def first_epoch(run: Run) -> str:
    """The standby's first epoch: how long it took, how much of it Spark's execution (its
    progress record), and how long after it took the lease it began."""
    done = commits(run.cluster, run.bucket)
    epoch = min(e for e, c in done.items() if c["generation"] == 2)
    record = documents(run.cluster, run.bucket, "progress").get(epoch)
    if record is None:
        return f"first epoch {epoch}: no progress record"
    ms = record["durationMs"]
    began = done[epoch]["committed_at"] - ms["triggerExecution"] / 1000 - (taken_at(run, 2) or 0)
    return (f"first epoch {ms['triggerExecution'] / 1000:.1f} s (execution {ms['execution'] / 1000:.1f}), "
            f"began {began:.1f} s after the lease")


def taken_at(run: Run, generation: int) -> float | None:
    """When a standby took lease generation ``generation`` (its file on the store says)."""
    got = store_client(run.cluster, run.bucket).get(f"ckpt/lease/{generation:010d}.json")
    return float(json.loads(got[0])["acquired_at"]) if got is not None else None


def generation_2(run: Run) -> bool:
    return any(c["generation"] == 2 for c in commits(run.cluster, run.bucket).values())


def standby_partitioned(run: Run) -> None:
    standby = run.cluster.hosts["standby"]
    run.fault_at = time.time()
    standby.down()
    time.sleep(PARTITION_S)
    standby.up()
    run.ended_at = time.time()
    run.notes.append("the leader went on" if run.leader.poll() is None or run.leader.returncode == 0 else "")


def store_slow(delay_ms: float, loss: float, seconds: float = 15) -> Callable[[Run], None]:
    def fault(run: Run) -> None:
        run.fault_at = time.time()
        run.cluster.slow_store(delay_ms, loss)
        time.sleep(seconds)
        run.cluster.slow_store()
        run.ended_at = time.time()
    return fault


def store_down(seconds: float) -> Callable[[Run], None]:
    def fault(run: Run) -> None:
        run.fault_at = time.time()
        run.cluster.slow_store(down=True)
        try:
            run.leader.wait(seconds)
            run.detected_at = time.time()
            time.sleep(max(0.0, run.fault_at + seconds - time.time()))
        except Exception:  # noqa: BLE001 (the leader did not stop within the outage)
            run.notes.append("the leader did not stop during the outage")
        finally:
            run.cluster.slow_store()
        run.ended_at = time.time()
        run.notes.append(f"leader exit {run.leader.returncode}")
    return fault


#: name → (the fault, a standby runs, the driver whose run must end well)
CELLS: dict[str, tuple[Callable[[Run], None], bool, str]] = {
    "worker host lost (off the network, then killed)": (worker_lost(True), False, "leader"),
    "worker host's processes killed": (worker_lost(False), False, "leader"),
    f"worker host partitioned {PARTITION_S} s, healed": (worker_partitioned, False, "leader"),
    "leader cut off from the store": (leader_cut(False), True, "standby"),
    "leader host off the network": (leader_cut(True), True, "standby"),
    f"standby partitioned {PARTITION_S} s": (standby_partitioned, True, "leader"),
    "store slow: +100 ms, 2 % loss, 15 s": (store_slow(100, 0.02), False, "leader"),
    "store slow: +200 ms, 5 % loss, 15 s": (store_slow(200, 0.05), False, "leader"),
    f"store down {2 * LEASE_S} s (twice the lease)": (store_down(2 * LEASE_S), True, "standby"),
}


def diff(got: Path, reference: Path) -> tuple[int, int, bool]:
    """Rows lost and duplicated over every sink, and whether every sink is identical."""
    lost = dup = 0
    same = True
    for what in OUTPUTS:
        g, r = Counter(read(got, what)), Counter(read(reference, what))
        lost += sum((r - g).values())
        dup += sum((g - r).values())
        same = same and g == r
    return lost, dup, same


def run_cell(cluster: Cluster, name: str, reference: Path, base: Path) -> dict[str, Any]:
    fault, with_standby, finisher = CELLS[name]
    bucket = f"cell-{uuid.uuid4().hex[:8]}"
    cluster.bucket(bucket)
    spec, ckpt = paced(Path("out"), bucket, per_epoch=250), f"s3://{bucket}/ckpt"
    args = ("--until-idle", "--lease-timeout", str(LEASE_S))
    leader = cluster.driver(cluster.driver_host("leader"), spec, ckpt, *args)
    standby = None
    if with_standby:  # once the leader leads (a standby finding no lease would take it)
        wait_for("the leader leads", lambda: "leading as" in (cluster.hosts["leader"].tmp / "driver.log").read_text())
        standby = cluster.driver(cluster.driver_host("standby"), spec, ckpt, *args, "--standby")
    run = Run(cluster, bucket, leader, standby)
    t0 = time.time()
    try:
        if standby is not None:
            wait_for("the standby waits",
                     lambda: "waiting for its lease" in (cluster.hosts["standby"].tmp / "driver.log").read_text())
        wait_for("3 epochs", lambda: len(commits(cluster, bucket)) >= 3)
        fault(run)
        done = standby if finisher == "standby" else leader
        rc = done.wait(900)
    finally:
        for p in (leader, standby):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    log = (cluster.hosts[finisher].tmp / "driver.log").read_text()
    if rc != 0:
        return {"cell": name, "error": log[-1500:]}
    all_commits = sorted(commits(cluster, bucket).values(), key=lambda c: c["committed_at"])
    since = run.ended_at or run.fault_at
    after = [c["committed_at"] for c in all_commits if c["committed_at"] > since]
    at = [c["committed_at"] for c in all_commits]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    during = [b - a for a, b in zip(at, at[1:], strict=False) if b > run.fault_at and a < since + 1]
    lost, dup, same = diff(download(cluster, f"s3://{bucket}/out", base / bucket), reference)
    return {
        "cell": name, "lost": lost, "duplicated": dup, "identical": same, "epochs": len(all_commits),
        "detected_s": round(max(0.0, run.detected_at - run.fault_at), 1) if run.detected_at else None,
        "recovered_s": round((run.recovered_at or after[0]) - run.fault_at, 1) if after else None,
        "slowest_epoch_s": round(max(during or gaps), 1), "median_epoch_s": round(statistics.median(gaps), 2),
        "generations": sorted({c["generation"] for c in all_commits}), "seconds": round(time.time() - t0, 1),
        "notes": "; ".join(n for n in run.notes if n),
    }


# ------------------------------------------------------------------------------------- Kafka
class KafkaRig:
    """A Tansu broker on the host ``kafka``, its log in the bucket ``tansu-log`` on the store host;
    the adaptive network's inputs in the topics ``adaptive.<source>``; the reference's outputs."""

    def __init__(self, cluster: Cluster):
        from eddyline.io.local import tansu_binary

        self.cluster, self.binary = cluster, tansu_binary()
        cluster.bucket("tansu-log")
        self.host: Host = cluster.driver_host("kafka")
        self.bootstrap = f"{self.host.ip}:{KAFKA_PORT}"
        self.start()
        self.schemas: dict[str, str] = {}
        self.reference: dict[str, Counter] = {}

    def start(self) -> None:
        url = f"tcp://{self.host.ip}:{KAFKA_PORT}"
        env = {**self.cluster.env, "AWS_ENDPOINT": self.cluster.env["AWS_ENDPOINT_URL"], "AWS_ALLOW_HTTP": "true",
               "AWS_DEFAULT_REGION": "us-east-1"}
        self.host.start([self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                         "--storage-engine", "s3://tansu-log/"], "tansu.log", env=env)
        wait_for("the broker", lambda: listening(self.host.ip, KAFKA_PORT), 30)

    def produce_inputs(self) -> None:
        """The adaptive network's sources' rows (offsets 0 to their limit) into a topic each."""
        from eddyline.api.sources import SourceSpec
        from eddyline.io.produce import Feed, produce_kafka
        from eddyline.io.sources import make_source
        from eddyline.runtime.session import get_spark

        spark = get_spark("local[2]")
        for source in network(Path("out"))["sources"]:
            kind = "generator" if "generator" in source else "nexmark"
            spec = SourceSpec.model_validate({"name": source["name"], kind: source[kind]})
            fields = make_source(spec).frames(spark, {"start": 0, "end": 1}, 1).data.schema.fields
            self.schemas[source["name"]] = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in fields)
            produce_kafka(spark, self.bootstrap, [Feed(spec, f"adaptive.{source['name']}")], end=source["limit"])

    def network(self, prefix: str, per_epoch: int = 250, trigger_ms: int = 1000) -> dict:
        """The adaptive network (3 key groups moved every epoch) from the input topics into the
        topics ``<prefix>.<output>``."""
        spec = network(Path("out"), {"chaos": {"random_moves": 3, "seed": 11}})
        spec["trigger"] = trigger_ms
        spec["sources"] = [
            {"name": s["name"], "max_rows_per_epoch": per_epoch,
             "kafka": {"brokers": self.bootstrap, "topics": [f"adaptive.{s['name']}"], "schema": self.schemas[s["name"]],
                       "wait": KAFKA_WAIT}}
            for s in spec["sources"]
        ]
        for sink in spec["sinks"]:
            what = Path(sink.pop("files")["path"]).name
            sink["kafka"] = {"brokers": self.bootstrap, "topic": f"{prefix}.{what}", "wait": KAFKA_WAIT}
        return spec

    def outputs(self, prefix: str) -> tuple[dict[str, Counter], int]:
        """Each output topic's rows (``read_committed``, less aborted attempts), and how many
        records of aborted attempts were dropped."""
        from bench.faults.harness import read_topic

        got, dropped = {}, 0
        for what in OUTPUTS:
            rows, n = read_topic(self.bootstrap, f"{prefix}.{what}")
            got[what] = Counter(json.dumps(r, sort_keys=True) for r in rows)
            dropped += n
        return got, dropped

    def run_reference(self, base: Path) -> None:
        from eddyline.api.validate import load_spec
        from eddyline.runtime.engine import Engine
        from eddyline.runtime.session import get_spark

        prefix = f"ref-{uuid.uuid4().hex[:8]}"
        spec = self.network(prefix, trigger_ms=0)
        Engine(load_spec(spec), get_spark("local[2]"), str(base / "kafka-ref-ckpt")).run(until_idle=True)
        self.reference, dropped = self.outputs(prefix)
        if dropped or not all(self.reference.values()):
            raise SystemExit(f"the Kafka reference run: {dropped} aborted records, rows "
                             f"{ {k: sum(v.values()) for k, v in self.reference.items()} }")
        print(f"  Kafka reference: { {k: sum(v.values()) for k, v in self.reference.items()} } rows", flush=True)


@dataclass
class KafkaRun(Run):
    rig: KafkaRig | None = None
    again: Any = None  # the driver started after the first one died


def broker_partitioned(run: KafkaRun) -> None:
    assert run.rig is not None
    wait_mid_epoch(run.cluster, run.bucket)
    run.fault_at = time.time()
    run.rig.host.down()
    time.sleep(BROKER_PARTITION_S)
    run.rig.host.up()
    run.ended_at = time.time()


def broker_killed(run: KafkaRun) -> None:
    assert run.rig is not None
    wait_mid_epoch(run.cluster, run.bucket)
    run.fault_at = time.time()
    run.rig.host.kill()
    time.sleep(BROKER_DOWN_S)
    run.rig.start()
    run.ended_at = time.time()


def driver_killed_mid_transaction(run: KafkaRun) -> None:
    """The leader runs with ``--crash-at CRASH_EPOCH:mid_publish``: it SIGKILLs itself inside a
    Kafka sink's transaction, half of the epoch's records sent; then it is run again."""
    host = run.cluster.hosts["leader"]
    wait_for("the driver's crash", lambda: run.leader.poll() is not None, 300, every=0.05)
    run.fault_at = time.time()
    run.notes.append(f"first driver exit {run.leader.returncode} (in epoch {CRASH_EPOCH}'s Kafka transaction)")
    (host.tmp / "driver.log").rename(host.tmp / "driver-killed.log")
    spec = run.rig.network(run.bucket) if run.rig is not None else {}
    run.again = run.cluster.driver(host, spec, f"s3://{run.bucket}/ckpt", "--until-idle", "--lease-timeout",
                                   str(LEASE_S))
    run.ended_at = run.fault_at


#: name → (the fault, extra arguments of the first driver)
KAFKA_CELLS: dict[str, tuple[Callable[[KafkaRun], None], tuple[str, ...]]] = {
    f"Kafka: broker's host off the network {BROKER_PARTITION_S} s, healed": (broker_partitioned, ()),
    f"Kafka: broker's host killed, the broker started again {BROKER_DOWN_S} s later": (broker_killed, ()),
    "Kafka: driver SIGKILLed mid-transaction, run again": (
        driver_killed_mid_transaction, ("--crash-at", f"{CRASH_EPOCH}:mid_publish")),
}


def run_kafka_cell(cluster: Cluster, rig: KafkaRig, name: str) -> dict[str, Any]:
    fault, extra = KAFKA_CELLS[name]
    bucket = f"kcell-{uuid.uuid4().hex[:8]}"
    cluster.bucket(bucket)
    host = cluster.driver_host("leader")
    leader = cluster.driver(host, rig.network(bucket), f"s3://{bucket}/ckpt", "--until-idle", "--lease-timeout",
                            str(LEASE_S), *extra)
    run = KafkaRun(cluster, bucket, leader, None, rig=rig)
    t0 = time.time()
    try:
        wait_for("3 epochs", lambda: len(commits(cluster, bucket)) >= 3)
        fault(run)
        rc = (run.again or leader).wait(900)
    finally:
        for p in (leader, run.again):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    log = (host.tmp / "driver.log").read_text()
    for kept in ("driver.log", "driver-killed.log", "progress.jsonl"):  # the next cell's driver starts afresh
        if (host.tmp / kept).exists():
            (host.tmp / kept).rename(host.tmp / f"{bucket}-{kept}")
    if rc != 0:
        return {"cell": name, "error": log[-1500:]}
    all_commits = sorted(commits(cluster, bucket).values(), key=lambda c: c["committed_at"])
    since = run.ended_at or run.fault_at
    after = [c["committed_at"] for c in all_commits if c["committed_at"] > since]
    if after and run.ended_at is not None and run.ended_at > run.fault_at:
        run.notes.insert(0, f"first commit {after[0] - run.ended_at:.1f} s after the fault ended")
    at = [c["committed_at"] for c in all_commits]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    during = [b - a for a, b in zip(at, at[1:], strict=False) if b > run.fault_at and a < since + 1]
    got, dropped = rig.outputs(bucket)
    lost = sum(sum((rig.reference[w] - got[w]).values()) for w in OUTPUTS)
    dup = sum(sum((got[w] - rig.reference[w]).values()) for w in OUTPUTS)
    run.notes.append(f"{sum(sum(c.values()) for c in got.values())} rows read back; {dropped} records of aborted "
                     "transactions dropped by the reader (Tansu hands them out)")
    return {
        "cell": name, "lost": lost, "duplicated": dup, "identical": all(got[w] == rig.reference[w] for w in OUTPUTS),
        "epochs": len(all_commits), "detected_s": None,
        "recovered_s": round(after[0] - run.fault_at, 1) if after else None,
        "slowest_epoch_s": round(max(during or gaps), 1), "median_epoch_s": round(statistics.median(gaps), 2),
        "generations": sorted({c["generation"] for c in all_commits}), "seconds": round(time.time() - t0, 1),
        "notes": "; ".join(n for n in run.notes if n),
    }


# -------------------------------------------------------------------------------- store cost
def store_cost(cluster: Cluster, base: Path, delays: tuple[int, ...] = (0, 20, 100)) -> list[dict[str, Any]]:
    host = cluster.driver_host("leader")
    rows = []
    for delay in (None, *delays):
        spec = network(Path("/tmp/out"))  # unpaced, 750 rows a source an epoch
        if delay is None:
            shutil.rmtree(host.tmp / "out", ignore_errors=True)
            shutil.rmtree(host.tmp / "ckpt", ignore_errors=True)
            ckpt = "/tmp/ckpt"
        else:
            bucket = f"cost-{uuid.uuid4().hex[:8]}"
            cluster.bucket(bucket)
            spec, ckpt = on_store(spec, bucket), f"s3://{bucket}/ckpt"
            cluster.slow_store(delay)
        before = store_requests(cluster)
        t0 = time.time()
        # a lease and a request timeout for a store far away (docs/cluster.md): with the cells'
        # 4 s and 1 s a store 100 ms away fenced the leader under the load of 290 requests an epoch
        p = cluster.driver(host, spec, ckpt, "--until-idle", "--lease-timeout", "40", master="local[2]",
                           env={"EDDYLINE_STORE_TIMEOUT": "5"})
        rc = p.wait(900)
        wall = time.time() - t0
        cluster.slow_store()
        time.sleep(0.3)
        if rc != 0:
            rows.append({"checkpoint": "local" if delay is None else f"store +{delay} ms",
                         "error": (host.tmp / "driver.log").read_text()[-1500:]})
            continue
        progress = [json.loads(line) for line in (host.tmp / "progress.jsonl").read_text().splitlines() if line]
        epochs = [r for r in progress if "batchId" in r and "durationMs" in r]
        spent = Counter(store_requests(cluster)) - Counter(before)
        n = max(len(epochs), 1)
        rows.append({
            "checkpoint": "local" if delay is None else f"store +{delay} ms", "epochs": len(epochs),
            "epoch_ms_median": (round(statistics.median(r["durationMs"]["triggerExecution"] for r in epochs))
                                if epochs else None),
            "wall_s": round(wall, 1),
            "requests_per_epoch": {k: round(v / n, 1) for k, v in sorted(spent.items())},
            "requests_per_epoch_total": round(sum(spent.values()) / n, 1),
            # what Eddyline's own progress records say it asked (storeRequests)
            "reported_per_epoch": round(sum(sum((r.get("storeRequests") or {}).get("total", {}).values())
                                            for r in epochs) / n, 1),
        })
        (host.tmp / "progress.jsonl").unlink(missing_ok=True)
    return rows


# ----------------------------------------------------------------------------------- results
def fault_table(cells: list[dict[str, Any]]) -> str:
    head = ("| fault | lost | duplicated | identical | detected (s) | recovered (s) | slowest epoch (s) | "
            "generations | notes |\n|---|---:|---:|---|---:|---:|---:|---|---|\n")
    rows = []
    for c in cells:
        if "error" in c:
            rows.append(f"| {c['cell']} | | | **failed** | | | | | {c['error'].splitlines()[-1][:120]} |")
            continue
        rows.append(f"| {c['cell']} | {c['lost']} | {c['duplicated']} | {'yes' if c['identical'] else '**no**'} | "
                    f"{max(0.0, c['detected_s']) if c['detected_s'] is not None else '–'} | "
                    f"{c['recovered_s'] if c['recovered_s'] is not None else '–'} | {c['slowest_epoch_s']} | "
                    f"{', '.join(map(str, c['generations']))} | {c['notes']} |")
    return head + "\n".join(rows)


def store_table(rows: list[dict[str, Any]]) -> str:
    head = ("| checkpoint | epoch median (ms) | run (s) | requests / epoch (store) | (progress record) | of which |\n"
            "|---|---:|---:|---:|---:|---|\n")
    out = []
    for r in rows:
        if "error" in r:
            out.append(f"| {r['checkpoint']} | **failed** | | | | {r['error'].splitlines()[-1][:120]} |")
            continue
        kinds = ", ".join(f"{k} {v}" for k, v in r["requests_per_epoch"].items()) or "–"
        local = r["checkpoint"] == "local"
        out.append(f"| {r['checkpoint']} | {r['epoch_ms_median']} | {r['wall_s']} | "
                   f"{'–' if local else r['requests_per_epoch_total']} | {'–' if local else r['reported_per_epoch']} | "
                   f"{kinds} |")
    return head + "\n".join(out)


def merged(record: dict[str, Any]) -> dict[str, Any]:
    """The last recorded run with this run's cells (and store cost) in place of its own."""
    last = json.loads(JSON_OUT.read_text())[-1] if JSON_OUT.exists() else {"faults": [], "store_cost": []}
    ran = {c["cell"]: c for c in record["faults"]}
    faults = [ran.pop(c["cell"], c) for c in last["faults"]] + list(ran.values())
    return {"when": record["when"], "merged_into": last.get("when"), "faults": faults,
            "store_cost": record["store_cost"] or last["store_cost"]}


def write_results(record: dict[str, Any]) -> None:
    history = json.loads(JSON_OUT.read_text()) if JSON_OUT.exists() else []
    history.append(record)
    JSON_OUT.write_text(json.dumps(history, indent=1) + "\n")
    write_tables(record)


def write_tables(record: dict[str, Any]) -> None:
    text = RESULTS.read_text()
    for key, table in (("faults", fault_table(record["faults"])), ("store", store_table(record["store_cost"]))):
        if not record.get({"faults": "faults", "store": "store_cost"}[key]):
            continue
        start, end = TABLES[key]
        i, j = text.index(start) + len(start), text.index(end)
        text = text[:i] + "\n" + table + "\n" + text[j:]
    RESULTS.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated: cells whose names contain these, or 'store-cost'")
    ap.add_argument("--keep", help="keep the hosts' folders here")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render", action="store_true", help="only rewrite the tables from the last recorded run")
    ap.add_argument("--merge", action="store_true",
                    help="put the cells run (and the store cost, if run) in place of the last recorded run's")
    a = ap.parse_args()
    if a.render:
        last = json.loads(JSON_OUT.read_text())[-1]
        write_tables(last)
        return
    why = available()
    if why is not None:
        raise SystemExit(why)
    # stopped from outside: still take the hosts down (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    wanted = [w.strip().lower() for w in a.only.split(",")] if a.only else None
    cells = [n for n in CELLS if wanted is None or any(w in n.lower() for w in wanted)]
    kafka_cells = [n for n in KAFKA_CELLS if wanted is None or any(w in n.lower() for w in wanted)]
    base = Path(a.keep or tempfile.mkdtemp(prefix="eddyline-hosts-"))
    from eddyline.api.validate import load_spec
    from eddyline.runtime.engine import Engine
    from eddyline.runtime.session import get_spark

    reference = base / "reference"
    if cells:
        Engine(load_spec(network(reference)), get_spark("local[2]"), str(base / "ref-ckpt")).run(until_idle=True)
    cluster = Cluster(base / "hosts")
    record: dict[str, Any] = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "faults": [], "store_cost": []}
    try:
        for name in cells:
            print(f"· {name}", flush=True)
            result = run_cell(cluster, name, reference, base)
            print(f"  {json.dumps(result)[:600]}", flush=True)
            record["faults"].append(result)
        if kafka_cells:
            rig = KafkaRig(cluster)
            rig.produce_inputs()
            rig.run_reference(base)
            for name in kafka_cells:
                print(f"· {name}", flush=True)
                result = run_kafka_cell(cluster, rig, name)
                print(f"  {json.dumps(result)[:600]}", flush=True)
                record["faults"].append(result)
        if wanted is None or "store-cost" in wanted:
            record["store_cost"] = store_cost(cluster, base)
            print(store_table(record["store_cost"]), flush=True)
    finally:
        cluster.close()
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    if record["faults"]:
        print(fault_table(record["faults"]))
    if not a.no_write:
        write_results(merged(record) if a.merge else record)


if __name__ == "__main__":
    main()
