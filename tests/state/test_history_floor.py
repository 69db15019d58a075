"""How far back a checkpoint keeps epochs under ``history_bytes`` (state.store.history_floor)."""

from __future__ import annotations

from pathlib import Path

from eddyline.state.store import history_floor, state_file


def _checkpoint(root: Path, epochs: int, size: int) -> list[tuple[int, dict]]:
    """Epoch e wrote a fresh snapshot of step s (file e, ``size`` bytes) that its commit reads;
    every commit also reads an old file of step t that the newest reads too."""
    (root / "state" / "s").mkdir(parents=True)
    (root / "state" / "t").mkdir(parents=True)
    (root / "state" / "t" / "0000000001-0000.arrow").write_bytes(b"x" * 10_000)
    commits = []
    for e in range(1, epochs + 1):
        Path(state_file(str(root), "s", e, 0)).write_bytes(b"x" * size)
        commits.append((e, {"s": {0: [[e, 0, "s", 0, 1]]}, "t": {0: [[1, 0, "s", 0, 1]]}}))
    return commits


def test_the_oldest_epochs_go_until_what_only_they_read_fits(tmp_path: Path) -> None:
    commits = _checkpoint(tmp_path, 6, 100)
    root = str(tmp_path)
    assert history_floor(root, commits, 1, 10_000) == 1  # files 1-5: 500 bytes (t's file the newest reads)
    assert history_floor(root, commits, 1, 450) == 2  # 2-5
    assert history_floor(root, commits, 1, 250) == 4  # 4-5
    assert history_floor(root, commits, 1, 0) == 5  # the newest two stay, whatever the cap
    assert history_floor(root, commits, 3, 10_000) == 3  # a cap never keeps more than the other bounds
    assert history_floor(root, commits[:2], 1, 0) == 1
