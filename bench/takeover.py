"""Failover: the time from the leader's death to the standby's first commit.

Per run, in a fresh directory: a leader (``eddyline run --until-idle``, ``local[2]``) reads 60
JSON-lines bid files into a sliding-window aggregate, one file per epoch, epochs a second apart;
a standby (``--standby``) starts beside it and waits for the checkpoint's lease. Once the standby
says it is ready and the leader has committed three epochs, the leader gets SIGKILL. The run's
figures come from the checkpoint and the standby's progress record, so they are the processes'
own clocks:

* ``expiry``: the leader's last heartbeat's expiry (its lease is free from then on);
* ``taken``: when the standby created the next lease generation;
* ``planned``: when it logged its first plan (the engine reads the checkpoint before);
* ``committed``: its first commit; ``takeover`` = committed - the SIGKILL;
* the first epoch's stages (``durationMs`` of its progress record).

The leader is killed a random fraction of a second after its third commit, so the lease's
remaining time at the kill varies as it would. ``--cold`` starts the standby with
``--no-rehearse`` (it only waits, as before the rehearsal existed), for comparison. The machine's
load average when the leader dies is kept with each run (other work on the machine slows Spark).
Printed: each run, then min / median / max of every column. Usage:
``python bench/takeover.py [--runs 5] [--lease 1.5] [--cold] [--hot] [--keep DIR]``; writes
``bench/results/takeover.json`` (each invocation appends its series).

``--hot`` measures a hot pair instead (``--hot GROUP``, a checkpoint each): the leader runs alone
until its 12th commit (it keeps every plan since epoch 1), then a follower is started beside it:

* ``join_s``: from the follower's start to its first commit as a *following* follower (it
  copies the leader's latest commit rather than run the plans before it, then runs an epoch of
  its own, the slow cold one);
* ``join_pause_s``: the longest the sink's output stopped while the follower joined (between
  two epochs' publishes, from its start until it follows), against ``steady_s``, the median
  between two epochs before it started;

then, once it follows and the leader has committed twice more, the leader gets SIGKILL:

* ``taken_s``: when the follower took the lease over (at once, as it sees the leader's process
  gone, rather than when the lease expires: ``expiry_s``);
* ``takeover_s``: its first commit as the leader;
* ``handover_gap_s``: the longest the sink's output stopped around the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: what the standby prints once it is ready (rehearsed), or waits (--cold: without rehearsing)
READY = ("standby ready", "waiting for its lease to expire")


def write_bids(directory: Path, files: int = 60, rows: int = 150, seed: int = 5) -> None:
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for f in range(files):
        with open(directory / f"bids-{f:04d}.json", "w", encoding="utf-8") as out:
            for i in range(rows):
                t = t0 + timedelta(milliseconds=f * 20_000 + i * (20_000 // rows) + rng.randint(-3_000, 0))
                out.write(json.dumps({"auction": rng.randint(0, 30), "price": rng.randint(0, 999),
                                      "ts": t.isoformat().replace("+00:00", "Z")}) + "\n")


def write_spec(path: Path, data: Path, out: Path) -> None:
    import yaml

    window = {"key": "auction", "time": "ts", "window": {"size": "10s", "slide": "5s"},
              "aggregates": {"n": "count(*)", "total": "sum(price)", "hi": "max(price)", "mean": "avg(price)"},
              "watermark_delay": "2s", "allowed_lateness": "0s"}
    path.write_text(yaml.safe_dump({
        "name": "bids-windows", "trigger": 1000, "lanes": 2, "key_groups": 32,
        "sources": [{"name": "bids", "files": {"path": str(data), "format": "json",
                                                "schema": "auction long, price long, ts timestamp",
                                                "max_files_per_epoch": 1}}],
        "steps": [{"name": "expensive", "input": "bids", "filter": "price >= 100"},
                  {"name": "per_auction", "input": "expensive", "window_aggregate": window}],
        "sinks": [{"name": "out", "input": "per_auction", "files": {"path": str(out), "format": "parquet"}}],
    }))


def start(spec: Path, ckpt: Path, lease: float, name: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec), "--checkpoint", str(ckpt), "--until-idle",
           "--no-live", "--master", "local[2]", "--lease-timeout", str(lease),
           "--progress-json", str(ckpt.parent / f"{name}.jsonl"), *extra]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    err = (ckpt.parent / f"{name}.err").open("w")
    STARTED.append(proc := subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, env=env))
    return proc


#: the drivers a run started: those still running after it (a failed run) are killed
STARTED: list[subprocess.Popen] = []


def wait_for(condition: Any, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(0.05)


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def generations(commits: Path) -> list[int]:
    """The lease generation of every commit (one the cleanup deletes meanwhile is skipped)."""
    out = []
    for p in commits.glob("*.json"):
        try:
            out.append(read_json(p)["generation"])
        except FileNotFoundError:
            continue
    return out


def latest(commits: Path) -> int:
    """The newest committed epoch (counting files would not do: the cleanup deletes old ones)."""
    return max((int(p.name[:-5]) for p in commits.glob("*.json")), default=0)


def one_run(work: Path, lease: float, rng: random.Random, profile: bool = False, cold: bool = False) -> dict[str, Any]:
    write_bids(work / "in")
    spec, ckpt = work / "net.yaml", work / "ckpt"
    write_spec(spec, work / "in", work / "out")
    commits = ckpt / "commits"
    leader = start(spec, ckpt, lease, "leader")
    wait_for(lambda: latest(commits) >= 1)
    t_standby = time.monotonic()
    standby = start(spec, ckpt, lease, "standby", "--standby", *(["--no-rehearse"] if cold else []))
    err = work / "standby.err"
    wait_for(lambda: any(s in err.read_text() for s in READY))
    ready_s = time.monotonic() - t_standby
    have = latest(commits)
    wait_for(lambda: latest(commits) >= max(3, have + 1) or leader.poll() is not None)
    time.sleep(rng.uniform(0.0, 0.9))
    if leader.poll() is not None:
        raise RuntimeError("the leader finished before it was killed: the standby took too long to get ready")
    spy = None
    if profile:
        spy = subprocess.Popen([shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(standby.pid), "--idle", "--rate", "200",
                                "--format", "raw", "--duration", "15", "--nonblocking",
                                "-o", str(work / "standby.pyspy.txt")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    leader.send_signal(signal.SIGKILL)
    died = time.time()
    load = os.getloadavg()[0]
    leader.wait()
    wait_for(lambda: 2 in generations(commits), 120)
    standby.send_signal(signal.SIGTERM)  # it stops after the epoch it is in: the rest is not measured
    if standby.wait(timeout=300) != 0:
        raise RuntimeError(f"the standby failed:\n{err.read_text()[-3000:]}")
    if spy is not None:
        spy.wait()
    ours = {int(p.name[:-5]): read_json(p) for p in commits.glob("*.json")}
    first = min(e for e, c in ours.items() if c["generation"] == 2)
    beat = read_json(ckpt / "lease" / f"{1:010d}.beat")
    taken = read_json(ckpt / "lease" / f"{2:010d}.json")
    plan = read_json(ckpt / "plans" / f"{first:010d}.json")
    record = next(r for r in map(json.loads, (work / "standby.jsonl").read_text().splitlines())
                  if r["batchId"] == first)
    d = record["durationMs"]
    return {
        "takeover_s": ours[first]["committed_at"] - died,
        "expiry_s": beat["expires_at"] - died,
        "taken_s": taken["acquired_at"] - died,
        # a plan the leader logged and did not commit is replayed as it is (planned before the kill)
        "planned_s": plan["planned_at"] - died if plan["generation"] == 2 else float("nan"),
        "committed_s": ours[first]["committed_at"] - died,
        "epoch_ms": d["triggerExecution"],
        "planning_ms": d["planning"],
        "execution_ms": d["execution"],
        "publish_ms": d["publish"],
        "commit_ms": d["commit"],
        "standby_ready_s": ready_s,
        "load_1min": load,
        "first_epoch": first,
        "rehearsal": next((x for x in err.read_text().splitlines() if x.startswith("standby ready")), None),
    }


def publishes(out: Path) -> list[float]:
    """When each of a files sink's epochs was published (its directory's change time: the rename)."""
    return sorted(p.stat().st_ctime for p in out.glob("epoch=*"))


def longest_gap(times: list[float], after: float, until: float) -> float:
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > after and a < until]
    return max(gaps, default=float("nan"))


def one_hot_run(work: Path, lease: float, rng: random.Random) -> dict[str, Any]:
    write_bids(work / "in")
    spec, group, a, b = work / "net.yaml", work / "group", work / "a", work / "b"
    write_spec(spec, work / "in", work / "out")
    raw = spec.read_text()
    spec.write_text(raw.replace("name: bids-windows", "name: bids-windows\nhistory: 40"))
    leader = start(spec, a, lease, "leader", "--hot", str(group))
    wait_for(lambda: latest(a / "commits") >= 12)
    before = publishes(work / "out")
    steady = statistics.median(y - x for x, y in zip(before, before[1:], strict=False))
    t_join = time.time()
    follower = start(spec, b, lease, "follower", "--hot", str(group))
    progress = work / "follower.jsonl"

    def following() -> dict[str, Any] | None:
        lines = progress.read_text().splitlines() if progress.exists() else []
        return next((r for r in map(json.loads, lines) if r["driver"].get("state") == "following"), None)

    wait_for(lambda: following() is not None or follower.poll() is not None, 180)
    if following() is None:
        raise RuntimeError(f"the follower never followed:\n{(work / 'follower.err').read_text()[-3000:]}")
    records = [json.loads(x) for x in progress.read_text().splitlines()]
    first = records[0]["batchId"]  # its first epoch of its own, after the copy
    joined = datetime.fromisoformat(following()["committedAt"].replace("Z", "+00:00")).timestamp()
    have = latest(a / "commits")
    wait_for(lambda: latest(a / "commits") >= have + 2 or leader.poll() is not None)
    time.sleep(rng.uniform(0.0, 0.9))
    if leader.poll() is not None:
        raise RuntimeError("the leader finished before it was killed")
    leader.send_signal(signal.SIGKILL)
    died = time.time()
    leader.wait()
    wait_for(lambda: (group / "lease" / f"{2:010d}.json").exists(), 120)
    wait_for(lambda: any(read_json(p).get("generation") == 2 for p in (b / "commits").glob("*.json")), 120)
    time.sleep(3)  # a few epochs more, for the output's gap
    follower.send_signal(signal.SIGTERM)
    if follower.wait(timeout=300) != 0:
        raise RuntimeError(f"the follower failed:\n{(work / 'follower.err').read_text()[-3000:]}")
    led = [read_json(p) for p in (b / "commits").glob("*.json")]
    times = publishes(work / "out")
    return {
        "join_s": joined - t_join,
        "join_pause_s": longest_gap(times, t_join, joined),
        "steady_s": steady,
        "copied_epoch": first - 1,
        "expiry_s": read_json(group / "lease" / f"{1:010d}.beat")["expires_at"] - died,
        "taken_s": read_json(group / "lease" / f"{2:010d}.json")["acquired_at"] - died,
        "takeover_s": min(c["committed_at"] for c in led if c["generation"] == 2) - died,
        "handover_gap_s": longest_gap(times, died - 0.5, died + 5),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lease", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cold", action="store_true", help="the standby does not rehearse (--no-rehearse)")
    ap.add_argument("--hot", action="store_true", help="a hot pair: a follower joins, then the leader is killed")
    ap.add_argument("--keep", type=Path, help="keep each run's directory (checkpoint, stderr) under DIR")
    ap.add_argument("--py-spy", action="store_true",
                    help="record the standby with py-spy from the kill on (raw stacks in each run's directory)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    runs, failed = [], []
    for i in range(args.runs):
        work = Path(tempfile.mkdtemp(prefix="takeover-")) if args.keep is None else args.keep / f"run-{i}"
        if args.keep is not None:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
        try:
            r = one_hot_run(work, args.lease, rng) if args.hot else one_run(work, args.lease, rng, args.py_spy, args.cold)
        except (RuntimeError, TimeoutError) as e:  # reported and kept, not left out silently
            print(f"run {i + 1}: failed: {str(e)[:500]}", flush=True)
            failed.append({"run": i + 1, "error": str(e)[:2000]})
            continue
        finally:
            for proc in STARTED:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            STARTED.clear()
            if args.keep is None:
                shutil.rmtree(work, ignore_errors=True)
        runs.append(r)
        if args.hot:
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
            continue
        print(f"run {i + 1}: takeover {r['takeover_s']:.2f} s (lease free {r['expiry_s']:+.2f}, taken "
              f"{r['taken_s']:+.2f}, planned {r['planned_s']:+.2f}, committed {r['committed_s']:+.2f}; first "
              f"epoch {r['epoch_ms']:.0f} ms: planning {r['planning_ms']:.0f}, execution {r['execution_ms']:.0f}, "
              f"publish {r['publish_ms']:.0f}, commit {r['commit_ms']:.0f}; standby ready after "
              f"{r['standby_ready_s']:.1f} s; load {r['load_1min']:.1f})", flush=True)
    print(f"\n{len(runs)} runs, {len(failed)} failed\n{'':>16} {'min':>8} {'median':>8} {'max':>8}")
    for key in runs[0] if runs else []:
        if key in ("first_epoch", "rehearsal"):
            continue
        xs = [r[key] for r in runs if r[key] == r[key]]  # not the NaNs of replayed plans
        if not xs:
            continue
        print(f"{key:>16} {min(xs):8.2f} {statistics.median(xs):8.2f} {max(xs):8.2f}")
    (HERE / "results").mkdir(exist_ok=True)
    # every series is kept (each is one invocation, under whatever load the machine had)
    path = HERE / "results" / "takeover.json"
    series = json.loads(path.read_text()).get("series", []) if path.exists() else []
    series.append({"when": datetime.now(UTC).isoformat(timespec="seconds"), "lease_s": args.lease,
                   "cores": os.cpu_count(), **({"mode": "hot"} if args.hot else {"rehearsal": not args.cold}),
                   "runs": runs, "failed": failed})
    path.write_text(json.dumps({"series": series}, indent=2) + "\n")


if __name__ == "__main__":
    main()
