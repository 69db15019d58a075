"""The controller's state travels in every plan and commit: a driver killed while the balancer
cools down after a move, then restarted, takes the very decisions an uninterrupted run takes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eddyline.api.validate import load_spec
from eddyline.runtime.engine import Engine

pytestmark = pytest.mark.slow

EPOCHS = 12
COOLDOWN = 3


def network(out: Path) -> dict:
    # The hot keys move every 2 s of event time (2 epochs of 1,000 rows at 500 rows/s), so the
    # balancer keeps finding work; loads are counted in rows, so every run decides alike.
    phases = [{"duration": "2s", "hot_shift": 7 * i} for i in range(EPOCHS)]
    return {
        "name": "restart", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "clicks", "generator": {"rate": 500, "keys": 64, "skew": 1.5, "seed": 3,
                                                     "unpaced": True, "phases": phases},
                     "max_rows_per_epoch": 1000}],
        "steps": [{"name": "firsts", "input": "clicks", "dedup": {"key": "key", "time": "event_time", "ttl": "5s"}}],
        "sinks": [{"name": "out", "input": "firsts", "files": {"path": str(out)}}],
        "control": {
            "load": "rows", "history": 6,
            "balance": {"threshold": 0.1, "period": 1, "max_moves": 2, "cooldown": COOLDOWN, "patience": 1},
        },
    }


def run(spec_file: Path, ckpt: Path, epochs: int, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec_file), "--checkpoint", str(ckpt),
           "--epochs", str(epochs), "--no-live", "--master", "local[2]", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def decisions(ckpt: Path) -> dict[int, list[tuple]]:
    """Per epoch, the routing decisions of its logged plan (what they did, not their timings)."""
    out = {}
    for path in sorted((ckpt / "plans").glob("*.json")):
        plan = json.loads(path.read_text())
        out[plan["epoch"]] = [(d["kind"], d["step"], json.dumps(d["action"], sort_keys=True)) for d in plan["decisions"]]
    return out


def test_a_driver_killed_during_a_cooldown_decides_as_an_uninterrupted_one(spark, tmp_path: Path) -> None:
    spec_file = tmp_path / "net.yaml"
    spec_file.write_text(yaml.safe_dump(network(tmp_path / "out")))
    # the uninterrupted run in this process (the same local[2] and row-counted loads as the CLI's)
    Engine(load_spec(network(tmp_path / "ref-out")), spark, str(tmp_path / "ref-ckpt")).run(epochs=EPOCHS)
    want = decisions(tmp_path / "ref-ckpt")
    assert sorted(want) == list(range(1, EPOCHS + 1))
    moves = [e for e, ds in want.items() if any(kind == "balance" for kind, *_ in ds)]
    assert moves, want
    crash = moves[0]  # its commit holds a balancer cooling down: the key groups it just moved
    committed = json.loads((tmp_path / "ref-ckpt" / "commits" / f"{crash:010d}.json").read_text())
    assert committed["control"]["manager"]["balancers"]["firsts"]["frozen"], committed["control"]

    # killed once with the epoch committed, once with the next one only planned (it is replayed
    # from its plan, with the controller's state as it was when the plan was made)
    first = run(spec_file, tmp_path / "ckpt", EPOCHS, "--crash-at", f"{crash}:after_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    second = run(spec_file, tmp_path / "ckpt", EPOCHS, "--crash-at", f"{crash + 1}:after_plan")
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    last = run(spec_file, tmp_path / "ckpt", EPOCHS - crash)
    assert last.returncode == 0, last.stderr[-2000:]
    assert decisions(tmp_path / "ckpt") == want
