"""What high availability costs while nothing fails: the leader's throughput alone, beside a
passive standby, and in a hot pair, on one machine.

Each mode runs the same network (bids → filter → sliding-window aggregate → Parquet, one JSON
file of ``--rows`` bids per epoch, as fast as it goes) with ``eddyline run`` subprocesses on
``local[2]`` each:

* ``single``: one driver;
* ``passive``: the driver and a ``--standby`` on the same checkpoint (it rehearses the next epoch
  once, then waits, keeping its Python workers alive);
* ``hot``: two drivers with ``--hot`` (each its own checkpoint and state, the follower runs
  every epoch the leader plans; the leader waits for a follower two epochs behind).

The throughput is the leader's input rows per second over its epochs (its progress records), from the
moment the second driver is ready (its "standby ready" / "following" line) plus a few epochs, so
that JVM start-up is not part of it. On this 2-core machine the two drivers of a pair share the
cores: the figure says what a replica costs when it runs beside the leader; on two machines it
would cost the leader the selector's few file operations per sink and epoch, and the wait for
the follower. Printed: each run, then per mode the median and range, and the ratio to ``single``.
Writes ``bench/results/ha_overhead.json``.

Usage: ``python bench/ha_overhead.py [--runs 3] [--files 80] [--rows 1500]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.runtime.e2e.helpers import bids_window_spec, write_bid_files  # noqa: E402

SETTLE_EPOCHS = 3


class Driver:
    """``eddyline run`` in a subprocess; notes when its stderr first says each of ``marks``."""

    def __init__(self, spec: Path, ckpt: Path, *extra: str, marks: tuple[str, ...] = ()):
        cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec), "--checkpoint", str(ckpt), "--until-idle",
               "--no-live", "--master", "local[2]", "--lease-timeout", "2", *extra]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.seen: dict[str, float] = {}
        self.tail: list[str] = []
        self.marks = marks
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail = [*self.tail[-30:], line]
            for m in self.marks:
                if m in line and m not in self.seen:
                    self.seen[m] = time.time()

    def wait_for(self, mark: str, timeout_s: float = 180) -> float:
        deadline = time.monotonic() + timeout_s
        while mark not in self.seen:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {mark!r} from the driver:\n{''.join(self.tail)}")
            time.sleep(0.05)
        return self.seen[mark]

    def finish(self) -> None:
        if self.proc.wait(timeout=900) != 0:
            raise RuntimeError(f"driver failed ({self.proc.returncode}):\n{''.join(self.tail)}")


def throughput(progress: Path, since: float) -> tuple[float, int]:
    """Input rows per second over the leader's epochs reported after ``since`` (and
    SETTLE_EPOCHS more): the rows of all but the first, over the time from the first's report
    to the last's."""
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    at = [(datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp(), r["numInputRows"]) for r in records]
    kept = [(t, n) for t, n in at if t >= since][SETTLE_EPOCHS:]
    if len(kept) < 5:
        raise RuntimeError(f"only {len(kept)} epochs after the second driver was ready: use more --files")
    return sum(n for _, n in kept[1:]) / (kept[-1][0] - kept[0][0]), len(kept)


def run_mode(mode: str, work: Path, spec: Path) -> dict:
    ckpt, progress = work / "ckpt", work / "leader.jsonl"
    if mode == "single":
        leader = Driver(spec, ckpt, "--progress-json", str(progress), marks=("leading as",))
        ready = leader.wait_for("leading as")
        others: list[Driver] = []
    elif mode == "passive":
        leader = Driver(spec, ckpt, "--progress-json", str(progress), marks=("leading as",))
        leader.wait_for("leading as")
        standby = Driver(spec, ckpt, "--standby", marks=("standby ready", "waiting for its lease"))
        ready = standby.wait_for("waiting for its lease")
        others = [standby]
    else:
        group = work / "group"
        leader = Driver(spec, ckpt, "--hot", str(group), "--progress-json", str(progress), marks=("leading as",))
        leader.wait_for("leading as")
        follower = Driver(spec, work / "ckpt-b", "--hot", str(group), marks=("following",))
        ready = follower.wait_for("following")
        others = [follower]
    leader.finish()
    for o in others:
        if mode == "passive":  # it would take over once the leader is done: not part of this
            o.proc.terminate()
            o.proc.wait(timeout=120)
        else:
            o.finish()
    rate, epochs = throughput(progress, ready)
    return {"mode": mode, "rows_per_s": round(rate), "epochs_measured": epochs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--files", type=int, default=80)
    ap.add_argument("--rows", type=int, default=1500)
    args = ap.parse_args()
    import yaml

    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="eddyline-ha-overhead-") as tmp:
        data = Path(tmp) / "in"
        write_bid_files(data, files=args.files, rows=args.rows, seed=9)
        for run in range(args.runs):
            for mode in ("single", "passive", "hot"):  # interleaved, so drift hits every mode alike
                work = Path(tmp) / f"{mode}-{run}"
                work.mkdir()
                raw = bids_window_spec(data, work / "out").model_dump(mode="json", by_alias=True, exclude_none=True)
                spec = work / "net.yaml"
                spec.write_text(yaml.safe_dump(raw))
                r = run_mode(mode, work, spec) | {"run": run}
                results.append(r)
                print(f"run {run} {mode:8s} {r['rows_per_s']:>8,} rows/s over {r['epochs_measured']} epochs", flush=True)
    single = statistics.median(r["rows_per_s"] for r in results if r["mode"] == "single")
    summary = {}
    print("\nmode      median rows/s   range               vs single")
    for mode in ("single", "passive", "hot"):
        rates = [r["rows_per_s"] for r in results if r["mode"] == mode]
        med = statistics.median(rates)
        summary[mode] = {"median": med, "min": min(rates), "max": max(rates), "ratio": round(med / single, 3)}
        print(f"{mode:8s} {med:>12,.0f}   {min(rates):>8,}–{max(rates):<8,}   {med / single:.2f}×")
    out = HERE / "results" / "ha_overhead.json"
    out.parent.mkdir(exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "files": args.files, "rows": args.rows,
                    "runs": results, "summary": summary})
    out.write_text(json.dumps(history, indent=1) + "\n")


if __name__ == "__main__":
    main()
