"""Kill ``eddyline run`` with SIGKILL at a moment of an epoch (one test id per moment, and one
kill from outside at a seeded random moment), restart it: the same output as a run that was never
interrupted, no row lost, none duplicated."""

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


#: where a cell kills the driver: epoch:moment (each in its own epoch, so that a cell's restart
#: replays a plan logged in the middle of a run)
MOMENTS = ["1:after_plan", "2:in_task", "3:after_stage", "4:after_publish", "5:mid_commit", "6:after_commit"]


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """The input, and the windows of one uninterrupted run over it (in this process: a cold JVM
    per run is what costs here)."""
    from eddyline.runtime.engine import Engine

    base = tmp_path_factory.mktemp("recovery")
    write_bid_files(base / "in", files=10, rows=150, seed=21)
    Engine(bids_window_spec(base / "in", base / "ref"), spark, str(base / "ref-ckpt")).run(until_idle=True)
    expected = read_windows(base / "ref")
    assert len(expected) > 200
    return base / "in", expected


def restarted_run_is_exact(reference: tuple[Path, list], tmp_path: Path, *first: str, kill_after: float | None = None,
                           ) -> tuple[subprocess.CompletedProcess, int, set[int]]:
    """A run that is killed (``first``: its options), then a run to the end on its checkpoint:
    the windows are the uninterrupted run's. Returns the killed run, the last epoch it
    committed, and the epochs the restart replayed."""
    inputs, expected = reference
    spec_file = tmp_path / "net.yaml"
    spec = bids_window_spec(inputs, tmp_path / "out")
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    ckpt = tmp_path / "ckpt"
    killed = eddyline_run(spec_file, ckpt, *first, kill_after=kill_after)
    commits = sorted(p.name for p in (ckpt / "commits").glob("*.json"))
    final = eddyline_run(spec_file, ckpt)
    assert final.returncode == 0, final.stderr[-2000:]
    assert read_windows(tmp_path / "out") == expected
    assert staging_leftovers(tmp_path / "out") == [], "published epochs leave no staging behind"
    assert os.path.isdir(ckpt / "state")
    records = [json.loads(line) for line in Path(str(ckpt) + ".progress.jsonl").read_text().splitlines()]
    return killed, int(commits[-1][:-5]) if commits else 0, {r["batchId"] for r in records if r["replayed"]}


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_sigkill_at_a_moment_of_an_epoch_then_a_restart_gives_identical_output(
        reference: tuple[Path, list], tmp_path: Path, moment: str) -> None:
    epoch = int(moment.split(":")[0])
    killed, committed, replayed = restarted_run_is_exact(reference, tmp_path, "--crash-at", moment)
    assert killed.returncode == -signal.SIGKILL, (moment, killed.returncode, killed.stderr[-2000:])
    # the crash happened in the epoch it was aimed at: committed only if it came after the commit,
    # else the plan it left behind is what the restart replayed
    after_commit = moment.endswith("after_commit")
    assert committed == (epoch if after_commit else epoch - 1), (moment, committed)
    assert replayed == (set() if after_commit else {epoch}), (moment, replayed)


def test_a_sigkill_from_outside_at_a_seeded_moment_then_a_restart_gives_identical_output(
        reference: tuple[Path, list], tmp_path: Path) -> None:
    """A kill at a moment nobody chose (a driver starts in about 5 s, then takes a fraction of a
    second per epoch: most such kills land in some epoch's middle)."""
    seed = int(os.environ.get("EDDYLINE_KILL_SEED") or random.randrange(1 << 32))
    after = random.Random(seed).uniform(5, 9)
    print(f"the outside kill comes {after:.2f} s after the start (EDDYLINE_KILL_SEED={seed} repeats it)")
    killed, _, _ = restarted_run_is_exact(reference, tmp_path, kill_after=after)
    assert killed.returncode in (0, -signal.SIGKILL), (f"EDDYLINE_KILL_SEED={seed}", killed.stderr[-2000:])
