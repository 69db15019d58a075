"""Kill ``eddyline run`` with SIGKILL at many moments, restart it each time: same output as a
run that was never interrupted, no row lost, none duplicated."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eddyline.storage import staging_leftovers

from .helpers import bids_window_spec, read_windows, write_bid_files

pytestmark = pytest.mark.slow


def eddyline_run(spec: Path, ckpt: Path, *extra: str, kill_after: float | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec), "--checkpoint", str(ckpt), "--until-idle",
           "--no-live", "--master", "local[2]", "--progress-json", str(ckpt) + ".progress.jsonl", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_sigkill_at_every_moment_then_restart_gives_identical_output(spark, tmp_path: Path) -> None:
    write_bid_files(tmp_path / "in", files=10, rows=150, seed=21)
    spec = bids_window_spec(tmp_path / "in", tmp_path / "out")
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True)))

    # reference: one uninterrupted run (in this process: a cold JVM per run is what costs here)
    from eddyline.runtime.engine import Engine

    ref = bids_window_spec(tmp_path / "in", tmp_path / "ref")
    Engine(ref, spark, str(tmp_path / "ref-ckpt")).run(until_idle=True)
    expected = read_windows(tmp_path / "ref")
    assert len(expected) > 200

    ckpt = tmp_path / "ckpt"
    moments = ["1:after_plan", "2:in_task", "3:after_stage", "4:after_publish", "5:mid_commit", "6:after_commit"]
    for moment in moments:
        res = eddyline_run(spec_file, ckpt, "--crash-at", moment)
        assert res.returncode == -signal.SIGKILL, (moment, res.returncode, res.stderr[-2000:])
        epoch = int(moment.split(":")[0])
        commits = sorted(p.name for p in (ckpt / "commits").glob("*.json"))
        committed = int(commits[-1][:-5]) if commits else 0
        # the crash happened in the epoch it was aimed at: committed only if it came after the commit
        assert committed == (epoch if moment.endswith("after_commit") else epoch - 1), (moment, commits)

    # and a kill from outside at a moment nobody chose (a driver starts in about 5 s, then
    # takes a fraction of a second per epoch: most such kills land in some epoch's middle)
    seed = int(os.environ.get("EDDYLINE_KILL_SEED") or random.randrange(1 << 32))
    after = random.Random(seed).uniform(5, 9)
    print(f"the outside kill comes {after:.2f} s after the start (EDDYLINE_KILL_SEED={seed} repeats it)")
    res = eddyline_run(spec_file, ckpt, kill_after=after)
    assert res.returncode in (0, -signal.SIGKILL)

    final = eddyline_run(spec_file, ckpt)
    assert final.returncode == 0, final.stderr[-2000:]
    assert read_windows(tmp_path / "out") == expected

    records = [json.loads(line) for line in Path(str(ckpt) + ".progress.jsonl").read_text().splitlines()]
    replayed = {r["batchId"] for r in records if r["replayed"]}
    # every kill before a commit left a plan behind that the next run replayed
    assert {1, 2, 3, 4, 5} <= replayed
    assert staging_leftovers(tmp_path / "out") == [], "published epochs leave no staging behind"
    assert os.path.isdir(ckpt / "state")
