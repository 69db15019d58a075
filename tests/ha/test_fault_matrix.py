"""The fault matrix of ``bench/faults`` (issue #22): its verifier, without Spark, and a short real
cell. The whole matrix is a benchmark: ``./dev.sh bench bench/faults/matrix.py``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.faults.cells import Cell, point_crash, run_cell
from bench.faults.harness import (
    STEP_MS,
    T0_MS,
    Servers,
    Setup,
    SinkRows,
    expected_windows,
    key_of,
    publish_input,
    verify,
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


@pytest.mark.slow
def test_a_crash_inside_a_key_group_move_then_a_restart_loses_and_duplicates_nothing(
    nats_server, postgres, tmp_path: Path
) -> None:
    """The matrix's key-group-move cell on a short input: ``--crash-at 3:in_task`` (epoch 3
    moves two key groups), a restart, and every sink (files, PostgreSQL, NATS; raw and windowed)
    holds each sequence number once and each window with the input's count, sum, min and max."""
    stream = f"SEQ{uuid.uuid4().hex[:8].upper()}"
    setup = Setup(nats_server.url, postgres.url, stream, N)
    publish_input(setup.nats_url, stream, N)
    cell = Cell("key-group move", "SIGKILL → restart", "", point_crash(3, "in_task"))
    result = run_cell(cell, setup, Servers(nats_server, postgres),
                      tmp_path / f"fm{uuid.uuid4().hex[:8]}", None, expected_windows(N))
    assert result.status == "pass", (result.notes, [c for c in result.checks if not c.ok])
    assert len(result.checks) == 6 and all(c.rows > 0 for c in result.checks)
    assert result.recovery_s is not None and result.next_commit == 3
