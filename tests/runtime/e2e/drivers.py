"""Drivers as an operator starts them: ``eddyline run`` in a subprocess, read while it runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from eddyline.observe.progress import ProgressReporter
from eddyline.runtime.engine import Engine

#: the lease timeout the failover tests give their drivers (seconds, as the option takes it)
LEASE = "1.5"


def start(spec: Path, ckpt: Path | str, *extra: str) -> subprocess.Popen:
    """``eddyline run --until-idle`` in a subprocess; its stderr goes to a file (``proc.errfile``,
    :func:`err`) to read while it runs, beside the checkpoint (one on an object store: beside the
    spec)."""
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec), "--checkpoint", str(ckpt), "--until-idle",
           "--no-live", "--master", "local[2]", "--lease-timeout", LEASE, *extra]
    errfile = (ckpt.parent if isinstance(ckpt, Path) else spec.parent) / f"stderr-{time.monotonic_ns()}.txt"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errfile.open("w"), text=True)
    proc.errfile = errfile  # type: ignore[attr-defined]
    return proc


def err(proc: subprocess.Popen) -> str:
    """What the driver wrote to stderr so far."""
    return proc.errfile.read_text()  # type: ignore[attr-defined]


def finish(proc: subprocess.Popen, timeout_s: float = 300) -> tuple[int, str]:
    proc.communicate(timeout=timeout_s)
    return proc.returncode, err(proc)


def wait_for(condition: Callable[[], bool], timeout_s: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out{' waiting for ' + what if what else ''}"
        time.sleep(0.1)


def commits(ckpt: Path) -> dict[int, dict]:
    """The checkpoint's commits by epoch (one its cleanup deletes meanwhile is skipped)."""
    out = {}
    for p in (ckpt / "commits").glob("*.json"):
        try:
            out[int(p.name[:-5])] = json.loads(p.read_text())
        except FileNotFoundError:
            continue
    return out


def frozen(proc: subprocess.Popen) -> bool:
    """Whether the process is stopped (SIGSTOP, a ``--freeze-at`` hook)."""
    with open(f"/proc/{proc.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def run(spec, spark, ckpt: Path, **kwargs):
    """Run ``spec`` in this process, its progress records in ``<ckpt>.progress.jsonl``."""
    with ProgressReporter(live=False, json_path=str(ckpt) + ".progress.jsonl") as rep:
        return Engine(spec, spark, str(ckpt), reporter=rep, lanes=kwargs.pop("lanes", None)).run(**kwargs)


def kill_the_leader(leader: subprocess.Popen, standby: subprocess.Popen,
                    commits_of: Callable[[], dict[int, dict]]) -> tuple[float, float]:
    """Once the standby waits for the lease and the leader committed three epochs: SIGKILL the
    leader. Returns when it died and when the standby's first commit (generation 2) was made,
    read before the checkpoint's cleanup (10 epochs kept) deletes it."""
    wait_for(lambda: "waiting for its lease to expire" in standby.errfile.read_text(), 300)  # type: ignore[attr-defined]
    assert leader.poll() is None, "the leader ended before the standby was ready"
    wait_for(lambda: len(commits_of()) >= 3)
    leader.send_signal(signal.SIGKILL)
    died = time.time()
    assert leader.wait(timeout=60) == -signal.SIGKILL
    wait_for(lambda: any(c["generation"] == 2 for c in commits_of().values()), 300)
    return died, min(c["committed_at"] for c in commits_of().values() if c["generation"] == 2)
