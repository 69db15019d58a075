"""Kill ``eddyline run`` with SIGKILL at each moment of an epoch in turn (each restart killed at the
next moment, one epoch later), and once from outside at a seeded random moment; restart it: the
same output as a run that was never interrupted, no row lost, none duplicated."""

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


#: where the runs are killed, in turn: epoch:moment, each one epoch after the one before, so that
#: every run replays what the run before it left (a plan logged in the middle of a run), then dies
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


def spec_file(reference: tuple[Path, list], tmp_path: Path, execution: str = "job") -> Path:
    path = tmp_path / "net.yaml"
    spec = bids_window_spec(reference[0], tmp_path / "out")
    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    path.write_text(yaml.safe_dump({**raw, "execution": execution}))
    return path


def committed(ckpt: Path) -> int:
    """The checkpoint's last committed epoch (0: none)."""
    return max((int(p.name[:-5]) for p in (ckpt / "commits").glob("*.json")), default=0)


def progress(ckpt: Path) -> list[dict]:
    path = Path(str(ckpt) + ".progress.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def finished_exactly(reference: tuple[Path, list], tmp_path: Path, spec: Path, ckpt: Path, *extra: str) -> None:
    """A run to the end on ``ckpt`` gives the uninterrupted run's windows."""
    final = eddyline_run(spec, ckpt, *extra)
    assert final.returncode == 0, final.stderr[-2000:]
    assert read_windows(tmp_path / "out") == reference[1]
    assert staging_leftovers(tmp_path / "out") == [], "published epochs leave no staging behind"
    assert os.path.isdir(ckpt / "state")


@pytest.mark.parametrize("execution", ["job", "resident"])
def test_a_sigkill_at_each_moment_of_an_epoch_in_turn_then_a_restart_gives_identical_output(
        reference: tuple[Path, list], tmp_path: Path, execution: str) -> None:
    """Killed at ``1:after_plan``; the restart, on another lane count, replays epoch 1 and is
    killed at ``2:in_task`` (resident: inside lane 0, its state written and its manifest not yet
    sent); and so on to ``6:after_commit``: each kill lands in the epoch it was aimed at
    (committed only if it came after the commit, else the plan it left is what the next run
    replays), and the last restart ends with every window once."""
    spec, ckpt = spec_file(reference, tmp_path, execution), tmp_path / "ckpt"
    for i, moment in enumerate(MOMENTS):
        epoch, after_commit = int(moment.split(":")[0]), moment.endswith("after_commit")
        seen = len(progress(ckpt))
        killed = eddyline_run(spec, ckpt, "--crash-at", moment, "--lanes", str(1 + i % 2))
        assert killed.returncode == -signal.SIGKILL, (moment, killed.returncode, killed.stderr[-2000:])
        assert committed(ckpt) == (epoch if after_commit else epoch - 1), (moment, committed(ckpt))
        replayed = {r["batchId"] for r in progress(ckpt)[seen:] if r["replayed"]}
        before = MOMENTS[i - 1] if i else None  # what the run before this one left to replay
        assert replayed == (set() if before is None or before.endswith("after_commit")
                            else {int(before.split(":")[0])}), (moment, replayed)
    finished_exactly(reference, tmp_path, spec, ckpt)
    if execution == "resident":  # a stage per run, one more per rescale (a replay on the lanes it was logged for)
        assert len(list((ckpt / "resident").iterdir())) > len(MOMENTS)


@pytest.mark.parametrize("execution", ["job", "resident"])
def test_a_sigkill_from_outside_at_a_seeded_moment_then_a_restart_on_other_lanes_gives_identical_output(
        reference: tuple[Path, list], tmp_path: Path, execution: str) -> None:
    """A kill at a moment nobody chose (a driver starts in about 5 s, then takes a fraction of a
    second per epoch: most such kills land in some epoch's middle), the restart on one lane
    instead of two; on resident lanes too (the reference ran per-epoch jobs)."""
    seed = int(os.environ.get("EDDYLINE_KILL_SEED") or random.randrange(1 << 32))
    after = random.Random(seed).uniform(5, 9)
    print(f"the outside kill comes {after:.2f} s after the start (EDDYLINE_KILL_SEED={seed} repeats it)")
    spec, ckpt = spec_file(reference, tmp_path, execution), tmp_path / "ckpt"
    killed = eddyline_run(spec, ckpt, kill_after=after)
    assert killed.returncode in (0, -signal.SIGKILL), (f"EDDYLINE_KILL_SEED={seed}", killed.stderr[-2000:])
    finished_exactly(reference, tmp_path, spec, ckpt, "--lanes", "1")
