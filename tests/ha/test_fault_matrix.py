"""The fault matrix of ``bench/faults`` (issue #22): its verifier, without Spark, and a short real
cell. The whole matrix is a benchmark: ``./dev.sh bench bench/faults/matrix.py``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.faults.cells import Cell, point_crash, point_freeze, run_cell
from bench.faults.harness import (
    STEP_MS,
    T0_MS,
    Outputs,
    Servers,
    Setup,
    SinkRows,
    expected_windows,
    key_of,
    publish_input,
    verify,
    zombie_writes,
)

N = 6_000


def clean(n: int = N) -> SinkRows:
    raw = sorted((s, key_of(s), T0_MS + s * STEP_MS) for s in range(1, n + 1))
    wins = expected_windows(n)
    return SinkRows({k: list(raw) for k in ("files", "pg", "nats")}, {k: list(wins) for k in ("files", "pg", "nats")})


def by_sink(checks: list) -> dict:
    return {c.sink: c for c in checks}


def test_the_verifier_passes_a_clean_run_and_names_the_sink_that_lost_or_duplicated_records() -> None:
    expected = expected_windows(N)
    reference = clean()
    assert all(c.ok for c in verify(clean(), N, expected, reference))

    got = clean()
    got.raw["pg"] = [r for r in got.raw["pg"] if r[0] != 1234]  # seq 1234 lost
    got.raw["nats"] = sorted([*got.raw["nats"], got.raw["nats"][99]])  # seq 100 twice
    w = got.win["files"]
    i = next(i for i, x in enumerate(w) if x[3] > 1)
    w[i] = (*w[i][:3], w[i][3] - 1, *w[i][4:])  # a window that counted one record less
    twice = got.win["nats"][5]
    got.win["nats"] = sorted([*got.win["nats"], twice])  # a window published twice
    checks = by_sink(verify(got, N, expected, reference))

    assert (checks["raw_pg"].lost, checks["raw_pg"].duplicated, checks["raw_pg"].identical) == (1, 0, False)
    assert (checks["raw_nats"].lost, checks["raw_nats"].duplicated) == (0, 1)
    assert (checks["win_files"].lost, checks["win_files"].wrong, checks["win_files"].identical) == (1, 1, False)
    assert (checks["win_nats"].lost, checks["win_nats"].duplicated) == (0, twice[3])  # its records, counted twice
    assert {s for s, c in checks.items() if c.ok} == {"raw_files", "win_pg"}


def short_run(cell: Cell, nats_server, postgres, tmp_path: Path):  # noqa: ANN001, ANN201
    """``cell`` run on a fresh stream of ``N`` records, against the servers of the session."""
    stream = f"SEQ{uuid.uuid4().hex[:8].upper()}"
    setup = Setup(nats_server.url, postgres.url, stream, N)
    publish_input(setup.nats_url, stream, N)
    return run_cell(cell, setup, Servers(nats_server, postgres), tmp_path / f"fm{uuid.uuid4().hex[:8]}", None,
                    expected_windows(N))


@pytest.mark.slow
def test_a_crash_inside_a_key_group_move_then_a_restart_loses_and_duplicates_nothing(
    nats_server, postgres, tmp_path: Path
) -> None:
    """The matrix's key-group-move cell on a short input: ``--crash-at 3:in_task`` (epoch 3
    moves two key groups), a restart, and every sink (files, PostgreSQL, NATS; raw and windowed)
    holds each sequence number once and each window with the input's count, sum, min and max."""
    cell = Cell("key-group move", "SIGKILL → restart", "", point_crash(3, "in_task"))
    result = short_run(cell, nats_server, postgres, tmp_path)
    assert result.status == "pass", (result.notes, [c for c in result.checks if not c.ok])
    assert len(result.checks) == 6 and all(c.rows > 0 for c in result.checks)
    assert result.recovery_s is not None and result.next_commit == 3
    assert result.zombie_writes == 0  # the restarted driver took the lease from one that was dead


@pytest.mark.slow
def test_a_leader_woken_after_the_standby_published_writes_nothing_anywhere(nats_server, postgres, tmp_path: Path) -> None:
    """The matrix's publish × SIGSTOP cell on a short input: frozen with every output staged
    (``--freeze-at 3:after_stage``), a standby takes over and publishes epoch 3, the old leader
    wakes into its publish: refused by every store, so no sink shows a write of generation 1
    made after the takeover, and every sink holds each record once."""
    cell = Cell("publish", "SIGSTOP → SIGCONT (standby)", "", point_freeze(3, "after_stage"))
    result = short_run(cell, nats_server, postgres, tmp_path)
    assert result.status == "pass", (result.notes, [c for c in result.checks if not c.ok])
    assert result.zombie_writes == 0 and result.lost == 0 and result.duplicated == 0


def test_zombie_writes_are_counted_from_what_each_store_says_wrote_what(nats_server, postgres, tmp_path: Path) -> None:
    """The counter the matrix fails a cell on, fed a write of each kind made by generation 1
    after generation 2 took the lease: it must see all three (and none made before)."""
    import json
    import time

    import psycopg

    from eddyline.io.natswire import NatsConnection, ensure_stream

    out = Outputs(tmp_path / "out", f"zw{uuid.uuid4().hex[:6]}")
    ckpt = tmp_path / "ckpt"
    (ckpt / "lease").mkdir(parents=True)
    before = time.time() - 60
    for g, at in ((1, before - 60), (2, before)):
        (ckpt / "lease" / f"{g:010d}.json").write_text(json.dumps({"generation": g, "acquired_at": at}))
    (ckpt / "metadata.json").write_text(json.dumps({"id": out.name}))
    setup = Setup(nats_server.url, postgres.url, "unused", N)
    assert zombie_writes(setup, out, ckpt) == 0
    epoch = out.directory / "raw" / "epoch=0000000004"
    epoch.mkdir(parents=True)
    (epoch / "_generation").write_text("1")
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS eddyline_epochs (network text, checkpoint text, sink text, "
                     "epoch bigint, committed_at timestamptz DEFAULT now(), tentative boolean NOT NULL DEFAULT false, "
                     "PRIMARY KEY (network, checkpoint, sink, epoch))")
        conn.execute("ALTER TABLE eddyline_epochs ADD COLUMN IF NOT EXISTS generation bigint")
        conn.execute("INSERT INTO eddyline_epochs (network, checkpoint, sink, epoch, generation) VALUES "
                     "('n', %s, 'raw_pg', 4, 1), ('n', %s, 'raw_pg', 5, 2)", (out.name, out.name))
    stream = out.streams["raw"]
    with NatsConnection(nats_server.url) as conn:
        ensure_stream(conn, stream, [f"{stream}.out"])
        conn.publish([(f"{stream}.out", "x/1", b"{}"), (f"{stream}.out", "x/2", b"{}")], headers=b"Eddyline-Generation: 1\r\n")
    assert zombie_writes(setup, out, ckpt) == 1 + 1 + 2
