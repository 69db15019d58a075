"""Exactly once through a real broker: ``eddyline run`` reading Nexmark bids from NATS and
writing windowed counts to NATS and PostgreSQL is killed (SIGKILL) at every stage of an epoch in
turn, including between a sink's publishes, each restart killed one epoch later, then run to the
end; the NATS server is frozen, killed and restarted under a run. Every time, the output stream
ends up with exactly the rows of a run nobody disturbed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC
from pathlib import Path

import pytest
import yaml

from eddyline.api.sources import SourceSpec
from eddyline.api.validate import load_spec
from eddyline.io.nexmark import nexmark_schema
from eddyline.io.produce import Feed, produce
from eddyline.runtime.engine import Engine

from ...natsref import read_stream

pytestmark = pytest.mark.slow

EVENTS = 24_000
PER_EPOCH = 2_500  # stream sequences per epoch: ~10 epochs


@pytest.fixture(scope="module")
def bids(spark, nats_server) -> str:
    stream = f"BIDS{uuid.uuid4().hex[:8]}"
    feed = Feed(SourceSpec.model_validate({"name": "bid", "nexmark": {"stream": "bid", "rate": 1_000, "unpaced": True}}),
                f"{stream}.bid")
    produce(spark, nats_server.url, stream, [feed], end=EVENTS)
    return stream


def network(url: str, stream: str, out: str, wait: str = "30s", db: str | None = None) -> dict:
    return {
        "name": "hot-auctions", "trigger": 0, "lanes": 2, "key_groups": 16,
        "sources": [{"name": "bids", "max_rows_per_epoch": PER_EPOCH,
                     "nats": {"url": url, "stream": stream, "schema": nexmark_schema("bid"), "wait": wait}}],
        "steps": [
            {"name": "per_auction", "input": "bids", "window_aggregate": {
                "key": "auction", "time": "date_time", "window": {"size": "4s", "slide": "2s"},
                "aggregates": {"bids": "count(*)", "top": "max(price)"}, "watermark_delay": "1s"}},
        ],
        "sinks": [{"name": "hot", "input": "per_auction",
                   "nats": {"url": url, "stream": out, "subject": f"{out}.hot", "wait": wait}}]
        + ([{"name": "hot_db", "input": "per_auction", "postgres": {"url": db, "table": out.lower(), "mode": "append"}}]
           if db else []),
    }


def table(db: str, name: str) -> list[str]:
    """The table's rows as canonical JSON (the output stream's form), sorted."""
    import psycopg

    with psycopg.connect(db) as conn:
        columns = ("auction", "window_start", "window_end", "bids", "top", "revision")
        cur = conn.execute(f"SELECT {', '.join(columns)} FROM {name.lower()}")
        rows = [dict(zip(columns, r, strict=True)) for r in cur]
    for r in rows:
        for k in ("window_start", "window_end"):
            r[k] = r[k].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def output(url: str, stream: str) -> list[str]:
    """The output stream's messages as canonical JSON, sorted (duplicates stay visible)."""
    return sorted(json.dumps(json.loads(m), sort_keys=True) for _, m, _ in read_stream(url, stream))


@pytest.fixture(scope="module")
def expected(spark, nats_server, bids, tmp_path_factory) -> list[str]:
    out = f"REF{uuid.uuid4().hex[:8]}"
    tmp = tmp_path_factory.mktemp("ref")
    Engine(load_spec(network(nats_server.url, bids, out)), spark, str(tmp / "ckpt")).run(until_idle=True)
    rows = output(nats_server.url, out)
    assert len(rows) > 500
    return rows


def eddyline_run(spec: Path, ckpt: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "eddyline.cli", "run", str(spec), "--checkpoint", str(ckpt), "--until-idle",
           "--no-live", "--master", "local[2]", "--progress-json", f"{ckpt}.progress.jsonl", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _spec_file(tmp: Path, raw: dict, name: str = "net.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(raw))
    return path


#: where the runs are killed, in turn: epoch:moment, each one epoch after the one before, so that
#: every run replays what the run before it left, then dies. The moments where a broker or a
#: database is involved: the plan logged (the source's range read, nothing sent), between a
#: sink's publishes, published but not committed, committed (the source acknowledged after).
#: Inside a task, after the stages and inside the commit nothing reaches a server; those are
#: the engine's own and are killed in turn by test_recovery.py.
MOMENTS = ["1:after_plan", "2:mid_publish", "3:after_publish", "4:after_commit"]
#: the chain as it runs: per-epoch jobs for the first two kills, then resident lanes for three
#: (one more kill: inside lane 0, its part of the epoch read and its state written, the driver
#: not yet answered, nothing of it published), then jobs to the end; so each run replays what
#: a run of its own or the other mode left. The moments around the publish are the driver's own
#: in either mode (a resident epoch's sink rows come back to it), so each is killed once.
CHAIN = [("job", MOMENTS[0]), ("job", MOMENTS[1]), ("resident", "3:in_task"), ("resident", "4:after_publish"),
         ("resident", "5:after_commit")]


def test_a_sigkill_at_each_stage_in_turn_then_a_restart_publishes_each_row_exactly_once(
    nats_server, postgres, bids, expected, tmp_path
):
    """Through :data:`CHAIN`: per-epoch jobs and resident lanes (which read their sequences of
    the stream themselves) on one checkpoint; the reference ran jobs."""
    out = f"OUT{uuid.uuid4().hex[:8]}"
    raw = network(nats_server.url, bids, out, db=postgres.url)
    specs = {mode: _spec_file(tmp_path, raw | {"execution": mode}, f"net-{mode}.yaml") for mode in ("job", "resident")}
    ckpt = tmp_path / "ckpt"
    for mode, moment in CHAIN:
        proc = eddyline_run(specs[mode], ckpt, "--crash-at", moment)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == -signal.SIGKILL, (mode, moment, err[-2000:])
    assert len(list((ckpt / "resident").iterdir())) >= 3  # (a stage in each resident run)
    proc = eddyline_run(specs["job"], ckpt)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert output(nats_server.url, out) == expected
    assert table(postgres.url, out) == expected


def _wait_for_epochs(progress: Path, n: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if progress.exists() and len(progress.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    raise AssertionError(f"no {n} epochs within {timeout_s}s")


def test_a_frozen_then_a_killed_and_restarted_server_delays_the_run_and_loses_nothing(
    nats_server, postgres, bids, expected, tmp_path
):
    out = f"OUT{uuid.uuid4().hex[:8]}"
    spec = _spec_file(tmp_path, network(nats_server.url, bids, out, db=postgres.url))
    ckpt = tmp_path / "ckpt"
    progress = Path(f"{ckpt}.progress.jsonl")
    proc = eddyline_run(spec, ckpt)
    try:
        _wait_for_epochs(progress, 2, proc)
        nats_server.pause()  # SIGSTOP: connections hang, reads time out, the run retries
        time.sleep(7)
        nats_server.resume()
        _wait_for_epochs(progress, 5, proc)
        nats_server.kill()  # and gone: connections refused until it is back on the same port and store
        time.sleep(3)
        nats_server.start()
        _wait_for_epochs(progress, 7, proc)
        postgres.restart()  # the sink's connection is cut; it reconnects and retries the epoch
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if nats_server.proc is None:
            nats_server.start()
    assert proc.returncode == 0, err[-3000:]
    assert output(nats_server.url, out) == expected
    assert table(postgres.url, out) == expected
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    retried = [r for r in records for s in r["sources"] + r["sinks"] if s.get("retries", 0) > 0]
    assert retried, "the progress never showed a retry"


def test_a_server_that_stays_away_fails_the_run_with_an_error_naming_the_source_and_server(
    nats_server, bids, tmp_path
):
    raw = network("nats://127.0.0.1:9", bids, "NOWHERE", wait="2s")
    proc = eddyline_run(_spec_file(tmp_path, raw), tmp_path / "ckpt")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "source 'bids': NATS server nats://127.0.0.1:9 unreachable" in " ".join(err.split())
