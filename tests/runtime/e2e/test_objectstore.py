"""A checkpoint on an object store (a real S3-compatible server, moto's server mode): plans,
commits, state and the lease live only there. A standby takes the lease over from a frozen leader
and replays the epoch it left on the store, and the store refuses the woken leader's commit; files
sinks and sources on the store hold and read what local ones do. (A standby taking over from a
leader whose host is lost is in ``tests/hosts``.)"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

from eddyline import objectfs, objectstore

from .drivers import err as stderr
from .drivers import finish, frozen, start, wait_for
from .helpers import read_windows

pytestmark = pytest.mark.slow


def commits(ckpt: str) -> dict[int, dict]:
    """The checkpoint's commits by epoch, read from the store."""
    store, key = objectstore.at(ckpt)
    out = {}
    for name in store.list(f"{key}/commits"):
        got = store.get(name)
        if got is not None and name.endswith(".json"):
            out[int(name.rsplit("/", 1)[1][:-5])] = json.loads(got[0])
    return out


#: a holder on an object store stops when it has not renewed for three quarters of its lease; on a
#: loaded 2-core machine 1.5 s (drivers.LEASE) leaves too little for a heartbeat held up a second
STORE_LEASE = ("--lease-timeout", "4")


def test_a_leader_frozen_in_its_commit_has_it_refused_by_the_store(s3, windowed_bids, tmp_path: Path) -> None:
    """``--freeze-at 3:mid_commit``: past every lease check, about to commit epoch 3 on the store
    (its outputs published). A standby takes the lease over, replays epoch 3 from the plan the
    leader left on the store and commits on; then the old leader wakes into its commit, which the
    store refuses: it stops naming the newer generation, no commit of the older generation follows
    the takeover, and the output is the uninterrupted run's. Nothing of the checkpoint is on the
    local disk."""
    spec, expected = windowed_bids
    ckpt = f"{s3.bucket(f'ck-{uuid.uuid4().hex[:8]}')}/net"
    leader = start(spec, ckpt, *STORE_LEASE, "--freeze-at", "3:mid_commit")
    wait_for(lambda: leader.poll() is None and frozen(leader), 180, "the leader to freeze in its commit")
    standby = start(spec, ckpt, "--standby", *STORE_LEASE)
    wait_for(lambda: max((e for e, c in commits(ckpt).items() if c["generation"] == 2), default=0) >= 4
             or standby.poll() is not None, 300, "the standby's commit of epoch 4")
    leader.send_signal(signal.SIGCONT)
    code, err = finish(leader)
    assert code != 0 and "refuses its writes" in err, err[-3000:]
    assert "generation 1 was taken over by generation 2" in err
    said, _ = standby.communicate(timeout=300)
    assert standby.returncode == 0, stderr(standby)[-3000:]
    assert ", 1 replayed)" in said, said[-1000:]  # the epoch the leader froze in
    assert read_windows(tmp_path / "out") == expected
    done = commits(ckpt)
    assert sorted(done) == list(range(1, max(done) + 1))
    assert [e for e, c in done.items() if c["generation"] == 1] == [1, 2]
    local = [p for p in (*tmp_path.rglob("commits"), *tmp_path.rglob("plans")) if "ref-ckpt" not in p.parts]
    assert not local  # nothing of the checkpoint on the local disk (but the reference run's)


# 96 epochs half a second apart: the leader still runs when the follower has started its JVM,
# copied the leader's state and caught up, also on a loaded machine (48 were too few there)
@pytest.mark.parametrize("windowed_bids", [96], indirect=True)
def test_a_hot_pair_on_the_store_copies_the_leaders_state_follows_and_leads_on(s3, windowed_bids, tmp_path: Path) -> None:
    """A hot pair whose group and both checkpoints are on the store: the follower, started once the
    leader is well ahead, copies the leader's commit and state there (the store copies), follows,
    finds every output published with the same digest, and leads on when the leader gets SIGKILL:
    each window once, the selector's records on the store, nothing of either driver on the disk."""
    spec, expected = windowed_bids
    bucket = s3.bucket(f"hot-{uuid.uuid4().hex[:8]}")
    group, a, b = f"{bucket}/group", f"{bucket}/a", f"{bucket}/b"
    leader = start(spec, a, *STORE_LEASE, "--hot", group)
    wait_for(lambda: len(commits(a)) >= 5 or leader.poll() is not None, 180, "the leader's fifth commit")
    follower = start(spec, b, *STORE_LEASE, "--hot", group, "--progress-json", str(tmp_path / "b.jsonl"))
    progress = tmp_path / "b.jsonl"

    def following() -> list[dict]:
        lines = progress.read_text().splitlines() if progress.exists() else []
        return [r for r in map(json.loads, lines) if r["driver"].get("state") == "following"]

    wait_for(lambda: len(following()) >= 1 or follower.poll() is not None, 240, "the follower to follow")
    assert leader.poll() is None, "the leader ended before the follower caught up"
    leader.send_signal(signal.SIGKILL)
    assert leader.wait(timeout=60) == -signal.SIGKILL
    code, err = finish(follower)
    assert code == 0, err[-3000:]
    assert read_windows(tmp_path / "out") == expected  # nothing lost, nothing twice

    records = [json.loads(x) for x in progress.read_text().splitlines()]
    first = records[0]
    assert first["driver"]["copied_state"] == {"checkpoint": a, "epoch": first["batchId"] - 1}
    assert first["batchId"] > 5  # it ran none of the plans before the copy
    roles = [r["driver"]["role"] for r in records]
    assert roles[-1] == "leader" and roles == sorted(roles, key=["follower", "leader"].index)
    # the windows open across the copied epoch came out right: the copied state was read
    store, _ = objectstore.at(bucket)
    # one record per sink and epoch the follower ran as a follower, by whichever driver published it
    holders = {json.loads(store.get(k)[0])["by"] for k in store.list("group/selector/") if k.endswith(".json")}
    # (the leader's early records may be forgotten by the time b leads: records of old epochs go)
    assert holders, "no selector records on the store"
    assert not any(p.name in ("a", "b", "group") for p in tmp_path.iterdir())


def test_files_sinks_on_the_store_hold_what_local_ones_do(s3, spark, tmp_path: Path) -> None:
    """The adaptive network (a window, a dedup, a join; moves, a rescale, a split) with its
    checkpoint and its three files sinks on the store writes what it writes locally. Spark has no
    S3 connector here, so its tasks write the epochs with pyarrow; before they did, Spark took
    ``bucket/key`` for a relative local path and epochs written by Spark went there, silently."""
    import pyarrow.fs as pafs

    from eddyline.api.validate import load_spec
    from eddyline.observe.progress import ProgressReporter
    from eddyline.runtime.engine import Engine

    from .adaptive_net import CHURN, network
    from .helpers import read

    bucket = s3.bucket(f"sinks-{uuid.uuid4().hex[:8]}").removeprefix("s3://")
    spec = network(tmp_path / "local", CHURN)
    Engine(load_spec(spec), spark, str(tmp_path / "ckpt")).run(until_idle=True)
    for sink in spec["sinks"]:
        sink["files"]["path"] = f"s3://{bucket}/out/{Path(sink['files']['path']).name}"
    reporter = ProgressReporter(live=False)
    records: list[dict] = []
    reporter.listeners.append(records.append)
    before = objectstore.REQUESTS.copy()
    Engine(load_spec(spec), spark, f"s3://{bucket}/ckpt", reporter=reporter).run(until_idle=True)
    check_store_requests(records, objectstore.requests_since(before))
    pafs.copy_files(f"{bucket}/out", str(tmp_path / "store"), source_filesystem=objectfs.filesystem(),
                    destination_filesystem=pafs.LocalFileSystem())
    for what in ("windows", "firsts", "pairs"):
        want = read(tmp_path / "local", what)
        assert len(want) > 100, what
        assert read(tmp_path / "store", what) == want, what
    assert not list(Path.cwd().glob(f"{bucket}*"))  # nothing written to a local path named like the bucket


def check_store_requests(records: list[dict], by_driver: dict[str, int]) -> None:
    """Every epoch's progress record says what it asked of the store, the driver's and the lanes'
    requests apart: each lane of each stateful step PUTs its manifest and its state, the driver
    PUTs its plan and its commit; over the run the driver's add up to what this process (which
    ran the driver; its Spark workers ran the lanes) counted itself. And ``/metrics`` has them."""
    from eddyline.observe.metrics import Metrics

    assert records
    for r in records:
        made = r["storeRequests"]
        lanes = sum(len(step["keyGroupsPerLane"]) for step in r["routing"].values())
        assert made["lanes"]["PUT"] >= lanes, (r["batchId"], made, lanes)  # a manifest each (state: if any)
        assert made["driver"]["PUT"] >= 2, (r["batchId"], made)  # the plan, the commit
        assert made["total"] == {k: made["driver"].get(k, 0) + made["lanes"].get(k, 0)
                                 for k in set(made["driver"]) | set(made["lanes"])}
    counted = sum(sum(r["storeRequests"]["driver"].values()) for r in records)
    assert 0.8 * sum(by_driver.values()) <= counted <= sum(by_driver.values()), (counted, by_driver)
    metrics = Metrics()
    for r in records:
        metrics.observe(r)
    text = metrics.exposition().decode()
    puts = sum(r["storeRequests"]["lanes"]["PUT"] for r in records)
    assert f'eddyline_store_requests_total{{by="lanes",kind="PUT"}} {float(puts)}' in text


@pytest.mark.parametrize("kind", ["json", "json-decimal", "parquet"])
def test_a_files_source_on_the_store_reads_what_a_local_one_does(s3, spark, tmp_path: Path, kind: str) -> None:
    """A files source whose directory is on the store: flat JSON lines (Arrow's readers in the
    tasks), JSON with a type those do not take (the tasks hand the lines to Spark's parser) and
    Parquet (pyarrow in the tasks), each with its dead letters, gives the windows and the dead
    letters the same directory gives on the local disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eddyline.api.validate import load_spec
    from eddyline.runtime.engine import Engine

    from .helpers import bids_window_spec, write_bid_files

    local = tmp_path / "in"
    bad = write_bid_files(local, files=4, rows=150, seed=9, bad_every=0 if kind == "parquet" else 50)
    if kind == "parquet":
        for f in sorted(local.glob("*.json")):
            rows = [json.loads(line) for line in f.read_text().splitlines()]
            table = pa.table({"auction": pa.array([r["auction"] for r in rows], pa.int64()),
                              "price": pa.array([r["price"] for r in rows], pa.int64()),
                              "ts": pa.array([r["ts"].replace("Z", "") for r in rows]).cast(pa.timestamp("us"))
                              .cast(pa.timestamp("us", tz="UTC"))})
            pq.write_table(table, f.with_suffix(".parquet"))
            f.unlink()
    store_dir = f"{s3.bucket(f'in-{uuid.uuid4().hex[:8]}')}/bids"
    fs = objectfs.filesystem()
    for f in sorted(local.iterdir()):
        with fs.open_output_stream(f"{store_dir.removeprefix('s3://')}/{f.name}") as out:
            out.write(f.read_bytes())

    def run(where: str, out: str) -> int:
        raw = bids_window_spec(local, tmp_path / out).model_dump(mode="json", by_alias=True, exclude_none=True)
        source = raw["sources"][0]["files"]
        source["path"] = where
        if kind == "parquet":
            source["format"] = "parquet"
            del source["schema"]
        elif kind == "json-decimal":
            source["schema"] = "auction long, price decimal(10,0), ts timestamp"
        return Engine(load_spec(raw), spark, str(tmp_path / f"ckpt-{out}")).run(until_idle=True).dead_letters

    assert run(str(local), "local") == bad
    assert run(store_dir, "store") == bad
    windows = read_windows(tmp_path / "local")
    assert len(windows) > 20
    assert read_windows(tmp_path / "store") == windows


def test_a_lease_is_renewed_while_the_driver_opens_the_checkpoint(s3, spark, tmp_path: Path, monkeypatch) -> None:
    """Opening a checkpoint on a store (fencing it, reading its head) is a few round trips; on a
    loaded host or a slow store they may take most of a lease. The lease is renewed from the
    moment the engine starts, so a driver whose opening took longer than three quarters of its
    lease runs on (it stopped itself as soon as it had opened, before)."""
    from eddyline.ha.lease import Lease
    from eddyline.runtime.engine import Engine

    from .helpers import bids_window_spec, duckdb_windows, write_bid_files

    write_bid_files(tmp_path / "in", files=2, rows=100, seed=3)
    ckpt = f"{s3.bucket(f'open-{uuid.uuid4().hex[:8]}')}/net"
    lease = Lease(ckpt, timeout_s=2.0)
    assert lease.try_acquire()
    engine = Engine(bids_window_spec(tmp_path / "in", tmp_path / "out"), spark, ckpt, lease=lease)
    opened = engine._open

    def slow_open():  # noqa: ANN202
        import time

        time.sleep(2.0)  # the store answering slowly
        return opened()

    monkeypatch.setattr(engine, "_open", slow_open)
    engine.run(until_idle=True)
    assert read_windows(tmp_path / "out") == duckdb_windows(tmp_path / "in")
