"""``eddyline demo`` (the README's first command) runs the demo network and starts afresh each
time: resuming an old demo's checkpoint would make the paced generator catch up on every event
since then in one epoch."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest


def _batches(out: Path) -> list[int]:
    return [json.loads(line)["batchId"] for line in (out / "progress.jsonl").read_text().splitlines()]


@pytest.fixture
def own_signal_handlers():
    """The CLI turns SIGINT / SIGTERM into "stop after this epoch"; give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_second_demo_starts_afresh(spark, tmp_path: Path, own_signal_handlers) -> None:
    from eddyline import cli

    cli.demo(duration=3, out=str(tmp_path), master=None)
    first = _batches(tmp_path)
    assert first and first[0] == 1, first
    assert list((tmp_path / "hot-auctions").glob("epoch=*")), "no output"
    stale = tmp_path / "hot-auctions" / "epoch=9999999999"
    stale.mkdir()
    (tmp_path / "notes.txt").write_text("the user's own file")

    cli.demo(duration=3, out=str(tmp_path), master=None)
    second = _batches(tmp_path)
    assert second and second[0] == 1, second  # not last + 1: nothing was resumed
    assert not stale.exists()
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"  # only the demo's paths go
